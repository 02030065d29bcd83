"""The launcher's metrics and `status` table, in process: no server."""

import argparse
import time
from datetime import timedelta

import pytest
from pg_task_py.cli import listen_address
from pg_task_py.metrics import HEALTHY_WITHIN, Metrics, serve
from pg_task_py.status import duration, render
from prometheus_client import generate_latest


@pytest.mark.parametrize(("text", "address"), [("127.0.0.1:9187", ("127.0.0.1", 9187)), (":9187", ("0.0.0.0", 9187)),
                                               ("[::1]:9187", ("::1", 9187)), ("localhost:1", ("localhost", 1))])
def test_metrics_address(text, address):
    assert listen_address(text) == address


def test_metrics_address_that_does_not_resolve_is_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="cannot listen on 999.1.1.1"):
        listen_address("999.1.1.1:9187")


@pytest.mark.parametrize("text", ["9187", "host:", "host:port", "host:0", "host:65536", "host:²", "host:١٩",
                                  "[::1:9187", "::1]:9187", "[]:9187", "[127.0.0.1]:9187", "[[::1]]:9187"])
def test_metrics_address_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="ADDR:PORT"):
        listen_address(text)


def test_metrics_from_dispatch_events():
    metrics = Metrics()
    metrics.expect("app")
    assert metrics.stale() == ["app"]  # no turn yet
    events = [{"event": "start", "id": 1}, {"event": "end", "id": 1, "state": "DONE", "seconds": 0.02},
              {"event": "end", "id": 2, "state": "FAIL", "seconds": None}, {"event": "recovered", "count": 1},
              {"event": "standby_fallback", "id": 3, "why": "unreachable", "reason": "the standby could not be used"}]
    metrics.turn("app", events, running=3)
    metrics.snapshot("app", [("alice", "mail", 4, 90.0)], [0.5, 0.25], workers=2, paused=[("alice", "mail", 30.0)],
                     due_groups=3, paused_groups=150)
    text = generate_latest(metrics.registry).decode()
    for line in ('pg_task_py_tasks_started_total{database="app"} 1.0',
                 'pg_task_py_tasks_ended_total{database="app",state="DONE"} 1.0',
                 'pg_task_py_tasks_ended_total{database="app",state="FAIL"} 1.0',
                 'pg_task_py_standby_fallbacks_total{database="app"} 1.0',
                 'pg_task_py_task_run_seconds_count{database="app"} 1.0',
                 'pg_task_py_task_start_lag_seconds_count{database="app"} 2.0',
                 'pg_task_py_running_tasks{database="app"} 3.0',
                 'pg_task_py_due_tasks{database="app",group="mail",owner="alice"} 4.0',
                 'pg_task_py_oldest_due_seconds{database="app",group="mail",owner="alice"} 90.0',
                 'pg_task_py_workers{database="app"} 2.0',
                 'pg_task_py_paused_seconds{database="app",group="mail",owner="alice"} 30.0',
                 'pg_task_py_due_groups{database="app"} 3.0', 'pg_task_py_paused_groups{database="app"} 150.0'):
        assert line in text, line
    assert metrics.stale() == []
    assert 'state="STOP"' not in text  # (never counted: a user's end)
    metrics.snapshot("app", [], [], workers=0, paused=[], due_groups=0, paused_groups=0)  # nothing due, resumed
    assert 'group="mail"' not in generate_latest(metrics.registry).decode()
    metrics.turns["app"] = time.monotonic() - HEALTHY_WITHIN - 1
    assert metrics.stale() == ["app"]


def test_a_databases_gauges_go_when_its_name_changes():
    """A failover moves the launcher to another server, and the database's name with it: the old
    name's gauges stayed at their last values for good (a late group alerted for ever)."""
    metrics = Metrics()
    metrics.turn("app@/run:5432", [{"event": "end", "id": 1, "state": "DONE", "seconds": 0.1}], running=1)
    metrics.snapshot("app@/run:5432", [("alice", "mail", 4, 900.0)], [], workers=2, paused=[("alice", "mail", 1.0)],
                     due_groups=1, paused_groups=1)
    metrics.rename("app@/run:5432", "app@/run:5433")
    text = generate_latest(metrics.registry).decode()
    for gauge in ("running_tasks", "workers", "last_turn_timestamp_seconds", "due_tasks", "oldest_due_seconds",
                  "paused_seconds"):
        assert f'pg_task_py_{gauge}{{database="app@/run:5432"' not in text, gauge
    assert 'pg_task_py_tasks_ended_total{database="app@/run:5432",state="DONE"} 1.0' in text  # (a total)
    assert metrics.stale() == []  # (its last turn goes with the name)


def test_metrics_serve_on_an_ipv6_address():
    server = serve(Metrics(), "::1", 0)
    try:
        assert server.server_address[0] == "::1"
    finally:
        server.shutdown()


