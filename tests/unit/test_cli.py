"""The launcher's command line and config file, in process: no server."""

import json
import threading
import time
from types import SimpleNamespace

import pytest
from pg_task_py import __version__
from pg_task_py.cli import load_settings, parse_args
from pg_task_py.databases import Databases
from pg_task_py.launcher import Settings, SetupError


def test_flags():
    args = parse_args(["run", "--dsn", "dbname=a", "--dsn", "dbname=b", "--run", "3", "--grace", "1.5",
                       "--log-level", "debug", "--log-json"])
    assert (args.command, args.dsn, args.run, args.grace, args.log_level, args.log_json) == \
        ("run", ["dbname=a", "dbname=b"], 3, 1.5, "DEBUG", True)
    assert load_settings(args) == [Settings("dbname=a", run=3, grace=1.5), Settings("dbname=b", run=3, grace=1.5)]


def test_defaults_are_the_libpq_environment_unlimited_and_30_s():
    args = parse_args(["run"])
    assert (args.config, args.log_level, args.log_json) == (None, "INFO", False)
    assert load_settings(args) == [Settings("", run=2147483647, grace=30.0)]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        parse_args(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"pg_task_py {__version__}\n"


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "--run", "0"], "argument --run: must be a whole number from 1 to 2147483647"),
    (["run", "--run", "two"], "argument --run: must be a whole number from 1 to 2147483647"),
    (["run", "--run", "٤"], "argument --run: must be a whole number from 1 to 2147483647"),  # (int() took it)
    # (accepted, it failed every turn, for ever: dispatch(bigint, boolean) does not exist)
    (["run", "--run", "2147483648"], "argument --run: must be a whole number from 1 to 2147483647"),
    (["run", "--grace", "-1"], "argument --grace: must be a number of seconds, 0 or more"),
    (["run", "--grace", "inf"], "argument --grace: must be a number of seconds, 0 or more"),
    (["run", "--standby", "host"], "argument --standby: must be a libpq conninfo"),
    (["run", "--log-level", "loud"], "argument --log-level: invalid choice: 'LOUD'"),
    (["run", "--config", ""], "argument --config: must name a file"),  # (read as '.': "Is a directory")
    (["run", "--metrics", "[::1:9187"], "argument --metrics: must be ADDR:PORT with an IPv6 address in brackets"),
    (["status", "--watch", "0"], "argument --watch: must be a number of seconds, at least 0.1"),
    (["status", "--watch", "-1"], "argument --watch: must be a number of seconds, at least 0.1"),
    # (accepted, the first table came and then OverflowError's traceback: a thread waits so long at most)
    (["status", "--watch", "1e10"], "argument --watch: must be a number of seconds, at least 0.1 and at most"
                                    " 31,536,000 (a year)"),
    (["status", "--watch", "abc"], "argument --watch: must be a number of seconds, at least 0.1 and at most"),
    ([], "the following arguments are required: COMMAND"),
])
def test_bad_usage_is_exit_2_with_the_reason(capsys, argv, says):
    with pytest.raises(SystemExit) as exit:
        parse_args(argv)
    assert exit.value.code == 2
    assert says in capsys.readouterr().err


def config(tmp_path, content):
    path = tmp_path / "pg_task.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_config_file_entries_follow_the_flags_and_take_them_as_defaults(tmp_path):
    path = config(tmp_path, [{"dsn": "dbname=b"}, {"dsn": "dbname=c", "run": 1, "grace": 0}])
    args = parse_args(["run", "--dsn", "dbname=a", "--run", "4", "--grace", "9", "--config", str(path)])
    assert load_settings(args) == [Settings("dbname=a", run=4, grace=9.0), Settings("dbname=b", run=4, grace=9.0),
                                   Settings("dbname=c", run=1, grace=0.0)]


