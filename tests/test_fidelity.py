"""Where users' scripts can see it, pg_task_py writes what pg_task writes: a task's `error` is
byte for byte what the server log prints for the same input (log_error_verbosity default)."""

import hashlib
import re

import pytest
from pg_task_py_testing import wait_until

# Each input fails with other fields: a position, DETAIL/HINT, several CONTEXT lines, an
# internal query with its position, lines broken inside the message and the statement.
FAILING_INPUTS = [
    "SELEC 1",
    "SELECT 1/0 AS a",
    "SELECT 1;\nSELECT nosuch\nFROM pg_class",
    "DO $$BEGIN RAISE EXCEPTION 'first\nsecond' USING DETAIL = 'one\ntwo', HINT = 'try\nthis'; END$$",
    "DO $$BEGIN PERFORM 1/0; END$$",
    "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE plpgsql AS $$BEGIN RETURN 1/0; END$$;"
    " CREATE FUNCTION pg_temp.g() RETURNS int LANGUAGE plpgsql AS $$BEGIN RETURN pg_temp.f(); END$$;"
    " SELECT pg_temp.g()",
    "DO $$BEGIN PERFORM nosuch FROM pg_class; END$$",
    "SELECT 'x'::int",
    "CREATE TABLE t (a int PRIMARY KEY); INSERT INTO t VALUES (1), (1)",
]


def logged_error(cluster, pid: int) -> str | None:
    """What the server log holds for the error of backend `pid`: its lines without the
    log_line_prefix, continuation lines (a tab first) included."""
    lines = cluster.log.read_text().splitlines()
    mine = re.compile(rf"^\S+ \S+ \S+ \[{pid}\] \S* ?(?=[A-Z]+:  )")
    for start, line in enumerate(lines):
        if mine.match(line) and "ERROR:  " in line:
            error = [mine.sub("", line)]
            for following in lines[start + 1:]:
                if following.startswith("\t"):
                    error.append(following)
                elif mine.match(following) and re.match(r"(DETAIL|HINT|QUERY|CONTEXT|STATEMENT):  ",
                                                        mine.sub("", following)):
                    error.append(mine.sub("", following))
                else:
                    break
            return "\n".join(error)
    return None


@pytest.mark.parametrize("input", FAILING_INPUTS)
def test_error_is_what_the_server_log_prints(shared, cluster, input):
    row = shared.wait_done(shared.insert(input, delete=False))
    assert row["state"] == "FAIL"
    # The same input, sent as one simple query (as psql does) by a session of our own.
    with shared.connect() as conn:
        conn.autocommit = True
        pid = conn.info.backend_pid
        conn.pgconn.exec_(input.encode())
    logged = wait_until(lambda: logged_error(cluster, pid), 10, message=f"the error of backend {pid} in the log")
    assert same_but_temp_schema(row["error"]) == same_but_temp_schema(logged)


def same_but_temp_schema(error):
    """A session's temporary schema is numbered by its backend's slot (pg_temp_7), which differs
    between the task's session and the test's own."""
    return re.sub(r"\bpg_temp_\d+\b", "pg_temp_N", error)


def test_syntax_error_names_its_position(shared):
    row = shared.wait_done(shared.insert("SELEC 1"))
    assert row["error"] == 'ERROR:  syntax error at or near "SELEC" at character 1\nSTATEMENT:  SELEC 1'


def test_a_remote_conninfo_over_the_server_s_startup_packet_says_so(shared):
    """A server reads a startup packet of 10,000 bytes at most, and closes the connection on a
    longer one: libpq said "server closed the connection unexpectedly ... terminated abnormally"."""
    info = shared.conn.info
    here = f"host={info.host} port={info.port} dbname={info.dbname} application_name="
    row = shared.wait_done(shared.insert("SELECT current_setting('application_name')", remote=here + "a" * 9800))
    assert (row["state"], row["output"]) == ("DONE", "a" * 63), row["error"]  # (the server keeps NAMEDATALEN - 1)
    failed = shared.insert("SELECT 1", remote=here + "a" * 10000, retry=2)
    row = shared.wait_done(failed)
    # (a conninfo's mistake, as one that does not parse: not retried as a network error, 08001)
    assert (row["state"], row["pid"], row["sqlstate"]) == ("FAIL", None, "22023"), row
    assert shared.value("SELECT count(*) FROM task WHERE parent = %s", [failed]) == 0
    assert row["error"].startswith("ERROR:  could not open the task's session: the conninfo's user, dbname, options"
                                   " and application_name make a startup packet of "), row["error"]
    assert "bytes, over the 10000 a PostgreSQL server reads\n" in row["error"], row["error"]