def test_status_table_and_durations():
    assert [duration(timedelta(seconds=s)) for s in (1.25, 42, 245, 3 * 3600 + 120, 2 * 86400 + 4 * 3600)] == \
        ["1.2s", "42s", "4m05s", "3h02m", "2d04h"]
    assert render([]) == "no tasks\n"
    table = render([("app", "mail", 2, 10, timedelta(minutes=5), 0, 7, 1, 0, True, "ERROR:  boom")]).splitlines()
    assert table[0].split()[:4] == ["owner", "group", "running", "due"]
    assert table[2].split() == ["app", "mail", "2", "10", "5m00s", "0", "7", "1", "0", "PAUSED", "ERROR:", "boom"]


def test_status_escapes_control_characters_of_a_roles_group_and_error():
    """A role's group and error are shown to the superuser: an escape sequence in them cleared
    the screen or retitled the terminal, a newline wrote a line that read as another role's row."""
    table = render([("app", "evil\x1b[2J\nroot  fake", 0, 0, None, 0, 0, 1, 0, False,
                     "ERROR:  \x1b]0;pwned\x07")])
    assert "\x1b" not in table and "\x07" not in table
    assert table.count("\n") == 3  # the heading, its rule and one row
    assert "evil\\x1b[2J\\nroot  fake" in table
    assert "ERROR:  \\x1b]0;pwned\\x07" in table


def test_status_escapes_a_groups_right_to_left_override_and_separators():
    """A group with U+202E turned the rest of its row around in the reader's terminal, and one
    with U+2028 broke it in two there (a probe)."""
    table = render([("app", "rtl\u202eevil\u2066x\u2028y", 0, 0, None, 0, 0, 0, 0, False, None)])
    assert not any(c in table for c in "\u202e\u2066\u2028"), table
    assert "rtl\\u202eevil\\u2066x\\u2028y" in table, table


def test_a_database_the_launcher_forgets_leaves_its_gauges_and_health():
    """A reload that removes a database: its gauges go and /health stops naming it; counters stay."""
    metrics = Metrics()
    metrics.expect("gone@/run:5432")
    metrics.turn("gone@/run:5432", [{"event": "end", "id": 1, "state": "DONE", "seconds": 0.1}], running=1)
    metrics.snapshot("gone@/run:5432", [("alice", "mail", 4, 9.0)], [], workers=1, paused=[("alice", "mail", 1.0)],
                     due_groups=1, paused_groups=1)
    metrics.turns["gone@/run:5432"] = time.monotonic() - HEALTHY_WITHIN - 1
    metrics.forget("gone@/run:5432")
    text = generate_latest(metrics.registry).decode()
    assert 'pg_task_py_running_tasks{database="gone@/run:5432"}' not in text
    assert 'pg_task_py_due_tasks{database="gone@/run:5432"' not in text
    assert 'pg_task_py_tasks_ended_total{database="gone@/run:5432",state="DONE"} 1.0' in text
    assert metrics.stale() == []


def test_a_schedulers_unexpected_error_is_logged_once_and_not_restarted(monkeypatch, caplog):
    """A fault of the launcher's own in one database's thread (a TypeError, say) ends that
    database with its traceback, once: it was restarted at once, 2,659 tracebacks in 10 s."""
    from pg_task_py import databases
    from pg_task_py.launcher import Scheduler, Settings

    calls = []

    def fails(self):
        calls.append(1)
        raise TypeError("a bytes-like object is required, not 'str'")

    monkeypatch.setattr(Scheduler, "run", fails)
    every = databases.Databases([Settings(dsn="dbname=nowhere")], None)
    for _ in range(5):
        every.join(0.1)
    assert calls == [1]
    assert not every.running() and every.exit_status(stop_asked=False) == 1
    assert "stopped by an error of the launcher: TypeError" in every.all[0].error
    assert caplog.text.count("Traceback") == 1


def test_a_databases_counters_are_served_at_zero_before_their_first_event():
    """At 0 from the start, under the name it has then; a name that counted nothing goes with its
    change (the conninfo's, before the first connection, stayed a database of zeros for good)."""
    metrics = Metrics()
    metrics.expect("user=postgres dbname=app")
    text = generate_latest(metrics.registry).decode()
    assert 'pg_task_py_tasks_started_total{database="user=postgres dbname=app"} 0.0' in text
    metrics.rename("user=postgres dbname=app", "app@/run:5432")
    text = generate_latest(metrics.registry).decode()
    assert "dbname=app" not in text
    assert 'pg_task_py_reconnects_total{database="app@/run:5432"} 0.0' in text
    assert 'pg_task_py_tasks_started_total{database="app@/run:5432"} 0.0' in text
    assert 'pg_task_py_standby_fallbacks_total{database="app@/run:5432"} 0.0' in text
    assert 'pg_task_py_tasks_ended_total{database="app@/run:5432",state="FAIL"} 0.0' in text


def test_a_name_that_counted_a_reconnect_keeps_its_counters():
    metrics = Metrics()
    metrics.expect("dbname=app")
    metrics.reconnect("dbname=app")  # (the server was down: retried under the conninfo's name)
    metrics.rename("dbname=app", "app@/run:5432")
    assert 'pg_task_py_reconnects_total{database="dbname=app"} 1.0' in generate_latest(metrics.registry).decode()