@pytest.mark.parametrize(("content", "says"), [
    ('{"dsn": "not a list"}', 'expected a JSON list of objects with a "dsn"'),
    ('[{"run": 1}]', 'expected a JSON list of objects with a "dsn"'),
    ("[]", 'expected a JSON list of objects with a "dsn", one at least'),
    ("[{", "cannot read config file"),
    ('[{"dsn": "dbname=a", "dsn": "dbname=b password=secret"}]',  # (the second ran, unsaid: a probe)
     'the key "dsn" is given twice in one object'),
    ("[" * 100000 + "]" * 100000, "cannot read config file"),  # (RecursionError's traceback, exit 1)
    ([{"dsn": "dbname=a", "runs": 2}], "unknown key(s) ['runs']"),
    ([{"dsn": "dbname=a"}, {"dsn": "dbname=b password=secret", "grace": -1}],
     'entry 2: "grace" must be a number of seconds, 0 or more (got -1)'),
    ([{"dsn": "dbname=a", "run": True}], 'entry 1: "run" must be a whole number from 1 to 2147483647 (got true)'),
    ([{"dsn": "dbname=a", "run": 0}], 'entry 1: "run" must be a whole number from 1 to 2147483647 (got 0)'),
    ([{"dsn": "dbname=a", "run": 4.7}], 'entry 1: "run" must be a whole number from 1 to 2147483647 (got 4.7)'),
    ([{"dsn": "dbname=a", "run": 1e30}], 'entry 1: "run" must be a whole number from 1 to 2147483647 (got 1e+30)'),
    ([{"dsn": "dbname=a", "run": "4"}], 'entry 1: "run" must be a JSON number, not a string (got "4")'),
    ([{"dsn": "dbname=a", "grace": "1"}], 'entry 1: "grace" must be a JSON number, not a string (got "1")'),
    ([{"dsn": 5}], 'entry 1: "dsn" must be a libpq conninfo string'),
    ([{"dsn": "dbname=a", "standby": "password=secret host"}], 'entry 1: "standby" must be a libpq conninfo'),
    ([{"dsn": "dbname=a", "standby": 5}], 'entry 1: "standby" must be a libpq conninfo string'),
])
def test_bad_config_file_says_what_and_where_never_the_dsn(tmp_path, content, says):
    path = config(tmp_path, content)
    with pytest.raises(SetupError) as error:
        load_settings(parse_args(["run", "--config", str(path)]))
    assert says in str(error.value) and str(path) in str(error.value)
    assert "secret" not in str(error.value)


def test_a_config_file_that_begins_with_a_byte_order_mark_is_read(tmp_path):
    """An editor on Windows writes one first: `Unexpected UTF-8 BOM (decode using utf-8-sig)`."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"dsn": "dbname=a"}]).encode())
    assert load_settings(parse_args(["run", "--config", str(path)])) == [Settings("dbname=a")]


def test_missing_config_file(tmp_path):
    with pytest.raises(SetupError, match="cannot read config file .*nothing.json"):
        load_settings(parse_args(["run", "--config", str(tmp_path / "nothing.json")]))


def test_standby_flag_and_config_entry(tmp_path):
    path = config(tmp_path, [{"dsn": "dbname=b"}, {"dsn": "dbname=c", "standby": "host=replica2"},
                             {"dsn": "dbname=d", "standby": None}])
    args = parse_args(["run", "--dsn", "dbname=a", "--standby", "host=replica1 port=5433", "--config", str(path)])
    assert [(s.dsn, s.standby) for s in load_settings(args)] == [
        ("dbname=a", "host=replica1 port=5433"), ("dbname=b", "host=replica1 port=5433"),
        ("dbname=c", "host=replica2"), ("dbname=d", None)]
    assert parse_args(["run"]).standby is None


@pytest.mark.parametrize("standby", ["sslmode=sometimes", "port=abc"])
def test_a_standby_libpq_cannot_use_is_refused_without_dsn_too(standby):
    """With the libpq environment's database (no --dsn, no --config) it went unchecked: the
    launcher ran, and the tasks of target 'standby' ran on the primary without a word."""
    with pytest.raises(SetupError, match="--standby: the conninfo has an invalid"):
        load_settings(parse_args(["run", "--standby", standby]))
    assert [(s.dsn, s.standby) for s in load_settings(parse_args(["run", "--standby", "host=replica"]))] == [
        ("", "host=replica")]


def ended(*databases: tuple[str | None, bool]) -> Databases:
    """Databases whose schedulers have ended: (error, whether it came after the stop was asked)."""
    ending = Databases.__new__(Databases)  # (no scheduler threads: exit_status reads only `all`)
    ending.all = [SimpleNamespace(error=error, failed_stopping=stopping) for error, stopping in databases]
    return ending


@pytest.mark.parametrize(("databases", "stop_asked", "status"), [
    ([(None, False)], True, 0),
    ([("gone", False), (None, False)], True, 0),  # failed before the stop: logged then, the stop is clean
    ([("gone", False), ("lost SUPERUSER", True)], True, 1),  # failed during the stop
    ([("gone", False)], False, 1),  # ended on its own: its databases failed
    ([("gone", False), ("gone", False)], True, 1),  # all had failed: nothing was left to stop
])
def test_exit_status(databases, stop_asked, status):
    assert ended(*databases).exit_status(stop_asked) == status


def test_a_join_of_many_running_databases_waits_its_timeout_once():
    """The main loop's join waited `timeout` for each running database in turn: a SIGHUP waited
    0.2 s a database, 7 s with 40, before its reload began (a probe)."""
    release = threading.Event()
    databases = object.__new__(Databases)
    databases.metrics = None
    databases.all = [SimpleNamespace(thread=threading.Thread(target=release.wait, daemon=True), removed=False)
                     for _ in range(20)]
    for database in databases.all:
        database.thread.start()
    try:
        began = time.monotonic()
        databases.join(timeout=0.2)
        assert time.monotonic() - began < 1.5  # (20 x 0.2 s = 4 s before)
    finally:
        release.set()