@pytest.mark.parametrize("remote", ["application_name", "host=localhost port", "postgresql://[::1"])
def test_a_malformed_remote_connects_nowhere(shared, remote):
    row = shared.wait_done(shared.insert("SELECT 1", remote=remote))
    assert row["state"] == "FAIL" and row["pid"] is None
    assert row["error"].startswith("ERROR:  PQconninfoParse failed\nDETAIL:  ")
    assert row["error"].endswith("\nSTATEMENT:  SELECT 1")
    if remote == "application_name":
        assert 'DETAIL:  missing "=" after "application_name" in connection info string' in row["error"]


def test_a_malformed_remote_keeps_its_password_out_of_the_error(shared):
    """libpq's message quotes a malformed URI whole: the error names the problem, not the URI."""
    row = shared.wait_done(shared.insert("SELECT 1", remote="postgresql://app:SuperSecret6@[::1/b"))
    assert row["state"] == "FAIL" and "SuperSecret6" not in row["error"]
    assert 'looking for matching "]" in IPv6 host address in URI: "..."' in row["error"]


@pytest.mark.parametrize("group", ["reports", "it's \\ \"quoted\""])
def test_a_task_sees_its_group_and_its_children_join_it(shared, group):
    parent = shared.insert("SELECT current_setting('pg_task.group');"
                           " INSERT INTO task (input, delete) VALUES ('SELECT 2', false)",
                           group=group, delete=False)
    row = shared.wait_done(parent)
    assert row["output"] == f"{group}\nINSERT 0 1"
    child = shared.value('SELECT id FROM task WHERE parent = %s', [parent])
    assert shared.wait_done(child)["group"] == group


# What a task sees of itself, on one line: its id, an md5 of its group, its timeout, a setting its
# group could reach if it were not escaped, and whether pg_task.oid is the task table.
ITSELF = ("SELECT current_setting('pg_task.id'), md5(current_setting('pg_task.group')),"
          " current_setting('statement_timeout'), current_setting('work_mem'),"
          " current_setting('pg_task.oid')::oid = 'task'::regclass")
# Groups the startup options of a task's session must escape (quotes, backslashes, spaces, "=",
# "-c", a tab and a newline), or cannot carry (not ASCII; too long: a group of 1000 bytes, the
# most, each one escaped): those are sent the settings.
GROUPS_TO_ESCAPE = ["plain", "it's \\ \"quoted\" = -c work_mem=64", "tab\tand\nnewline", "ünïcode ☃", "= " * 500]


def test_a_task_sees_itself_however_its_session_started(running):
    """A worker opens a session for a task it knows (a burst's, a group's next due ones) with the
    task's settings in libpq's startup options; one it started before it knew the task (the
    spare's) is sent them.  Both show the task the same settings, whatever its group."""
    def check_all():
        running.wait_all_done(60)
        for task_id, group, output in running.sql("SELECT id, \"group\", output FROM task"):
            line = output.splitlines()[-1].split("\t")
            assert line == [str(task_id), hashlib.md5(group.encode()).hexdigest(), "7s", "4MB", "t"], group
        running.sql("DELETE FROM task")

    for group in GROUPS_TO_ESCAPE:  # lone tasks, one after another
        running.wait_done(running.insert(ITSELF, group=group, timeout="7 s", delete=False))
    check_all()
    # A burst of each group's four tasks at once, and then each group's next ones.
    running.sql("INSERT INTO task (\"group\", input, timeout, delete)"
                " SELECT g, %s, '7 s', false FROM unnest(%s::text[]) AS g, generate_series(1, 4)",
                [ITSELF, GROUPS_TO_ESCAPE])
    check_all()


def test_a_task_changed_while_its_session_waits_ahead_sees_its_new_settings(running):
    """The session of a group's next task starts while the task before it runs, with the
    task's settings of that moment; a timeout the task's author changes meanwhile is the one
    the task runs with."""
    first = running.insert("SELECT pg_sleep(2)", group="ahead", delete=False)
    second = running.insert("SELECT current_setting('statement_timeout')", group="ahead", timeout="7 s",
                            delete=False)
    started = wait_until(lambda: running.value("SELECT start FROM task WHERE id = %s AND state = 'WORK'", [first]),
                         message="the first task to run")
    wait_until(lambda: running.value(  # the worker starts the second's session as soon as the first runs
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle'"
        " AND application_name = 'pg_task_py task' AND backend_start > %s", [started]),
        message="the next task's session to start ahead")
    running.sql("UPDATE task SET timeout = '9 s' WHERE id = %s", [second])
    assert running.wait_done(second)["output"] == "9s"


def test_a_task_sees_the_task_table_as_in_pg_task(shared):
    row = shared.wait_done(shared.insert(
        "SELECT current_setting('pg_task.schema'), current_setting('pg_task.table'),"
        " current_setting('pg_task.oid')::oid = 'task'::regclass", delete=False))
    assert row["output"].splitlines()[-1] == "public\ttask\tt"
