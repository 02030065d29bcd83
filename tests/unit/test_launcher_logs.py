"""The launcher's log lines and version checks, in process: no server."""

import datetime
import json
import logging
import sys

import pytest
from pg_task_py.cli import AtLevelOrAlways, JsonFormatter, TextFormatter
from pg_task_py.launcher import describe, describe_end, display_name, is_older, log_event, version_tuple


def test_end_line_carries_the_first_line_of_the_error(caplog):
    caplog.set_level(logging.INFO, logger="pg_task_py")
    log_event("app@/run:5432", {"event": "end", "id": 42, "state": "FAIL", "seconds": 0.0123,
                                "error": "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0"})
    log_event("app@/run:5432", {"event": "end", "id": 43, "state": "DONE", "seconds": 0.5})
    log_event("app@/run:5432", {"event": "end", "id": 44, "state": "FAIL", "seconds": 1, "error": None})
    assert caplog.messages == ["app@/run:5432: task 42 FAIL in 0.012s: ERROR:  division by zero",
                               "app@/run:5432: task 43 DONE in 0.500s",
                               "app@/run:5432: task 44 FAIL in 1.000s"]
    # (a failure at WARNING: --log-level WARNING shows failures without every start and DONE)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING"]
    assert caplog.records[0].fields["error"].startswith("ERROR:  division by zero")  # --log-json keeps it all


def test_end_line_says_the_sqlstate_and_whether_and_when_the_task_runs_again(caplog):
    caplog.set_level(logging.INFO, logger="pg_task_py")
    at = datetime.datetime.now().astimezone().replace(hour=12, minute=0, second=3, microsecond=250000)
    log_event("db", {"event": "end", "id": 42, "state": "FAIL", "seconds": 0.01, "sqlstate": "40001",
                     "retry": 2, "retries": 5, "retry_at": at.isoformat(), "error": "ERROR:  could not serialize"})
    log_event("db", {"event": "end", "id": 43, "state": "FAIL", "seconds": 0.01, "sqlstate": "22012",
                     "retry": None, "error": "ERROR:  division by zero"})
    # (a retry on another day says its date: a time alone read as one that had passed, a probe)
    later = (at + datetime.timedelta(days=2)).astimezone(datetime.timezone.utc)
    log_event("db", {"event": "end", "id": 44, "state": "FAIL", "seconds": 0.01, "sqlstate": "22012",
                     "retry": 1, "retries": 1, "retry_at": later.isoformat(), "error": "ERROR:  division by zero"})
    assert caplog.messages == [
        "db: task 42 FAIL in 0.010s (40001), retry 2 of 5 at 12:00:03: ERROR:  could not serialize",
        "db: task 43 FAIL in 0.010s (22012), no retry: ERROR:  division by zero",
        f"db: task 44 FAIL in 0.010s (22012), retry 1 of 1 at {later.astimezone():%Y-%m-%d} 12:00:03:"
        " ERROR:  division by zero",
    ]


