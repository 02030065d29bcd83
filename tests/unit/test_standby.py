"""The launcher's reading of a failed connection during a failover, in process: no server."""

import logging

import psycopg
import pytest
from pg_task_py.connection_waits import ToldEvery
from pg_task_py.launcher import describe, is_fatal, log_event, only_standbys

# libpq's message for a multi-host conninfo with target_session_attrs=read-write while the primary is
# down and the standby not yet promoted (as psycopg reports it).
NO_PRIMARY_YET = ('connection is bad: connection to server on socket "/run/a/.s.PGSQL.5432" failed: No such file or'
                  ' directory\n\tIs the server running locally and accepting connections on that socket?\n'
                  'connection to server on socket "/run/b/.s.PGSQL.5432" failed: session is read-only')


def test_a_standby_refused_by_target_session_attrs_is_retried_soon_and_not_fatal():
    error = psycopg.OperationalError(NO_PRIMARY_YET)
    assert only_standbys(error) and not is_fatal(error)
    assert only_standbys(psycopg.OperationalError("connection to server failed: server is in hot standby mode"))
    assert not only_standbys(psycopg.OperationalError('connection to server failed: No such file or directory'))
    # hot_standby off, a standby not consistent yet, a server starting: the server's FATAL, 57P03
    for words in ("the database system is not accepting connections\nDETAIL:  Hot standby mode is disabled.",
                  "the database system is not yet accepting connections", "the database system is starting up"):
        error = psycopg.OperationalError(f'connection to server on socket "/run/a/.s" failed: FATAL:  {words}')
        assert only_standbys(error) and not is_fatal(error), words


def test_a_conninfo_that_cannot_be_read_is_fatal_not_retried():
    """A typo in a --dsn option's value is the user's to fix: retried, it looked like an outage."""
    for dsn in ("host=/nonexistent connect_timeout=abc", "postgresql://%zz", "host=/nonexistent port=99999"):
        try:
            psycopg.connect(dsn).close()
        except psycopg.Error as exc:
            assert is_fatal(exc), (dsn, str(exc))
        else:
            raise AssertionError(f"{dsn} connected")
    assert not is_fatal(psycopg.OperationalError('connection to server failed: No such file or directory'))


@pytest.mark.parametrize("message", [
    'connection to server at "127.0.0.1", port 5432 failed: FATAL:  role "nologin" is not permitted to log in',
    'connection to server at "127.0.0.1", port 5432 failed: FATAL:  pg_hba.conf rejects connection for host'
    ' "127.0.0.1", user "alice", database "app", no encryption',
    'definition of service "nosuch" not found',
    'service file "/etc/nosuch.conf" not found',
    'connection to server at "db", port 5432 failed: SSL error: certificate verify failed',
    'connection to server at "db", port 5432 failed: server does not support SSL, but SSL was required',
])
def test_a_login_no_retry_can_fix_is_fatal(message):
    """Retried, each of these looked like an outage for ever; each needs the user to act."""
    assert is_fatal(psycopg.OperationalError(message))
    assert not is_fatal(psycopg.OperationalError(
        'connection to server at "db", port 5432 failed: FATAL:  sorry, too many clients already'))


def test_the_standby_answer_of_dispatch_has_a_line():
    assert describe({"event": "standby"})[1] == "a standby (in recovery): running nothing"


def test_standby_tasks_run_on_the_primary_are_told_once_a_minute_a_kind(caplog):
    """A standby that is down sends every task of target standby to the primary: a WARNING a
    task would bury the log; the first of a kind is told, then once a minute with a count."""
    caplog.set_level(logging.DEBUG, logger="pg_task_py")
    now = [100.0]
    fallbacks = ToldEvery(clock=lambda: now[0])

    def fell_back(task_id: int, why: str, reason: str) -> None:
        log_event("db", {"event": "standby_fallback", "id": task_id, "why": why, "reason": reason}, None, fallbacks)
        now[0] += 10.0
    for task_id in range(1, 8):  # a task every 10 s for 70 s
        fell_back(task_id, "unreachable", "the standby could not be used: connection refused")
    fell_back(8, "behind", "the standby lags 12.0 s, more than pg_task_py.standby_max_lag (10 s)")
    told = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    refused = "of target standby runs on the primary, read-only: the standby could not be used: connection refused"
    assert told == [("WARNING", f"db: task 1 {refused}"),
                    ("WARNING", f"db: task 7 {refused} (and 5 more since the last such line)"),
                    ("WARNING", "db: task 8 of target standby runs on the primary, read-only: the standby lags"
                                " 12.0 s, more than pg_task_py.standby_max_lag (10 s)")]
    assert len(caplog.records) == 8  # (the others at DEBUG)