def test_cancel_and_unknown_events_read_as_words_not_json(caplog):
    caplog.set_level(logging.INFO, logger="pg_task_py")
    log_event("db", {"event": "cancel", "id": 42, "cancelled": True})
    log_event("db", {"event": "cancel", "id": 43, "cancelled": False})
    log_event("db", {"event": "retry", "id": 7, "attempt": 2, "message": 'could not "connect"', "ok": None})
    log_event("db", {"event": "start", "worker": "w1"})  # a known event without its id
    assert caplog.messages == [
        "db: task 42 cancelled (grace period over)",
        "db: could not cancel task 43",
        'db: retry: id=7 attempt=2 message="could not \\"connect\\"" ok=null',
        "db: start: worker=w1",
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO", "INFO"]


@pytest.mark.parametrize(("event", "level", "text"), [
    ({"event": "start", "id": 1}, logging.INFO, "task 1 started"),
    ({"event": "start_failed", "id": 2, "message": "too many clients"}, logging.WARNING,
     "task 2 waits: no worker backend (too many clients)"),
    ({"event": "worker_error", "id": 3, "message": "server closed the connection\nCONTEXT:  ...", "failed": True},
     logging.ERROR, "task 3 FAIL: its worker failed: server closed the connection"),
    ({"event": "worker_error", "id": 3, "message": "FATAL:  terminating connection", "failed": False},
     logging.WARNING, "task 3: its worker failed (FATAL:  terminating connection); the task waits again if it"
     " had not started, else it ends FAIL once its session has ended"),
    ({"event": "postponed", "id": 4}, logging.WARNING, "task 4 waits: no free connection for its session"),
    ({"event": "postponed", "id": 4, "server_down": False}, logging.WARNING,
     "task 4 waits: no free connection for its session"),
    ({"event": "postponed", "id": 4, "server_down": True}, logging.WARNING,
     "task 4 waits: its session's server is starting up or shutting down"),
    ({"event": "claim_error", "message": "boom", "worker": "w1"}, logging.ERROR,
     "a worker could not claim its group's next task: boom"),
    ({"event": "unended", "id": 5, "message": "the DBA refuses"}, logging.ERROR,
     "could not end task 5: the DBA refuses; its worker closes, and the task ends FAIL as a lost run once that"
     " end may be written"),
    ({"event": "spare_failed", "message": "no"}, logging.ERROR, "cannot open a worker backend: no"),
    ({"event": "spare_lost", "message": "FATAL:  terminating connection due to administrator command\nserver closed"},
     logging.WARNING, "an idle worker backend failed (FATAL:  terminating connection due to administrator command);"
     " another is opened when needed"),
    ({"event": "recovered", "count": 2}, logging.WARNING, "recovered 2 task(s) of dead backends"),
    ({"event": "unclaimed", "count": 2}, logging.INFO,
     "took back 2 claimed task(s) that no worker started: they wait again"),
    ({"event": "deleted_old", "count": 5}, logging.INFO,
     "deleted 5 finished task(s) past their retention (pg_task_py.retention*, keep_runs)"),
    ({"event": "expired", "count": 1}, logging.INFO, "1 task(s) not started within active: GONE"),
    ({"event": "retention_kept", "count": 3}, logging.WARNING,
     "kept 3 finished task(s) past pg_task_py.retention or keep_runs: other tables reference them by a"
     " foreign key without ON DELETE CASCADE or SET NULL, a trigger refuses their DELETE, or a transaction holds"
     " a row it would change"),
    ({"event": "retention_blocked", "message": "violates foreign key constraint"}, logging.WARNING,
     "finished tasks past pg_task_py.retention or keep_runs are kept: violates foreign key constraint"
     " (a table references them by a foreign key without ON DELETE CASCADE or SET NULL)"),
])
def test_each_event_has_its_line_and_level(event, level, text):
    assert describe(event) == (level, text)


def test_an_event_without_its_fields_is_shown_whole(caplog):
    """An event of another version, shaped otherwise: the line shows what it holds, not a traceback."""
    caplog.set_level(logging.INFO, logger="pg_task_py")
    log_event("db", {"event": "recovered", "tasks": [1, 2]})
    assert caplog.messages == ["db: recovered: tasks=[1,2]"]


@pytest.mark.parametrize(("event", "line"), [
    ({"id": 7, "state": "DONE"}, "task 7 DONE"),
    ({"id": 7, "state": "DONE", "seconds": 2}, "task 7 DONE in 2.000s"),
    ({"id": 7, "state": "FAIL", "seconds": 0.25, "error": "\nERROR:  boom\nSTATEMENT:  x\n"},
     "task 7 FAIL in 0.250s: ERROR:  boom"),
    ({"id": 7, "state": "GONE", "error": "   "}, "task 7 GONE"),
])
def test_end_line(event, line):
    assert describe_end(event) == line


@pytest.mark.parametrize(("dsn", "shown"), [
    ("", "(libpq environment)"),
    ("host=/run/pg dbname=app password=secret", "dbname=app host=/run/pg"),
    ("postgresql://alice:secret@db.example/app", "user=alice dbname=app host=db.example"),
    # (the passphrase of a client certificate's key)
    ("host=db dbname=app sslkey=/k sslpassword=KeyPass42", "dbname=app host=db sslkey=/k"),
    # (libpq 18's: an OAuth client's secret, and the SCRAM keys that stand for a password)
    ("dbname=app oauth_client_id=id oauth_client_secret=TOPSECRET", "dbname=app oauth_client_id=id"),
    ("dbname=app scram_client_key=S2V5 scram_server_key=S2V5", "dbname=app"),
    ("host=x port", "(a conninfo that cannot be parsed)"),
    # (libpq does not read a conninfo string's dbname as a conninfo: a database of that name)
    ("dbname=postgresql://alice:SECRETPW@127.0.0.1:1/app", "dbname='(a conninfo)'"),
    ("dbname='host=db password=SECRETPW'", "dbname='(a conninfo)'"),
])
def test_display_name_never_shows_a_password(dsn, shown):
    assert display_name(dsn) == shown


@pytest.mark.parametrize(("text", "parts"), [
    ("1.3", (1, 3)), ("1.3.0", (1, 3, 0)), ("10.2", (10, 2)), ("1.3beta", None), ("", None), ("1..3", None),
    ("1.²", None), ("1.١", None),  # (digits to str.isdigit(), not to int() or not 0-9)
])
def test_version_tuple(text, parts):
    assert version_tuple(text) == parts


@pytest.mark.parametrize(("installed", "older"), [
    ("1.2", True), ("1.0", True), ("1.3", False), ("1.4", False), ("2.0", False), ("1.3beta", False), (None, False),
])
def test_version_comparison_is_numeric(installed, older):
    assert is_older(installed, "1.3.0") is older
    assert is_older("1.9", "1.10.0")  # as numbers, not text


def test_text_log_escapes_control_characters_but_not_a_traceback():
    """A task's error is its author's text: an escape sequence in it drove the log reader's terminal."""
    formatter = TextFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("pg_task_py", logging.WARNING, __file__, 1, "task 7 FAIL: %s", ("\x1b]0;pwned\x07\nx",),
                               None)
    assert formatter.format(record) == "WARNING task 7 FAIL: \\x1b]0;pwned\\x07\\nx"
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("pg_task_py", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "\nTraceback (most recent call last):\n" in formatter.format(record)


def test_the_starting_line_shows_at_every_log_level():
    """It tells a supervisor that SIGTERM now stops cleanly: --log-level WARNING hid it."""
    at_warning = AtLevelOrAlways("WARNING")
    started = logging.LogRecord("pg_task_py", logging.INFO, __file__, 1, "pg_task_py 1.3.0 starting", (), None)
    started.always = True
    done = logging.LogRecord("pg_task_py", logging.INFO, __file__, 1, "task 1 DONE", (), None)
    failed = logging.LogRecord("pg_task_py", logging.WARNING, __file__, 1, "task 2 FAIL", (), None)
    assert [at_warning.filter(r) for r in (started, done, failed)] == [True, False, True]
    assert AtLevelOrAlways("INFO").filter(done)


def test_a_task_waiting_for_a_free_connection_is_told_once_a_minute_not_at_every_try(caplog):
    """Tried once a second, a task at its role's CONNECTION LIMIT wrote "started" and "waits"
    every second for as long as the limit held."""
    from pg_task_py.connection_waits import ConnectionWaits

    caplog.set_level(logging.DEBUG, logger="pg_task_py")
    now = [100.0]
    waits = ConnectionWaits(clock=lambda: now[0])
    for _ in range(61):  # a try a second for a minute
        log_event("db", {"event": "start", "id": 7, "worker": "w"}, waits)
        log_event("db", {"event": "postponed", "id": 7}, waits)
        now[0] += 1.0
    log_event("db", {"event": "start", "id": 7, "worker": "w"}, waits)
    log_event("db", {"event": "end", "id": 7, "state": "DONE", "seconds": 0.5}, waits)
    told = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert told == [("INFO", "db: task 7 started"),
                    ("WARNING", "db: task 7 waits: no free connection for its session"),
                    ("WARNING", "db: task 7 waits: no free connection for its session (for 60s)"),
                    ("INFO", "db: task 7 DONE in 0.500s")]
    assert len(caplog.records) == 2 * 62  # (every try at DEBUG)
    # Once it has ended, or not been refused for a while (it started, went GONE), its next wait is new.
    caplog.clear()
    log_event("db", {"event": "postponed", "id": 7}, waits)
    log_event("db", {"event": "postponed", "id": 8}, waits)
    now[0] += 30.0
    log_event("db", {"event": "start", "id": 8, "worker": "w"}, waits)
    log_event("db", {"event": "postponed", "id": 8}, waits)
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO", "WARNING"]


@pytest.mark.parametrize("wait, words", [
    (None, ""),
    ((None, None), ""),
    (("IPC", "SyncRep"), "; its commit waits for a synchronous standby (IPC:SyncRep): none that"
                         " synchronous_standby_names names has confirmed it"),
    (("IO", "DataFileRead"), "; its backend waits on IO:DataFileRead"),
])
def test_a_slow_turn_no_session_blocks_says_what_its_backend_waits_on(wait, words):
    from pg_task_py.turns import waits_on
    assert waits_on(wait) == words


def test_a_lock_holder_that_waits_for_a_synchronous_standby_is_said_so():
    """The holder of the lock a turn waits for may itself wait for a synchronous standby: ending
    it, as the line suggested, would not be the cure."""
    from pg_task_py.turns import holder_waits
    assert holder_waits(("IPC", "SyncRep")) == ("; its commit waits for a synchronous standby (IPC:SyncRep): none that"
                                                " synchronous_standby_names names has confirmed it")
    assert holder_waits(("Lock", "transactionid")) == holder_waits((None, None)) == ""


def test_a_json_line_keeps_its_text_beside_the_events_message_and_its_traceback(caplog):
    """--log-json: an event's own `message` (spare_failed, start_failed, worker_error...) replaced
    the line's text, and a "please report it" line lost the traceback it asks for (a probe)."""
    caplog.set_level(logging.INFO)
    log_event("db", {"event": "spare_failed", "message": "could not establish connection: refused"})
    line = json.loads(JsonFormatter().format(caplog.records[-1]))
    assert line["message"] == "db: cannot open a worker backend: could not establish connection: refused", line
    assert line["detail"] == "could not establish connection: refused" and line["event"] == "spare_failed", line
    try:
        raise RuntimeError("injected fault")
    except RuntimeError:
        logging.getLogger("pg_task_py").exception("stopped by an error of the launcher (please report it)")
    line = json.loads(JsonFormatter().format(caplog.records[-1]))
    assert line["traceback"].startswith("Traceback (most recent call last):"), line
    assert line["traceback"].endswith("RuntimeError: injected fault"), line
