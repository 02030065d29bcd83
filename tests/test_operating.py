"""Operating: the view task_stats, the pg_task_py_done event, pausing groups, rate limits,
bounded history, the launcher's metrics and `pg_task_py status` (README "Operating")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from pg_task_py_testing import GATED, LAUNCHER, Launcher, free_port, insert_as, scrape, throwaway_cluster, wait_until
from prometheus_client.parser import text_string_to_metric_families

ROLES = ("ops_alice", "ops_bob")


@pytest.fixture
def authors(running):
    """Two task authors with nothing but pgtaskpy_user (README's one grant)."""
    for role in ROLES:
        running.sql(f"CREATE ROLE {role} LOGIN IN ROLE pgtaskpy_user")
    conns = {role.removeprefix("ops_"): running.connect(role) for role in ROLES}
    yield conns
    for conn in conns.values():
        conn.close()
    running.sql("DELETE FROM task")
    for role in ROLES:
        running.sql(f"ALTER ROLE {role} RESET ALL")
        running.sql(f"DROP OWNED BY {role}")
        running.sql(f"DROP ROLE {role}")


def stats(conn, group=None):
    """task_stats as the connection's role sees it: {(owner, group): row as a dict}."""
    cursor = conn.execute("SELECT * FROM task_stats")
    names = [d.name for d in cursor.description]
    rows = {(row[0], row[1]): dict(zip(names, row)) for row in cursor.fetchall()}
    return rows if group is None else rows.get(group)


def states(db, ids):
    return [db.value("SELECT state::text FROM task WHERE id = %s", [task_id]) for task_id in ids]


# --- task_stats ---------------------------------------------------------------------------------

def test_task_stats_percentiles_are_nearest_rank_of_the_runs_of_the_last_hour(db):
    """p50 and p95 are the values at ranks ceil(n / 2) and ceil(0.95 n) of the tasks that ran and
    ended in the last hour: an ended task that never started, and one that ended earlier, count in
    neither."""
    db.sql("SET session_replication_role = replica")  # finished rows written directly
    db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop)"
           " SELECT 'SELECT 1', 'pct', 'DONE', t, t + i * interval '100 ms', t + i * interval '1100 ms'"
           " FROM generate_series(1, 20) AS i, (SELECT now() - interval '30 min') AS p(t)")
    db.sql("INSERT INTO task (input, \"group\", state, plan, stop) VALUES ('SELECT 1', 'pct', 'GONE', now(), now())")
    db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop) VALUES"
           " ('SELECT 1', 'pct', 'DONE', now() - interval '2 h', now() - interval '2 h', now() - interval '61 min')")
    db.sql("SET session_replication_role = origin")
    row = stats(db.conn, ("postgres", "pct"))
    assert (row["done_1h"], row["gone_1h"]) == (20, 1)
    # run times 1 s .. 20 s, start lags 0.1 s .. 2.0 s
    assert (row["run_time_p50"], row["run_time_p95"]) == (timedelta(seconds=10), timedelta(seconds=19))
    assert (row["start_lag_p50"], row["start_lag_p95"]) == (timedelta(seconds=1), timedelta(seconds=1.9))


def test_task_stats_totals_follow_finished_rows_changed_by_hand(db):
    """A finished row moved to another group (its author may), set to wait again, or repaired to
    another end: its count moves with it.  A moved row's count stayed with its old group, and its
    DELETE there drove the new group's below zero.  (No launcher: the ends are inserted.)"""
    totals = ("SELECT \"group\", done_total, fail_total, stop_total FROM task_stats"
              " WHERE \"group\" IN ('moved from', 'moved to') ORDER BY 1")

    def rows():  # what the totals must say: the finished rows, by group and state
        return db.sql("SELECT g, count(*) FILTER (WHERE t.state = 'DONE'), count(*) FILTER (WHERE t.state = 'FAIL'),"
                      " count(*) FILTER (WHERE t.state = 'STOP')"
                      " FROM (VALUES ('moved from'), ('moved to')) AS v(g) LEFT JOIN task AS t ON t.\"group\" = v.g"
                      " GROUP BY g ORDER BY 1")

    ids = [db.value("INSERT INTO task (input, \"group\", state, plan, start, stop)"
                    " VALUES ('SELECT 1', 'moved from', %s, now(), now(), now()) RETURNING id", [state])
           for state in ("DONE", "FAIL", "DONE", "DONE")]
    db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop)"
           " VALUES ('SELECT 1', 'moved to', 'DONE', now(), now(), now())")
    steps = [
        ("UPDATE task SET \"group\" = 'moved to' WHERE id = %s", ids[1]),  # a FAIL moved
        ("UPDATE task SET state = 'STOP' WHERE id = %s", ids[0]),  # an admin's repair, DONE -> STOP
        ("UPDATE task SET state = 'DONE', \"group\" = 'moved to' WHERE id = %s", ids[0]),  # STOP -> DONE, moved
        ("UPDATE task SET state = 'PLAN', plan = now() + interval '1 day' WHERE id = %s", ids[2]),  # run again
        # An admin's end of a waiting or running task (not finish_task's): it was counted nowhere,
        # and its DELETE drove the totals below zero (a probe).
        ("UPDATE task SET state = 'DONE', stop = now() WHERE id = %s", ids[2]),
        ("UPDATE task SET state = 'WORK', start = now(), pid = 1 WHERE id = %s", ids[2]),
        ("UPDATE task SET state = 'FAIL', error = 'by hand' WHERE id = %s", ids[2]),
        ("DELETE FROM task WHERE id = %s", ids[1]),  # deleted in its new group
        ("UPDATE task SET state = 'FAIL', error = 'by hand' WHERE id = %s", ids[3]),  # DONE -> FAIL
        ("UPDATE task SET \"group\" = 'moved to' WHERE id = %s", ids[3]),  # and moved
        # (finish_task's marker spares only a change to FAIL in place: not a move)
        ("SELECT set_config('pgtaskpy.ending_task', %s::text, false)", ids[3]),
        ("UPDATE task SET \"group\" = 'moved from' WHERE id = %s", ids[3]),
    ]
    for statement, task_id in steps:
        db.sql(statement, [task_id])
        assert db.sql(totals) == rows(), statement
    db.sql("RESET pgtaskpy.ending_task")
    db.sql("SELECT pgtaskpy.fold_group_counts()")
    assert db.sql(totals) == rows() == [("moved from", 0, 2, 0), ("moved to", 2, 0, 0)]
    assert db.value("SELECT last_error FROM task_stats WHERE \"group\" = 'moved from'") == "by hand"


@pytest.mark.parametrize("order", ["ends, then a bulk", "a bulk between the ends", "a delete between",
                                   "the group's own pile", "a tie at the batch's edge"])
def test_failures_in_a_row_come_out_the_same_when_a_bulk_is_added_up_a_batch_at_a_time(db, order):
    """The housekeeping adds the counters' changes up 5,000 at a time, behind an author's bulk of
    6,000 finished rows too: a group's ends split between two batches out of the order of their
    stops counted a DONE before the FAIL stamped after it (2 failures in a row, not 1), and a
    deleted failed row's change, added up before the failure after it, ended the streak in between
    (1, not 2) (a review).  A batch takes whole groups: the same figures as one call of all."""
    def end(state, minutes_ago, group="streak"):
        return db.value("INSERT INTO task (input, \"group\", state, plan, start, stop, error)"
                        " SELECT 'SELECT 1', %s, %s, t, t, t, 'e' FROM (SELECT now() - %s * interval '1 min') AS p(t)"
                        " RETURNING id", [group, state, minutes_ago])

    def bulk():
        db.sql("INSERT INTO task (input, state, \"group\")"
               " SELECT 'x', 'STOP', 'bulk' || i FROM generate_series(1, 6000) AS i")

    if order == "a tie at the batch's edge":
        # (a group's pile of 5,001: its last FAIL and a DONE of one stop, the FAIL first in the
        # table, where a batch of 5,000 in the order of the ends cut between them: the DONE, added
        # up next, reset nothing, and the pile stayed 5,000 failures in a row, where one call said 0)
        db.sql("INSERT INTO task (input, state, \"group\", plan, start, stop, error) SELECT 'x', 'FAIL', 'streak',"
               " t, t, t, 'e' FROM (SELECT now() - interval '20 min' + i * interval '1 ms'"
               " FROM generate_series(1, 4999) AS i) AS p(t)")
        db.sql("INSERT INTO task (input, state, \"group\", plan, start, stop, error) SELECT 'x', s::state, 'streak',"
               " t, t, t, 'e' FROM (SELECT now() - interval '5 min') AS p(t), unnest('{FAIL,DONE}'::text[]) AS s")
        bulk()
        expected = 0
    elif order == "the group's own pile":
        # (more than a batch in the group itself, moved into it: added up a batch at a time, in
        # the order of the ends; whole, a move of 200,000 held every role's claims 3 s)
        db.sql("INSERT INTO task (input, state, \"group\", plan, start, stop, error) SELECT 'x', 'FAIL', 'pile',"
               " t, t, t, 'e' FROM (SELECT now() - interval '20 min' + i * interval '1 ms'"
               " FROM generate_series(1, 12000) AS i) AS p(t)")
        end("FAIL", 7)
        db.sql("UPDATE task SET \"group\" = 'streak' WHERE \"group\" = 'pile'")
        end("DONE", 8)
        bulk()
        expected = 1
    elif order == "a delete between":
        first = end("FAIL", 9)
        db.sql("SELECT pgtaskpy.fold_group_counts()")
        with db.conn.transaction():
            db.sql("DELETE FROM task WHERE id = %s", [first])
            bulk()
            end("FAIL", 8)
        expected = 2  # (a deleted end still counts while a failed row of the group is left)
    else:  # (the last failure's change first: the DONE stamped before it lies after it)
        end("FAIL", 7)
        if order == "a bulk between the ends":
            bulk()
        end("DONE", 8)
        end("FAIL", 9)
        if order == "ends, then a bulk":
            bulk()
        expected = 1
    pending = stats(db.conn, ("postgres", "streak"))["consecutive_failures"]
    calls = [db.sql("SELECT folded, more FROM pgtaskpy.fold_group_counts()")[0]]
    while calls[-1][1]:
        calls.append(db.sql("SELECT folded, more FROM pgtaskpy.fold_group_counts()")[0])
    assert len(calls) >= 2 and max(folded for folded, _ in calls) <= 5000, calls  # (a batch a turn)
    assert db.value("SELECT count(*) FROM pgtaskpy.group_count_changes") == 0
    assert pending == stats(db.conn, ("postgres", "streak"))["consecutive_failures"] == expected
    assert db.value("SELECT sum(stop) FROM pgtaskpy.group_counts") == 6000


def test_task_stats_counts_failures_in_a_row_before_and_after_the_counters_fold(db):
    """consecutive_failures: FAIL ends after the group's last DONE, by stop; GONE and STOP neither
    count nor reset it.  The same whether the ends are still changes (group_count_changes) or added
    up into group_counts (fold_group_counts, the launcher's housekeeping; no launcher here)."""
    def end(state, minutes_ago, group="streak"):
        db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop)"
               " SELECT 'SELECT 1', %s, %s, t, t, t FROM (SELECT now() - %s * interval '1 min') AS p(t)",
               [group, state, minutes_ago])

    def in_a_row(group="streak"):
        pending = stats(db.conn, ("postgres", group))["consecutive_failures"]
        db.sql("SELECT pgtaskpy.fold_group_counts()")
        assert db.value("SELECT count(*) FROM pgtaskpy.group_count_changes") == 0
        folded = stats(db.conn, ("postgres", group))["consecutive_failures"]
        assert pending == folded
        return folded

    for state, minutes_ago in (("DONE", 10), ("FAIL", 9), ("FAIL", 8)):
        end(state, minutes_ago)
    assert in_a_row() == 2
    end("FAIL", 7)
    assert in_a_row() == 3  # on top of the counters
    end("DONE", 6)
    end("FAIL", 5)
    assert in_a_row() == 1  # a newer success among the changes
    end("FAIL", 6.5)  # committed late: it failed before the last success
    end("STOP", 4)
    end("GONE", 3)
    assert in_a_row() == 1
    end("DONE", 2)
    assert in_a_row() == 0
    end("FAIL", 1)
    assert in_a_row() == 1
    end("DONE", 30)  # committed late, older than the last failure: it resets nothing
    assert in_a_row() == 1
    # Such a late DONE added up with failures older than it (moved into a group whose failure is
    # added up already): they are not after it, and count no more than it resets (a review: 3).
    end("FAIL", 10, "late")
    assert in_a_row("late") == 1
    with db.conn.transaction():
        for state, minutes_ago in (("FAIL", 13), ("FAIL", 12), ("DONE", 11)):
            end(state, minutes_ago, "late")
    assert in_a_row("late") == 1
    # A group's first failure and the delete of its row, added up together: the streak is over, as
    # when they are added up apart (a review: stored as 1, it came back with the group's next task).
    end("FAIL", 0.4, "gone")
    db.sql("DELETE FROM task WHERE \"group\" = 'gone'")
    assert in_a_row("gone") == 0
    db.sql("INSERT INTO task (input, \"group\", plan) VALUES ('SELECT 1', 'gone', now() + interval '1 day')")
    assert in_a_row("gone") == 0
    db.sql("DELETE FROM task WHERE \"group\" = 'gone'")
    # Whatever the failed rows kept (keep_runs, retention: with keep_runs 3 a series failing for
    # good showed 2, and an alert on more never fired); over once none is left in a group with no
    # task to run (a removed series): the group's next failure starts a new streak.
    for minutes_ago in (0.9, 0.8, 0.7):
        end("FAIL", minutes_ago)
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'FAIL' AND stop < now() - interval '0.75 min'")
    assert db.value("SELECT count(*) FROM task WHERE \"group\" = 'streak' AND state = 'FAIL'") == 1
    assert in_a_row() == 4
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'FAIL'")
    assert in_a_row() == 0
    # Over for good: a task of the group that waits later does not bring the old streak back.
    db.sql("INSERT INTO task (input, \"group\", plan) VALUES ('SELECT 1', 'streak', now() + interval '1 hour')")
    assert in_a_row() == 0
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'PLAN'")
    end("FAIL", 0.5)
    assert in_a_row() == 1
    # A series whose failed rows retention deletes between its runs has its next run waiting: its
    # streak goes on (it went 1, 0, 1, 0 with retention_fail shorter than the series' repeat).
    db.sql("INSERT INTO task (input, \"group\", plan) VALUES ('SELECT 1', 'streak', now() + interval '1 hour')")
    end("FAIL", 0.4)
    assert in_a_row() == 2
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'FAIL'")
    assert in_a_row() == 2
    end("FAIL", 0.3)
    assert in_a_row() == 3
    # The series removed by deleting its waiting run once its failed rows had gone: over too, and
    # the group's next task does not bring the streak back.
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'FAIL'")
    assert in_a_row() == 3
    db.sql("DELETE FROM task WHERE \"group\" = 'streak' AND state = 'PLAN'")
    assert in_a_row() == 0
    db.sql("INSERT INTO task (input, \"group\", plan) VALUES ('SELECT 1', 'streak', now() + interval '1 hour')")
    assert in_a_row() == 0
    db.sql("TRUNCATE task")
    assert in_a_row() == 0


def test_task_stats_of_a_scripted_workload(running, authors):
    alice, bob = authors["alice"], authors["bob"]
    done = [insert_as(alice, "SELECT pg_sleep(0.05)", group="work", delete=False) for _ in range(4)]
    failed = [insert_as(alice, "SELECT 1/0", group="work", delete=False) for _ in range(2)]
    later = insert_as(alice, "SELECT 1", group="work", plan="9999-01-01")
    stopped = insert_as(alice, "SELECT 1", group="work", plan="9999-01-01")
    alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [stopped])
    alice.execute("SELECT task_pause('late')")
    late = insert_as(alice, "SELECT 1", group="late", plan=running.value("SELECT now() - interval '90 s'"))
    # Waiting for a prerequisite: never due, whatever its plan.
    blocked = insert_as(alice, "SELECT 1", group="late", plan=running.value("SELECT now() - interval '900 s'"),
                        after=[later])
    bobs = insert_as(bob, "SELECT 1", group="bobs", delete=False)
    for task_id in [*done, *failed, bobs]:
        running.wait_done(task_id)

    work = stats(alice, ("ops_alice", "work"))
    assert (work["due"], work["later"], work["running"]) == (0, 1, 0)
    assert (work["done_1h"], work["fail_1h"], work["gone_1h"], work["stop_1h"]) == (4, 2, 0, 1)
    assert (work["done_total"], work["fail_total"], work["gone_total"], work["stop_total"]) == (4, 2, 0, 1)
    assert timedelta(seconds=0.04) <= work["run_time_p50"] < timedelta(seconds=5)
    assert work["run_time_p95"] >= work["run_time_p50"]
    assert timedelta(0) <= work["start_lag_p50"] <= work["start_lag_p95"] < timedelta(seconds=10)
    assert work["last_error"].startswith("ERROR:  division by zero")
    last_fail = running.value("SELECT max(stop) FROM task WHERE id = ANY(%s)", [failed])
    assert work["last_failure"] == last_fail and work["last_success"] is not None
    assert work["paused"] is False and work["oldest_due_lateness"] is None
    assert work["consecutive_failures"] == 2  # (one at a time, in id order: the two failures last)

    lagging = stats(alice, ("ops_alice", "late"))
    assert lagging["paused"] is True and (lagging["due"], lagging["later"]) == (1, 1)
    assert timedelta(seconds=90) <= lagging["oldest_due_lateness"] < timedelta(seconds=200)
    assert states(running, [late, later, blocked]) == ["PLAN", "PLAN", "PLAN"]

    # Row-level security: each role sees its own groups; an admin sees everyone's.
    assert set(stats(alice)) == {("ops_alice", "work"), ("ops_alice", "late")}
    assert set(stats(bob)) == {("ops_bob", "bobs")}
    assert {("ops_alice", "work"), ("ops_bob", "bobs")} <= set(stats(running.conn))

    # Totals are the rows in the table: deleted rows leave them, ended ones join them.
    alice.execute("DELETE FROM task WHERE id = ANY(%s)", [done[:3]])
    work = stats(alice, ("ops_alice", "work"))
    assert (work["done_total"], work["fail_total"], work["stop_total"]) == (1, 2, 1)
    running.wait_done(insert_as(alice, "SELECT 1", group="work", delete=False))
    assert stats(alice, ("ops_alice", "work"))["done_total"] == 2
    assert stats(alice, ("ops_alice", "work"))["consecutive_failures"] == 0
    running.sql("TRUNCATE task")
    assert running.value("SELECT sum(done_total + fail_total + gone_total + stop_total) FROM task_stats") == 0


# --- Events -------------------------------------------------------------------------------------

def test_listen_receives_one_event_per_ended_task(running, authors):
    listener = running.connect()
    listener.execute("LISTEN pg_task_py_done")
    quiet = running.insert("SELECT 1", delete=False)  # notify_done is off by default
    running.wait_done(quiet)
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.notify_done = on")
    read_afresh(running)
    try:
        ids = {running.insert("SELECT 1", group="ev", delete=False): "DONE",
               running.insert("SELECT 1/0", group="ev", delete=False): "FAIL",
               insert_as(authors["alice"], "SELECT 1", group="ev2", active="10 ms",
                         plan=running.value("SELECT now() - interval '1 s'")): "GONE"}
        events = []
        for notify in listener.notifies(timeout=20, stop_after=3):
            events.append(json.loads(notify.payload))
        # The quiet task's end came first: had it notified, it would be here.
        assert sorted(events, key=lambda e: e["id"]) == sorted(
            [{"id": task_id, "state": state, "group": "ev2" if state == "GONE" else "ev",
              "owner": "ops_alice" if state == "GONE" else "postgres"} for task_id, state in ids.items()],
            key=lambda e: e["id"])
        # Per role: ALTER ROLE ... SET turns it off for that role's tasks only.
        running.sql("ALTER ROLE ops_alice SET pg_task_py.notify_done = off")
        read_afresh(running)
        alices = insert_as(authors["alice"], "SELECT 1", delete=False)
        running.wait_done(alices)
        mine = running.insert("SELECT 1", delete=False)
        event = json.loads(next(iter(listener.notifies(timeout=20, stop_after=1))).payload)
        assert event["id"] == mine
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.notify_done")
        listener.close()


def test_a_task_that_ends_stop_sends_its_event_too(running, authors):
    """STOP ends come from an UPDATE, task_cancel or a failed prerequisite, not from a worker:
    an application that LISTENs for them waited for ever."""
    alice = authors["alice"]
    listener = running.connect()
    listener.execute("LISTEN pg_task_py_done")
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.notify_done = on")
    read_afresh(running)
    try:
        tomorrow = running.value("SELECT now() + interval '1 day'")
        stopped = insert_as(alice, "SELECT 1", plan=tomorrow, delete=False)
        alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [stopped])
        cancelled = insert_as(alice, "SELECT 1", plan=tomorrow, delete=False)
        alice.execute("SELECT task_cancel(%s)", [cancelled])
        failing = insert_as(alice, "SELECT 1/0", delete=False)
        dependent = alice.execute("INSERT INTO task (input, after) VALUES ('SELECT 2', %s) RETURNING id",
                                  [[failing]]).fetchone()[0]
        events = {}
        for notify in listener.notifies(timeout=20, stop_after=4):
            event = json.loads(notify.payload)
            events[event["id"]] = event["state"]
        assert events == {stopped: "STOP", cancelled: "STOP", failing: "FAIL", dependent: "STOP"}
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.notify_done")
        listener.close()


def read_afresh(db):
    """Until a session's reading of pg_task_py.notify_done is out of date: at most a second."""
    changed = db.value("SELECT clock_timestamp()")
    wait_until(lambda: db.value("SELECT clock_timestamp() - %s > interval '1.1 s'", [changed]), 5,
               message="a second since the setting changed")


# --- Pausing ------------------------------------------------------------------------------------

def started(db, ids):
    return db.value("SELECT count(*) FROM task WHERE id = ANY(%s) AND start IS NOT NULL", [ids])


def test_a_paused_group_starts_nothing_and_keeps_its_tasks(running, authors):
    alice = authors["alice"]
    assert alice.execute("SELECT task_pause('batch')").fetchone() == (True,)
    assert alice.execute("SELECT task_pause('batch')").fetchone() == (False,)  # already paused
    ids = [insert_as(alice, "SELECT clock_timestamp()", group="batch", active="1 s", delete=False)
           for _ in range(5)]
    other = insert_as(alice, "SELECT 1", group="other", delete=False)
    assert running.wait_done(other)["state"] == "DONE"  # other groups go on
    # Two housekeeping turns past `active`: still waiting, none GONE, none started.
    wait_until(lambda: running.value("SELECT now() - min(plan) > interval '2.2 s' FROM task WHERE id = ANY(%s)",
                                     [ids]), 10, message="2 s of pause")
    assert states(running, ids) == ["PLAN"] * 5 and started(running, ids) == 0
    assert stats(alice, ("ops_alice", "batch"))["paused"] is True
    assert alice.execute("SELECT task_resume('batch')").fetchone() == (True,)
    assert alice.execute("SELECT task_resume('batch')").fetchone() == (False,)
    rows = [running.wait_done(task_id) for task_id in ids]
    assert [row["state"] for row in rows] == ["DONE"] * 5
    starts = [row["start"] for row in rows]
    assert starts == sorted(starts)  # in their order (max 0: one at a time, by id)


def test_a_role_with_thousands_of_paused_groups_of_due_tasks_holds_back_no_other_roles_task(running, authors):
    """A claim that cannot fill its places from the first groups looks at every group with due
    tasks, and at each group's pause; that look was a scan of every pause (the lookup's
    parameter had the call's collation, which no index served): beside 15,000 paused groups of
    one role, each with a due task, a claim took 6 s, and another role's task waited 11 s and
    more (a probe)."""
    alice, bob = authors["alice"], authors["bob"]
    alice.execute("INSERT INTO pgtaskpy.group_pause (owner, \"group\")"
                  " SELECT current_user, 'held' || i FROM generate_series(1, 15000) AS i")
    alice.execute("INSERT INTO task (input, \"group\")"
                  " SELECT 'SELECT 1', 'held' || i FROM generate_series(1, 15000) AS i")
    try:
        for _ in range(3):
            row = running.wait_done(insert_as(bob, "SELECT 'not held'", delete=False), 5)
            assert (row["state"], row["output"]) == ("DONE", "not held"), row
        assert running.value("SELECT count(*) FROM task WHERE \"group\" LIKE 'held%%' AND state <> 'PLAN'") == 0
    finally:
        running.sql("DELETE FROM task WHERE \"group\" LIKE 'held%%'")
        running.sql("DELETE FROM pgtaskpy.group_pause WHERE \"group\" LIKE 'held%%'")



@pytest.mark.parametrize("hold", ["pause", "rate limit", "running limit"])
def test_a_roles_hold_on_a_shared_group_holds_back_no_other_roles_task_there(running, authors, hold):
    """A role's own pause, rate limit or running limit holds its tasks of a group, not another
    role's: the claim left the held tasks out after reading 64 more rows than it had places,
    and behind 65 of them every other role's task of the group waited for good (a probe: a
    role's pause of the default group held back everyone's tasks there)."""
    alice, bob = authors["alice"], authors["bob"]
    hold_sql = {"pause": "SELECT task_pause('group')",
                "rate limit": "SELECT task_limit('group', 1, '1 hour')",
                "running limit": "ALTER ROLE ops_alice SET pg_task_py.role_running_limit = 0"}[hold]
    (running.sql if hold == "running limit" else alice.execute)(hold_sql)
    try:
        if hold == "rate limit":  # its one start of the hour, taken
            assert running.wait_done(insert_as(alice, "SELECT 1", delete=False))["state"] == "DONE"
        alice.execute("INSERT INTO task (input) SELECT 'SELECT 1' FROM generate_series(1, 100)")
        for who in (bob, running.conn):
            row = running.wait_done(insert_as(who, "SELECT 'not held'", delete=False), 10)
            assert (row["state"], row["output"]) == ("DONE", "not held"), row
        assert running.value("SELECT count(*) FROM task WHERE owner = 'ops_alice' AND state = 'PLAN'") == 100
    finally:
        running.sql("DELETE FROM task WHERE owner = 'ops_alice'")

def test_a_group_resumes_when_a_tasks_active_is_at_its_bound(running, authors):
    """The paused time added to an `active` of 1000 years went past the bound, and task_resume
    failed until the task was changed by hand."""
    alice = authors["alice"]
    alice.execute("SELECT task_pause('far')")
    waiting = insert_as(alice, "SELECT 1", group="far", active="1000 years", delete=False)
    wait_until(lambda: running.value("SELECT now() - plan > interval '0.2 s' FROM task WHERE id = %s", [waiting]), 5,
               message="some time paused")
    assert alice.execute("SELECT task_resume('far')").fetchone() == (True,)
    assert running.wait_done(waiting)["state"] == "DONE"
    assert running.value("SELECT active = interval '1000 years' FROM task WHERE id = %s", [waiting])


def test_the_time_a_pause_adds_to_a_series_run_is_not_its_next_runs(running, authors):
    """task_resume adds the paused time to the waiting run's active (it never goes GONE for the
    pause); the next run took the run's active, so each pause of a series lengthened every run
    after it for good (a group paused 8 hours a night gained four months of active a year)."""
    alice = authors["alice"]
    alice.execute("SELECT task_pause('nightly')")
    run = insert_as(alice, "SELECT 1", group="nightly", repeat="1 hour", active="10 min", delete=False)
    wait_until(lambda: running.value("SELECT now() - plan > interval '1 s' FROM task WHERE id = %s", [run]),
               10, message="a second of pause")
    alice.execute("SELECT task_resume('nightly')")
    row = running.wait_done(run)
    assert row["state"] == "DONE" and row["active"] > timedelta(minutes=10, seconds=1) and row["paused"] > timedelta(0)
    assert row["active"] - row["paused"] == timedelta(minutes=10)
    after = running.sql("SELECT active, paused FROM task WHERE parent = %s AND state = 'PLAN'", [run])
    assert after == [(timedelta(minutes=10), timedelta(0))]
    with pytest.raises(psycopg.errors.CheckViolation, match="task.paused must be from 0 to less than active"):
        alice.execute("UPDATE task SET paused = active WHERE parent = %s AND state = 'PLAN'", [run])
    # (nor one that mixes signs: the series' next runs got active - paused, '-1 mons +30 days 00:10',
    # and each ended GONE without running)
    with pytest.raises(psycopg.errors.CheckViolation, match="task.paused must be from 0 to less than active"):
        alice.execute("UPDATE task SET paused = '1 mon -30 days' WHERE parent = %s AND state = 'PLAN'", [run])
    alice.execute("UPDATE task SET state = 'STOP' WHERE parent = %s AND state = 'PLAN'", [run])


def test_pause_stops_a_worker_going_on_with_its_group(running, authors):
    alice = authors["alice"]
    ids = [insert_as(alice, "SELECT pg_sleep(0.05)", group="chain", count=1000, delete=False) for _ in range(200)]
    wait_until(lambda: started(running, ids) >= 3, 20, message="the group to run")
    alice.execute("SELECT task_pause('chain')")
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id = ANY(%s) AND state IN ('TAKE', 'WORK')",
                                     [ids]) == 0, 10, message="the running task to finish")
    so_far = started(running, ids)
    assert so_far < len(ids)
    wait_until(lambda: running.value("SELECT clock_timestamp() - max(stop) > interval '1.5 s' FROM task"
                                     " WHERE id = ANY(%s)", [ids]), 10, message="1.5 s after the last end")
    assert started(running, ids) == so_far
    alice.execute("SELECT task_resume('chain')")
    wait_until(lambda: started(running, ids) > so_far, 10, message="the group to go on")
    alice.execute("DELETE FROM task WHERE state = 'PLAN'")


def test_a_pause_and_resume_as_tasks_start_fail_none(running, authors):
    """start_task read the group's pause in its UPDATE, and again in a statement of its own when
    the UPDATE took no row: a resume committed between the two read as a DBA's trigger that had
    returned NULL, and a task that never ran ended FAIL 09000, `a trigger on task made its start
    no start` (a probe pausing and resuming in a loop: 1 to 3 tasks of 300, 3 runs of 3)."""
    alice = authors["alice"]
    alice.execute("INSERT INTO task (input, \"group\", plan, \"delete\") SELECT 'SELECT 1', 'flap',"
                  " clock_timestamp() + i * interval '20 ms', false FROM generate_series(1, 300) AS i")
    flapping = True

    def flap() -> None:
        with running.connect("ops_alice") as conn:
            conn.autocommit = True
            while flapping:
                conn.execute("SELECT task_pause('flap')")
                conn.execute("SELECT task_resume('flap')")

    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE \"group\" = 'flap' AND state = 'PLAN'"
                                         " AND plan > now()") == 0, 30, message="the last task to come due")
    finally:
        flapping = False
        flapper.join()
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE \"group\" = 'flap'"
                                     " AND state IN ('PLAN', 'TAKE', 'WORK')") == 0, 30, message="every task to end")
    assert running.sql("SELECT state::text, count(*) FROM task WHERE \"group\" = 'flap' GROUP BY 1") == [
        ("DONE", 300)]


def test_pause_survives_a_launcher_restart(running, authors):
    alice = authors["alice"]
    alice.execute("SELECT task_pause('kept')")
    assert running.launchers[0].stop() == 0
    running.launchers.clear()
    launcher = running.launcher()
    task_id = insert_as(alice, "SELECT 1", group="kept", delete=False)
    marker = insert_as(alice, "SELECT 1", group="free", delete=False)
    running.wait_done(marker)
    wait_until(lambda: running.value("SELECT now() - plan > interval '1.2 s' FROM task WHERE id = %s", [task_id]),
               10, message="a housekeeping turn")
    assert states(running, [task_id]) == ["PLAN"]
    alice.execute("SELECT task_resume('kept')")
    assert running.wait_done(task_id)["state"] == "DONE"
    running.launchers.append(launcher)


def test_who_may_pause_whose_group(running, authors):
    alice, bob = authors["alice"], authors["bob"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to task_pause"):
        bob.execute("SELECT task_pause('work', 'ops_alice')")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="the group must not be NULL"):
        bob.execute("SELECT task_pause(NULL)")
    for call in ("task_pause(repeat('g', 1001))", "task_limit(repeat('g', 1001), 1)"):  # (no task's group is)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="the group must not be over 1000 bytes"):
            bob.execute(f"SELECT {call}")
    assert running.value("SELECT count(*) FROM pgtaskpy.group_pause") == 0
    assert running.value("SELECT count(*) FROM pgtaskpy.group_limit") == 0
    # A superuser (or a member of pgtaskpy_admin) pauses another owner's group; it holds only that owner's tasks.
    running.sql("SELECT task_pause('work', 'ops_alice')")
    alices = insert_as(alice, "SELECT 1", group="work", delete=False)
    bobs = insert_as(bob, "SELECT 1", group="work", delete=False)
    assert running.wait_done(bobs)["state"] == "DONE"
    assert stats(bob, ("ops_bob", "work"))["paused"] is False
    assert stats(alice, ("ops_alice", "work"))["paused"] is True
    running.sql("GRANT pgtaskpy_admin TO ops_bob")
    assert bob.execute("SELECT task_resume('work', 'ops_alice')").fetchone() == (True,)
    assert running.wait_done(alices)["state"] == "DONE"


def test_an_admin_lifts_the_pause_and_limit_of_a_dropped_role(running, authors):
    """A role dropped with its group paused and limited: an admin removes both (they said
    "role does not exist", so the rows stayed in task_stats for good); nobody sets new ones."""
    running.sql("CREATE ROLE ops_gone LOGIN IN ROLE pgtaskpy_user")
    gone = running.connect("ops_gone")
    gone.execute("SELECT task_pause('g')")
    gone.execute("SELECT task_limit('g', 1, '1 hour')")
    gone.close()
    running.sql("DROP ROLE ops_gone")
    alice = authors["alice"]
    for call in ("task_resume('g', 'ops_gone')", "task_limit('g', 0, owner => 'ops_gone')"):
        with pytest.raises(psycopg.errors.UndefinedObject, match='role "ops_gone" does not exist'):
            alice.execute(f"SELECT {call}")  # (not an admin)
    for call in ("task_pause('g', 'ops_gone')", "task_limit('g', 2, owner => 'ops_gone')"):
        with pytest.raises(psycopg.errors.UndefinedObject, match='role "ops_gone" does not exist'):
            running.sql(f"SELECT {call}")
    assert running.value("SELECT task_resume('g', 'ops_gone')") is True
    running.sql("SELECT task_limit('g', 0, owner => 'ops_gone')")
    assert running.value("SELECT count(*) FROM pgtaskpy.group_pause") == 0
    assert running.value("SELECT count(*) FROM pgtaskpy.group_limit") == 0
    assert running.value("SELECT task_resume('g', 'ops_gone')") is False


# --- Rate limits --------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_rate_limit_spreads_starts_over_time(running, authors, where):
    """Any second holds at most 5 starts, and the limit is used: the launcher's turn ends when the
    window has room again.  (It waited for its next housekeeping, up to a second later: 50 tasks
    took 12 s, not 9, and 15 s when only the launcher claims them, remote tasks.)"""
    # (A remote task of a role without SUPERUSER needs a password, which the test cluster does not check.)
    owner, info = (authors["alice"], None) if where == "local" else (running.conn, running.conn.info)
    remote = {"remote": f"host={info.host} port={info.port} dbname={info.dbname}"} if info else {}
    owner.execute("SELECT task_limit('mail', 5, '1 second')")
    ids = [insert_as(owner, "SELECT 1", group="mail", max=9, delete=False, **remote) for _ in range(50)]
    running.wait_all_done(timeout=90)
    rows = running.sql("SELECT state::text, extract(epoch FROM start)::float8 FROM task WHERE id = ANY(%s)"
                       " ORDER BY start", [ids])
    assert [state for state, _ in rows] == ["DONE"] * 50
    starts = [start for _, start in rows]
    # Any one second holds at most 5 starts: the limit counts the times in the `start` column.
    busiest = max(sum(1 for other in starts if start <= other < start + 0.999) for start in starts)
    assert busiest <= 5
    assert 9 * 0.95 <= starts[-1] - starts[0] <= 9 * 1.25  # 50 starts, 5 a second
    assert busiest == 5  # and the limit was used, not just undershot


def test_a_rate_limit_counts_starts_that_come_late_after_their_claim(running, authors):
    """A claimed task starts when its worker gets to it: late on a loaded server (160 ms after
    its claim was seen), or, here, after a DBA's slow trigger on the claim.  The limit counted
    claims, so late starts and the next window's ran together: 8 starts in 0.95 s under a limit
    of 5 a second (CI); here, 6 starts in 1.0 s under a limit of 3 in 2 seconds."""
    alice = authors["alice"]
    running.sql("CREATE FUNCTION public.slow_claim() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$")
    running.sql("CREATE TRIGGER slow_claim AFTER UPDATE OF state ON task FOR EACH ROW"
                " WHEN (OLD.state = 'PLAN' AND NEW.state = 'TAKE' AND NEW.input = 'SELECT ''late''')"
                " EXECUTE FUNCTION public.slow_claim()")
    try:
        alice.execute("SELECT task_limit('late', 3, '2 seconds')")
        ids = [insert_as(alice, input, group="late", max=9, delete=False, plan="2100-01-01")
               for input in ["SELECT 'late'"] * 3 + ["SELECT 1"] * 3]
        running.sql("UPDATE task SET plan = now() WHERE id = ANY(%s)", [ids])  # all due at once, in id order
        running.wait_all_done(timeout=30)
    finally:
        running.sql("DROP TRIGGER slow_claim ON task")
        running.sql("DROP FUNCTION public.slow_claim()")
    rows = running.sql("SELECT output, extract(epoch FROM start)::float8 FROM task WHERE id = ANY(%s)"
                       " ORDER BY start", [ids])
    assert [output for output, _ in rows] == ["late"] * 3 + ["1"] * 3
    assert rows[3][1] - rows[0][1] >= 1.999  # no 2 seconds hold the 3 late starts and a fourth


def test_a_rate_limited_group_opens_no_sessions_ahead_that_its_limit_leaves_unused(db):
    """A worker going on with a group started the sessions of its next due tasks ahead, though
    the group's rate limit let it claim none: closed as they connected, they were twice the
    group's tasks, and each left the server's log "connection to client lost" (a probe's soak:
    25 lines a minute).  A paused or limited group gets none."""
    db.sql("SELECT task_limit('limited', 2, '1 second')")
    db.launcher()

    def sessions() -> tuple[int, int]:
        with db.connect() as conn:
            return conn.execute("SELECT sessions, sessions_abandoned FROM pg_stat_database"
                                " WHERE datname = current_database()").fetchone()
    before = sessions()
    for _ in range(4):  # (5 tasks a second, the limit's 2 a second started)
        db.sql("INSERT INTO task (\"group\", input, delete) SELECT 'limited', 'SELECT 1', false"
               " FROM generate_series(1, 5)")
        time.sleep(1)
    db.wait_all_done(60)
    after = sessions()
    assert after[1] - before[1] == 0, (before, after)
    assert after[0] - before[0] <= 20 + 12, (before, after)  # (a session a task, and the scheduler's)


def test_no_session_ahead_for_another_owner_s_tasks_of_a_group_of_the_same_name(db):
    """A group's hash is of its name and remote, not its owner: a worker going on with alice's
    group g started sessions ahead, as alice, for bob's due tasks of his paused group g, which
    neither alice's sessions nor the pause would let run (a review: 33 sessions for 10 tasks)."""
    for role in ("ahead_alice", "ahead_bob"):
        db.sql(f"CREATE ROLE {role} LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect("ahead_bob") as bob:
            bob.execute("SELECT task_pause('g')")
            bob.execute("INSERT INTO task (\"group\", input) SELECT 'g', 'SELECT 1' FROM generate_series(1, 3)")
        with db.connect("ahead_alice") as alice:
            running = alice.execute("INSERT INTO task (\"group\", input, plan) VALUES ('g', 'SELECT 1', now() + '1 h')"
                                    " RETURNING id, hash").fetchone()
            alice.execute("INSERT INTO task (\"group\", input) SELECT 'g', 'SELECT 2' FROM generate_series(1, 3)")
        upcoming = db.sql("SELECT t.owner::text FROM pgtaskpy.upcoming_in_group(%s, 2, %s, 'ahead_alice', 'g') AS u"
                          " JOIN task AS t ON t.id = u.id", [running[1], running[0]])
        assert upcoming == [("ahead_alice",), ("ahead_alice",)], upcoming
        with db.connect("ahead_alice") as alice:
            alice.execute("SELECT task_pause('g')")
        assert db.sql("SELECT * FROM pgtaskpy.upcoming_in_group(%s, 2, %s, 'ahead_alice', 'g')",
                      [running[1], running[0]]) == []
    finally:
        db.sql("DELETE FROM task")
        db.sql("DELETE FROM pgtaskpy.group_pause")
        for role in ("ahead_alice", "ahead_bob"):
            db.sql(f"DROP ROLE {role}")


def test_a_rate_limit_is_set_changed_and_removed(running, authors):
    alice = authors["alice"]
    for starts, per, error in ((-1, "1 s", "starts must be from 1 to 100000"),
                               (100001, "1 s", "starts must be from 1 to 100000"),
                               (1, "0 s", "per must be an interval"), (1, "-1 s", "per must be an interval"),
                               (1, "2000 years", "per must be an interval")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=error):
            alice.execute("SELECT task_limit('g', %s, %s)", [starts, per])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to task_limit"):
        alice.execute("SELECT task_limit('g', 1, '1 s', 'ops_bob')")
    alice.execute("SELECT task_limit('slow', 1, '1 hour')")
    first, second = (insert_as(alice, "SELECT 1", group="slow", delete=False) for _ in range(2))
    assert running.wait_done(first)["state"] == "DONE"
    wait_until(lambda: running.value("SELECT now() - plan > interval '1.2 s' FROM task WHERE id = %s", [second]),
               10, message="a housekeeping turn")
    assert states(running, [second]) == ["PLAN"]
    assert running.value("SELECT count(*) FROM pgtaskpy.group_limit") == 1
    alice.execute("SELECT task_limit('slow', 0)")  # 0 (or NULL) removes the limit
    assert running.wait_done(second)["state"] == "DONE"
    assert running.value("SELECT count(*) FROM pgtaskpy.group_limit") == 0
    # A limit set again starts with an empty window: the removed one's starts went with it.
    alice.execute("SELECT task_limit('slow', 1, '1 hour')")
    assert running.wait_done(insert_as(alice, "SELECT 1", group="slow", delete=False))["state"] == "DONE"
    assert running.value("SELECT count(*) FROM pgtaskpy.limited_start") == 1
    alice.execute("DELETE FROM pgtaskpy.group_limit")  # (by hand: row-level security)
    assert running.value("SELECT count(*) FROM pgtaskpy.limited_start") == 0


def test_a_groups_rows_written_by_hand_hold_nothing_the_claims_cannot_use(running, authors):
    """An author may write the rows of its groups' pauses and limits directly (row-level
    security): their checks refuse what task_pause and task_limit refuse.  A `per` of a hundred
    million years written so failed every claim of every role ("timestamp out of range"), and
    another role's tasks waited until the author removed it; a `per` with a negative part, above
    zero and under 1000 years, failed each start of its group (a probe)."""
    alice, bob = authors["alice"], authors["bob"]
    alice.execute("SELECT task_limit('lim', 1, '1 s')")
    for change in ("per = '100000000 years'", "per = '-1 s'", "starts = 0", "starts = 1000000",
                   "per = '1000000 years -359999000 days'", "per = '1 mon -29 days'", "\"group\" = repeat('x', 1001)"):
        with pytest.raises(psycopg.errors.CheckViolation):
            alice.execute(f"UPDATE pgtaskpy.group_limit SET {change} WHERE \"group\" = 'lim'")
    with pytest.raises(psycopg.errors.CheckViolation, match="group_pause: the group must not be over 1000 bytes"):
        alice.execute("INSERT INTO pgtaskpy.group_pause (owner, \"group\") VALUES (current_user, repeat('x', 1001))")
    alice.execute("SELECT task_pause('held')")
    with pytest.raises(psycopg.errors.CheckViolation):
        alice.execute("UPDATE pgtaskpy.group_pause SET since = 'infinity' WHERE \"group\" = 'held'")
    held = insert_as(alice, "SELECT 1", group="held", delete=False)
    # A pause dated ahead by hand: the resume gives the waiting tasks no less time (it failed them:
    # "task.active must be a positive interval").
    alice.execute("UPDATE pgtaskpy.group_pause SET since = '9999-01-01' WHERE \"group\" = 'held'")
    assert alice.execute("SELECT task_resume('held')").fetchone() == (True,)
    assert running.wait_done(held)["state"] == "DONE"
    assert running.wait_done(insert_as(bob, "SELECT 'bob'", delete=False))["state"] == "DONE"
    # A limit changed counts the starts already in its window.
    alice.execute("SELECT task_limit('window', 2, '1 hour')")
    ran = [insert_as(alice, "SELECT 1", group="window", delete=False) for _ in range(2)]
    assert [running.wait_done(task_id)["state"] for task_id in ran] == ["DONE"] * 2
    alice.execute("SELECT task_limit('window', 3, '1 hour')")
    third, fourth = (insert_as(alice, "SELECT 1", group="window", delete=False) for _ in range(2))
    assert running.wait_done(third)["state"] == "DONE"
    wait_until(lambda: running.value("SELECT now() - plan > interval '1.2 s' FROM task WHERE id = %s", [fourth]),
               10, message="a housekeeping turn")
    assert states(running, [fourth]) == ["PLAN"]


def test_an_exclusive_task_of_a_paused_or_limited_group_waits_and_holds_no_other_back(running, authors):
    """task_pause and task_limit hold a group's exclusive tasks as they hold its others; one so
    held is not due, so it does not hold the other groups' tasks back either (an exclusive task
    due waits for the running ones to end, and runs alone).  A superuser inserts alice's exclusive
    tasks: she may not make one herself."""
    alice = authors["alice"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to make a task exclusive"):
        insert_as(alice, "SELECT 'exclusive'", group="maintenance", exclusive=True)
    plain = insert_as(alice, "SELECT 1", group="maintenance", plan="2100-01-01")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to make a task exclusive"):
        alice.execute("UPDATE task SET exclusive = true WHERE id = %s", [plain])
    alice.execute("DELETE FROM task WHERE id = %s", [plain])
    alice.execute("SELECT task_pause('maintenance')")
    paused = running.insert("SELECT 'exclusive'", group="maintenance", exclusive=True, delete=False,
                            owner="ops_alice")
    other = insert_as(alice, "SELECT 'other'", group="app", delete=False)
    assert running.wait_done(other)["state"] == "DONE"
    assert states(running, [paused]) == ["PLAN"]
    alice.execute("SELECT task_resume('maintenance')")
    assert running.wait_done(paused)["state"] == "DONE"
    alice.execute("SELECT task_limit('limited', 1, '1 hour')")
    limited = [running.insert("SELECT 1", group="limited", exclusive=True, delete=False, owner="ops_alice")
               for _ in range(3)]
    assert running.wait_done(limited[0])["state"] == "DONE"
    later = insert_as(alice, "SELECT 'later'", group="app", delete=False)
    assert running.wait_done(later)["state"] == "DONE"
    assert states(running, limited[1:]) == ["PLAN", "PLAN"]


def test_task_cancel_of_a_waiting_run_skips_it_and_its_series_goes_on(running, authors):
    """A waiting run of a series that task_cancel stops is skipped: the series goes on with the run
    after it, as after any run's end (it ended with the stopped run); stop_series ends it."""
    alice, bob = authors["alice"], authors["bob"]
    hourly = alice.execute("INSERT INTO task (input, repeat, plan, delete) VALUES"
                           " ('SELECT 1', '1 hour', now() + interval '1 hour', false) RETURNING id").fetchone()[0]
    nightly = alice.execute("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1')").fetchone()[0]
    # A drifting series counts from a run's stop: a skipped run's was the cancel, and the run after
    # it came before it, at the cancel's time + repeat (a probe).
    drifting = [alice.execute("INSERT INTO task (input, repeat, drift, plan, delete) VALUES"
                              " ('SELECT 1', %s, true, now() + %s::interval, false) RETURNING id",
                              [repeat, ahead]).fetchone()[0] for repeat, ahead in (("1 hour", "1 hour"),
                                                                                     ("1 day", "1 day 2 hours"))]
    for skipped, step in ((hourly, timedelta(hours=1)), (nightly, timedelta(days=1)),
                          (drifting[0], timedelta(hours=1)), (drifting[1], timedelta(days=1))):
        assert bob.execute("SELECT task_cancel(%s)", [skipped]).fetchone() == (False,)  # not bob's
        assert alice.execute("SELECT task_cancel(%s)", [skipped]).fetchone() == (True,)
        following = running.sql("SELECT n.id, n.state::text, n.plan - s.plan FROM task AS n"
                                " JOIN task AS s ON s.id = n.parent WHERE s.id = %s", [skipped])
        assert [(state, gap) for _, state, gap in following] == [("PLAN", step)], following
        assert states(running, [skipped]) == ["STOP"]
        # Called again, with the proof its public half gives it, the scheduler's half inserts no second run.
        with alice.transaction():
            alice.execute("INSERT INTO pgtaskpy.steering_proof (task_id) VALUES (%s)", [skipped])
            assert alice.execute("SELECT pgtaskpy.follow_skipped_run(%s)", [skipped]).fetchone() == (None,)
        ended = following[0][0]
        assert alice.execute("SELECT task_cancel(%s, true)", [ended]).fetchone() == (True,)
        assert running.value("SELECT count(*) FROM task WHERE parent = %s", [ended]) == 0
        # Another role cannot go on with alice's series by calling that half itself.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to go on"):
            bob.execute("SELECT pgtaskpy.follow_skipped_run(%s)", [ended])
    assert running.value("SELECT count(*) FROM task WHERE state = 'PLAN'") == 0


def test_a_task_claimed_before_its_group_was_paused_does_not_start(db):
    """A claim reads the groups' pauses before it waits for the scheduling lock, and a claimed
    task started after task_pause had returned (up to 115 ms after it, in 32 tries of 77 under a
    steady feed).  Its start looks at the pause again: it waits with its group."""
    task_id = db.insert("SELECT 'held'", group="mail", delete=False)
    with db.connect() as claimer:  # (a launcher's claim, then a worker's start of it)
        assert claimer.execute("SELECT count(*) FROM pgtaskpy.claim_due_tasks(10, pg_backend_pid())"
                               ).fetchone() == (1,)
        assert db.task(task_id)["state"] == "TAKE"
        assert db.value("SELECT task_pause('mail')") is True
        assert claimer.execute("SELECT (pgtaskpy.start_task(%s, pg_backend_pid(), pg_backend_pid())).id",
                               [task_id]).fetchone() == (None,)
    assert (db.task(task_id)["state"], db.task(task_id)["start"]) == ("PLAN", None)
    # A worker going on with its group (claim_next_task) starts a waiting task it has locked and
    # checked, claimer NULL: a pause committed in between was taken for a DBA's trigger that
    # refused the start (the launcher logged an ERROR).
    with db.connect() as worker:
        assert worker.execute("SELECT (pgtaskpy.start_task(%s, NULL, pg_backend_pid())).id",
                              [task_id]).fetchone() == (None,)
    assert (db.task(task_id)["state"], db.task(task_id)["start"]) == ("PLAN", None)
    db.launcher()
    assert db.wait_done(db.insert("SELECT 'other'", delete=False))["output"] == "other"
    assert db.task(task_id)["state"] == "PLAN"
    assert db.value("SELECT task_resume('mail')") is True
    assert db.wait_done(task_id)["output"] == "held"


def test_task_cancel_of_a_claimed_run_skips_it_and_its_series_goes_on(db):
    """A run a launcher has claimed (TAKE) and no worker started yet is stopped as a waiting one
    is: its series went on with no next run, and ended without a word (11 of 80 cancels of a new
    series' first run, under a running launcher)."""
    hourly = db.insert("SELECT 1", repeat="1 hour", plan=db.value("SELECT now() + interval '1 hour'"), delete=False)
    nightly = db.value("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1')")
    for claimed, step in ((hourly, timedelta(hours=1)), (nightly, timedelta(days=1))):
        db.sql("UPDATE task SET state = 'TAKE', worker = pg_backend_pid() WHERE id = %s", [claimed])  # (a claim)
        assert db.value("SELECT task_cancel(%s)", [claimed]) is True
        following = db.sql("SELECT n.id, n.state::text, n.plan - s.plan FROM task AS n"
                           " JOIN task AS s ON s.id = n.parent WHERE s.id = %s", [claimed])
        assert [(state, gap) for _, state, gap in following] == [("PLAN", step)], following
        assert states(db, [claimed]) == ["STOP"]
        ended = following[0][0]
        db.sql("UPDATE task SET state = 'TAKE', worker = pg_backend_pid() WHERE id = %s", [ended])
        assert db.value("SELECT task_cancel(%s, true)", [ended]) is True
        assert db.value("SELECT count(*) FROM task WHERE parent = %s", [ended]) == 0
    assert db.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE')") == 0
    assert db.value("SELECT count(*) FROM task_series") == 0


def test_another_roles_row_naming_a_run_as_parent_does_not_end_its_series(running, authors):
    """Any role may name any id as the parent of its own rows (ids are sequential; pg_task.id is
    a setting): bob's rows naming alice's waiting run are not that series' next run, and her
    skip of it goes on with the series as without them (it ended the series)."""
    alice, bob = authors["alice"], authors["bob"]
    hourly = alice.execute("INSERT INTO task (input, repeat, plan, delete) VALUES"
                           " ('SELECT 1', '1 hour', now() + interval '1 hour', false) RETURNING id").fetchone()[0]
    bob.execute("INSERT INTO task (input, parent, state) VALUES ('SELECT 1', %s, 'STOP')", [hourly])
    bob.execute("INSERT INTO task (input, parent, repeat, plan) VALUES"
                " ('SELECT 1', %s, '1 hour', now() + interval '1 hour')", [hourly])
    assert alice.execute("SELECT task_cancel(%s)", [hourly]).fetchone() == (True,)
    assert running.sql("SELECT state::text FROM task WHERE parent = %s AND owner = 'ops_alice'",
                       [hourly]) == [("PLAN",)]


@pytest.mark.parametrize(("call", "error"), [
    ("SELECT task_pause('g', 'no_such_role')", psycopg.errors.UndefinedObject),
    ("SELECT task_pause('g', '')", psycopg.errors.UndefinedObject),
    ("SELECT task_resume('g', 'no_such_role')", psycopg.errors.UndefinedObject),
    ("SELECT task_limit('g', 1, '1 s', 'no_such_role')", psycopg.errors.UndefinedObject),
    ("SELECT * FROM task_next_runs('0 0 * * *', NULL, NULL)", psycopg.errors.InvalidParameterValue),
    ("SELECT * FROM task_next_runs('0 0 * * *', NULL, 2, 'infinity')", psycopg.errors.InvalidParameterValue),
    ("SELECT task_chain(NULL)", psycopg.errors.InvalidParameterValue),
    ("INSERT INTO task (input, retry_on) VALUES ('SELECT 1', '{{40001},{40P01}}')", psycopg.errors.CheckViolation),
    ("INSERT INTO task (input, after) VALUES ('SELECT 1', '{{1},{2}}')", psycopg.errors.InvalidParameterValue),
])
def test_bad_arguments_of_the_operating_functions_get_a_clear_error(running, authors, call, error):
    """A role that does not exist, a NULL or infinite argument, an array of two dimensions: an
    error that says so, not PL/pgSQL's own (a pause of a mistyped role said it had paused)."""
    with pytest.raises(error) as raised:
        authors["alice"].execute(call)
    assert "FOR loop" not in str(raised.value) and "multidimensional" not in str(raised.value), raised.value
    assert "FOREACH" not in str(raised.value) and "convert infinity" not in str(raised.value), raised.value
    assert running.value("SELECT count(*) FROM pgtaskpy.group_pause") == 0


# --- Bounded history ----------------------------------------------------------------------------

def finished_rows(db, state, stop_ago, count, **columns):
    """Rows that ended `stop_ago` ago, written by hand (a superuser may)."""
    names = "".join(f', "{name}"' for name in columns)
    marks = "".join(", %s" for _ in columns)
    return [db.value(f"INSERT INTO task (input, state, stop, delete{names})"
                     f" VALUES ('SELECT 1', %s, now() - %s::interval - %s * interval '1 s', false{marks}) RETURNING id",
                     [state, stop_ago, i, *columns.values()]) for i in range(count)]


def present(db, ids):
    return db.value("SELECT count(*) FROM task WHERE id = ANY(%s)", [ids])


def test_retention_by_state_and_keep_runs_under_a_workload(running):
    db = running
    gone_soon = {"done": finished_rows(db, "DONE", "2 days", 5), "fail": finished_rows(db, "FAIL", "40 days", 5),
                 "gone": finished_rows(db, "GONE", "8 days", 3)}
    kept = {"done": finished_rows(db, "DONE", "1 hour", 8), "fail": finished_rows(db, "FAIL", "2 days", 5),
            "stop": finished_rows(db, "STOP", "6 days", 3)}
    nightly = finished_rows(db, "DONE", "1 minute", 8, key="nightly")  # newest first
    db.sql("CREATE SEQUENCE ticks")
    series = db.insert("SELECT nextval('ticks')", repeat="0.2 s", delete=False)
    busy = [db.insert("SELECT pg_sleep(0.01)", group="busy", delete=False) for _ in range(20)]
    for name, value in (("retention", "7 days"), ("retention_done", "1 day"), ("retention_fail", "30 days"),
                        ("keep_runs", "5")):
        db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.{name} = '{value}'")
    try:
        wait_until(lambda: all(present(db, ids) == 0 for ids in gone_soon.values()), 15,
                   message="rows past their state's retention to be deleted")
        wait_until(lambda: db.value("SELECT last_value FROM ticks") >= 9, 20, message="9 runs of the series")
        # End the series: stop its waiting run (while a run is in flight, there is none: again).
        waiting = wait_until(lambda: db.value("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'"
                                              " AND input = 'SELECT nextval(''ticks'')' RETURNING id"),
                             10, message="the series' waiting run to stop")
        runs = "SELECT array_agg(id ORDER BY id) FROM task WHERE input = 'SELECT nextval(''ticks'')'"
        wait_until(lambda: len(db.value(runs)) == 5, 15, message="the series cut to 5 runs")
        assert db.value(runs)[-1] == waiting  # the newest kept
        wait_until(lambda: present(db, nightly) == 5, 15, message="the named series cut to 5 runs")
        assert present(db, nightly[:5]) == 5  # its 5 newest
        db.wait_all_done()
        for name, ids in kept.items():
            assert present(db, ids) == len(ids), name
        assert present(db, busy) == 20 and present(db, [series]) == 0
        # Totals follow the rows (hand-written rows count too).
        totals = db.sql("SELECT sum(done_total), sum(fail_total), sum(gone_total), sum(stop_total) FROM task_stats")[0]
        assert totals == db.sql("SELECT count(*) FILTER (WHERE state = 'DONE'), count(*) FILTER (WHERE state = 'FAIL'),"
                                " count(*) FILTER (WHERE state = 'GONE'), count(*) FILTER (WHERE state = 'STOP')"
                                " FROM task")[0]
    finally:
        for name in ("retention", "retention_done", "retention_fail", "keep_runs"):
            db.sql(f"ALTER DATABASE {db.name} RESET pg_task_py.{name}")


def test_keep_runs_of_ten_or_more_digits_keeps_every_run_without_a_warning(db):
    """A whole number past integer's range was ignored as "not a whole number of runs"."""
    db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.keep_runs = '10000000000'")
    try:
        with db.connect() as conn:
            notices = []
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
            assert conn.execute("SELECT pgtaskpy.delete_surplus_runs(100)").fetchone() == (0,)
            assert notices == []
    finally:
        db.sql(f"ALTER DATABASE {db.name} RESET pg_task_py.keep_runs")


def test_bad_retention_settings_keep_rows_and_say_why(db):
    old = finished_rows(db, "DONE", "2 days", 3)
    db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.retention_done = 'soon'")
    db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.keep_runs = 'many'")
    with db.connect() as conn:
        notices = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        assert conn.execute("SELECT pgtaskpy.delete_old_tasks()").fetchone() == (0,)
        assert present(db, old) == 3
        assert any('pg_task_py.retention_done = "soon"' in n for n in notices), notices
        assert any('pg_task_py.keep_runs = "many"' in n for n in notices), notices
        # Said once per value and session: the launcher's turns, once a second, filled the server's log.
        notices.clear()
        conn.execute("SELECT pgtaskpy.delete_old_tasks()")
        assert notices == []
    # ... and in the launcher's log too, once, whatever the database's client_min_messages (error hid it).
    db.sql(f"ALTER DATABASE {db.name} SET client_min_messages = error")
    launcher = db.launcher()
    wait_until(lambda: launcher.output().count('ignoring pg_task_py.retention_done = "soon" of database') == 1,
               10, 0.1, "the launcher's log to say it")
    # Two seconds of turns (housekeeping reads the setting each second), then no second line.
    db.wait_done(db.insert("SELECT 1", plan=db.value("SELECT now() + interval '2 s'")), 15)
    assert launcher.output().count('ignoring pg_task_py.retention_done = "soon"') == 1, launcher.output()
    assert launcher.stop() == 0


def test_a_retention_without_a_unit_keeps_rows_and_says_why(db):
    """`retention_fail = 30`, meant as days, is 30 seconds to an interval: every failure older than
    half a minute went, without a word.  A number without a unit is ignored with a warning; 0 is
    0 in any unit, and a unit is read as written."""
    old = finished_rows(db, "FAIL", "2 days", 3)
    for value in ("30", " 1.5 ", "1e3", "@ 30", "1 day 30"):
        db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.retention_fail = '{value}'")
        with db.connect() as conn:
            notices: list[str] = []
            conn.add_notice_handler(lambda diag, notices=notices: notices.append(diag.message_primary))
            assert conn.execute("SELECT pgtaskpy.delete_old_tasks()").fetchone() == (0,)
            assert present(db, old) == 3
            assert any(f'pg_task_py.retention_fail = "{value}"' in n and "a number without a unit" in n
                       for n in notices), notices
    db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.retention_fail = '1 day 00:00:30'")
    with db.connect() as conn:
        assert conn.execute("SELECT pgtaskpy.delete_old_tasks()").fetchone() == (3,)
    assert present(db, old) == 0
    db.sql(f"ALTER DATABASE {db.name} RESET pg_task_py.retention_fail")


# --- The launcher's metrics ---------------------------------------------------------------------

def metric(port: int, name: str, **labels: str) -> float:
    """The sum of a metric's samples that carry these labels (0 when there are none)."""
    _, text = scrape(port, "/metrics")
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_every_start_lag_of_a_concurrent_workload_is_observed(db):
    """Ends that commit after the snapshot that reads them were missed for good: their stop is
    stamped before the commit (7-15 start lags of 200 went unobserved in ten groups)."""
    port = free_port()
    launcher = db.launcher("--metrics", f"127.0.0.1:{port}")
    db.sql("INSERT INTO task (input, \"group\", delete) SELECT 'SELECT pg_sleep(random() * 0.02)', 'g' || (i % 10),"
           " false FROM generate_series(1, 200) AS i")
    db.wait_all_done(60)
    wait_until(lambda: metric(port, "pg_task_py_task_run_seconds_count") == 200, 10, message="the ends counted")
    wait_until(lambda: metric(port, "pg_task_py_task_start_lag_seconds_count") == 200, 10,
               message=f"every start lag: {metric(port, 'pg_task_py_task_start_lag_seconds_count')}")
    assert launcher.stop() == 0, launcher.output()


def test_an_author_s_groups_by_the_thousand_are_counted_and_the_latest_labelled(db):
    """Any task author may pause groups and give tasks groups by the thousand, and each was a
    labelled series read in the scheduler's turn (50,000 pauses: a 9.6 MB scrape, 141 ms of every
    turn, every role's starts late: a probe).  The latest due groups and the groups paused longest
    are labelled, 100 of each and 10 of one owner (a role's groups a year late hid another's late
    group: a review); all are counted.  And more than 10,000 ends in one snapshot's reach are all
    observed (an admin's end of 10,500 tasks by hand: 500 start lags were lost)."""
    port = free_port()
    db.sql("CREATE ROLE metrics_author LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect("metrics_author") as author:
            author.execute("SELECT task_pause('p' || i) FROM generate_series(1, 300) AS i")
            author.execute("SELECT task_pause('bulk')")
            author.execute("INSERT INTO task (\"group\", plan, input) SELECT 'p' || i, now() - interval '10 min'"
                           " - i * interval '1 s', 'SELECT 1' FROM generate_series(1, 150) AS i")
            author.execute("INSERT INTO task (\"group\", input)"
                           " SELECT 'bulk', 'SELECT 1' FROM generate_series(1, 10500)")
        db.sql("SELECT task_pause('mine')")  # (the latest pause, its one task the least late)
        db.sql("INSERT INTO task (\"group\", input) VALUES ('mine', 'SELECT 1')")
        launcher = db.launcher("--metrics", f"127.0.0.1:{port}")
        wait_until(lambda: metric(port, "pg_task_py_paused_groups") == 302
                   and metric(port, "pg_task_py_due_groups") == 152, 10, message="the groups counted")
        _, text = scrape(port, "/metrics")
        labelled = {family.name: {(sample.labels["owner"], sample.labels["group"]) for sample in family.samples}
                    for family in text_string_to_metric_families(text)
                    if family.name in ("pg_task_py_paused_seconds", "pg_task_py_due_tasks")}
        paused = labelled["pg_task_py_paused_seconds"]
        assert len(paused) == 11 and ("postgres", "mine") in paused, paused
        assert labelled["pg_task_py_due_tasks"] == {("postgres", "mine")} | {
            ("metrics_author", f"p{i}") for i in range(141, 151)}  # (the latest: p150 most)
        db.sql("UPDATE task SET state = 'DONE', start = now(), stop = now() WHERE \"group\" = 'bulk'")
        wait_until(lambda: metric(port, "pg_task_py_task_start_lag_seconds_count") == 10500, 15,
                   message=f"every start lag: {metric(port, 'pg_task_py_task_start_lag_seconds_count')}")
        assert launcher.stop() == 0, launcher.output()
    finally:
        db.sql("DELETE FROM task")
        db.sql("DELETE FROM pgtaskpy.group_pause")
        db.sql("DROP OWNED BY metrics_author")
        db.sql("DROP ROLE metrics_author")


def test_the_pauses_of_a_renamed_or_dropped_role_are_labelled(shared):
    """The labelled pauses were read by each role of pg_roles: those of a role renamed or dropped
    since (their rows keep the old name) were counted and never labelled (a review)."""
    shared.sql("CREATE ROLE pausing_author LOGIN IN ROLE pgtaskpy_user")
    try:
        with shared.connect("pausing_author") as author:
            author.execute("SELECT task_pause('kept paused')")
        shared.sql("ALTER ROLE pausing_author RENAME TO renamed_author")
        snapshot = shared.value("SELECT pgtaskpy.metrics_snapshot(now(), 100)")
        assert ["pausing_author", "kept paused"] in [pause[:2] for pause in snapshot["paused"]], snapshot["paused"]
    finally:
        shared.sql("DELETE FROM pgtaskpy.group_pause WHERE owner = 'pausing_author'")
        shared.sql("DROP ROLE renamed_author")


def test_one_database_given_twice_gets_one_scheduler_and_a_reload_hands_it_on(cluster, db, tmp_path):
    """Keywords and a URI of one database: the second scheduler to connect stops, saying so, and
    the first schedules on, /health 200.  Two of one name ran, and their metrics overwrote each
    other (pg_task_py_running_tasks read 0 in most scrapes while 10 tasks ran: a probe).  A reload
    that removes the first, or that changes the conninfo, hands the database on (a review: the
    new scheduler was refused while the old one stopped, and the launcher exited 1)."""
    uri = f"postgresql:///{db.name}?" + urllib.parse.urlencode({"host": cluster.socket_dir, "port": cluster.port,
                                                                 "user": "postgres"})
    config = tmp_path / "pg_task.json"
    config.write_text(json.dumps([{"dsn": db.dsn}]))
    port = free_port()
    launcher = Launcher(args=("--config", str(config), "--metrics", f"127.0.0.1:{port}"), log_dir=tmp_path).start()
    try:
        launcher.wait_active()
        config.write_text(json.dumps([{"dsn": db.dsn}, {"dsn": uri}]))  # (added second: it connects second)
        launcher.signal(signal.SIGHUP)
        said = wait_until(lambda: re.search(r"(\S+): scheduled already by another conninfo of this launcher \(([^)]*)\)"
                                            r": one scheduler a database", launcher.output()), 15,
                          message="the second scheduler to stop")
        assert said[1] == f"{db.name}@{cluster.socket_dir}:{cluster.port}", said[0]
        assert db.wait_done(db.insert("SELECT 'once'", delete=False))["output"] == "once"
        assert launcher.output().count("scheduling (active)") == 1, launcher.output()
        wait_until(lambda: scrape(port, "/health")[0] == 200, 10, message="/health 200 (the refused one not in it)")
        for entries in ([{"dsn": uri}], [{"dsn": uri + "&connect_timeout=10"}]):  # the first gone; a new conninfo
            active = launcher.output().count("scheduling (active)")
            config.write_text(json.dumps(entries))
            launcher.signal(signal.SIGHUP)
            try:
                wait_until(lambda n=active: launcher.output().count("scheduling (active)") > n, 15, 0.05,
                           f"the database scheduled by {entries}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{launcher.output()[-3000:]}") from None
            assert db.wait_done(db.insert("SELECT 'on'", delete=False))["output"] == "on"
            assert launcher.process.poll() is None, launcher.output()
        wait_until(lambda: scrape(port, "/health")[0] == 200, 10, message="/health 200")
        assert launcher.stop() == 0, launcher.output()
    finally:
        launcher.stop()


def test_a_database_handed_on_is_not_taken_back_by_its_old_conninfo(cluster, db, tmp_path):
    """A reload hands the database on to its URI while the old conninfo's scheduler stops (a task
    of its runs on); a reload that names both again took the old one back, and two schedulers of
    the database ran for good (a review).  It stops on; the URI's schedules.  Named alone again,
    it is taken back, and the URI's stops."""
    uri = f"postgresql:///{db.name}?" + urllib.parse.urlencode({"host": cluster.socket_dir, "port": cluster.port,
                                                                 "user": "postgres"})
    config = tmp_path / "pg_task.json"
    config.write_text(json.dumps([{"dsn": db.dsn}]))
    gatekeeper = db.close_gate()
    launcher = Launcher(args=("--config", str(config)), log_dir=tmp_path).start()
    try:
        launcher.wait_active()
        long_task = db.insert(GATED, group="long", delete=False)
        wait_until(lambda: db.task(long_task)["state"] == "WORK", 10, 0.02, "the long task to run")
        config.write_text(json.dumps([{"dsn": uri}]))
        launcher.signal(signal.SIGHUP)
        wait_until(lambda: launcher.output().count("scheduling (active)") == 2, 15, 0.05, "the URI's scheduler")
        config.write_text(json.dumps([{"dsn": db.dsn}, {"dsn": uri}]))
        launcher.signal(signal.SIGHUP)
        wait_until(lambda: "scheduled by another conninfo of this launcher now: stopping on" in launcher.output(),
                   15, 0.05, "the old conninfo's scheduler to stop on")
        # Named alone again, while it stops: the URI's stops, and it is taken back (refused then,
        # none scheduled the database, and the launcher exited: a review).
        config.write_text(json.dumps([{"dsn": db.dsn}]))
        launcher.signal(signal.SIGHUP)
        wait_until(lambda: "back in the configuration before it stopped: scheduling on" in launcher.output(),
                   15, 0.05, "the old conninfo's scheduler taken back")
        gatekeeper.execute("COMMIT")
        assert db.wait_done(long_task)["output"] == "long"
        wait_until(lambda: re.search(r": stopped\n", launcher.output()), 15, 0.05, "the URI's scheduler to stop")
        # (a stopping scheduler's session drops the launcher's name; taken back, its next turn has it again)
        wait_until(lambda: "scheduling again" in launcher.output(), 15, 0.05, "the old one to schedule again")
        wait_until(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                    " AND application_name = 'pg_task_py launcher'") == 1, 15, 0.05,
                   "one scheduler of the database")
        assert db.wait_done(db.insert("SELECT 'on'", delete=False))["output"] == "on"
        assert launcher.process.poll() is None, launcher.output()
    finally:
        gatekeeper.close()
        launcher.stop()


def test_a_database_given_up_on_exports_no_figures_and_health_names_it():
    """A database dropped under the launcher: its scheduler ends with an error, and its gauges
    stayed at their last values for good (3 tasks running in a database that was gone)."""
    port = free_port()
    with throwaway_cluster() as cluster:
        cluster.create_database("kept")
        cluster.create_database("dropped")
        launcher = Launcher(cluster.dsn("kept"), cluster.dsn("dropped"), args=("--metrics", f"127.0.0.1:{port}"))
        launcher.start()
        try:
            launcher.wait_active()
            with cluster.connect("dropped") as conn:
                conn.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT pg_sleep(60)', 'g' || i"
                             " FROM generate_series(1, 3) AS i")
            wait_until(lambda: metric(port, "pg_task_py_running_tasks", database=dropped_label(port)) == 3, 20,
                       message="3 tasks running")
            label = dropped_label(port)
            with cluster.connect() as conn:
                def dropped() -> bool:  # (a session that connects as FORCE ends the others fails it)
                    try:
                        conn.execute("DROP DATABASE dropped WITH (FORCE)")
                    except psycopg.errors.ObjectInUse:
                        return False
                    return True
                wait_until(dropped, 20, 0.1, "the database dropped")
            wait_until(lambda: 'does not exist' in launcher.output(), 20, 0.05, "the database given up on")
            wait_until(lambda: f'pg_task_py_running_tasks{{database="{label}"}}' not in scrape(port, "/metrics")[1],
                       10, message="its gauges gone")
            text = scrape(port, "/metrics")[1]
            assert f'pg_task_py_workers{{database="{label}"}}' not in text, text
            assert 'pg_task_py_running_tasks{database="kept@' in text, text
            wait_until(lambda: scrape(port, "/health")[0] == 503, 10, message="/health naming it")
            assert label in scrape(port, "/health")[1]
            # A reload tries it again, and says so (it said "added", though it was there all along).
            launcher.signal(signal.SIGHUP)
            wait_until(lambda: "started again by the reload" in launcher.output(), 10, 0.05, "the reload's line")
            assert "added by the reload" not in launcher.output()
        finally:
            launcher.kill()


def dropped_label(port: int) -> str | None:
    """The `database` label of the database named dropped, once the launcher has connected to it."""
    _, text = scrape(port, "/metrics")
    return next((sample.labels["database"] for family in text_string_to_metric_families(text)
                 for sample in family.samples if sample.labels.get("database", "").startswith("dropped@")), None)

def test_metrics_rise_with_the_workload_and_health_follows_the_server():
    port = free_port()
    with throwaway_cluster() as cluster:
        cluster.create_database("metered")
        launcher = Launcher(cluster.dsn("metered"), args=("--metrics", f"127.0.0.1:{port}")).start()
        try:
            launcher.wait_active()
            wait_until(lambda: scrape(port, "/health")[0] == 200, 10, message="/health 200")
            assert scrape(port, "/nothing")[0] == 404
            # (a probe's query string or trailing slash, and HEAD, were 404 and 501)
            assert scrape(port, "/health/")[0] == scrape(port, "/health?probe=1")[0] == 200
            head = urllib.request.Request(f"http://127.0.0.1:{port}/health", method="HEAD")
            with urllib.request.urlopen(head, timeout=5) as answer:
                assert (answer.status, answer.read()) == (200, b"")
            with cluster.connect("metered") as conn:
                conn.execute("SELECT task_pause('held')")
                conn.execute("INSERT INTO task (\"group\", plan, input)"
                             " VALUES ('held', now() - interval '1 min', 'SELECT 1')")
                conn.execute("INSERT INTO task (input, delete) SELECT 'SELECT 1', false FROM generate_series(1, 20)")
                conn.execute("INSERT INTO task (input, delete) SELECT 'SELECT 1/0', false FROM generate_series(1, 5)")
                conn.execute("INSERT INTO task (plan, active, input)"
                             " VALUES (now() - interval '2 h', '1 h', 'SELECT 1')")  # (ends GONE)
                # (ends FAIL before it starts: its owner's running limit is no number)
                conn.execute("CREATE ROLE misset IN ROLE pgtaskpy_user")
                conn.execute("ALTER ROLE misset SET pg_task_py.role_running_limit = 'abc'")
                conn.execute("SET ROLE misset")
                conn.execute("INSERT INTO task (input, delete) VALUES ('SELECT 1', false)")
                conn.execute("RESET ROLE")
            wait_until(lambda: metric(port, "pg_task_py_tasks_ended_total", state="DONE") == 20
                       and metric(port, "pg_task_py_tasks_ended_total", state="FAIL") == 6
                       and metric(port, "pg_task_py_tasks_ended_total", state="GONE") == 1, 30,
                       message=f"the ends counted: {scrape(port, '/metrics')[1]}")
            assert metric(port, "pg_task_py_tasks_started_total") == 25
            assert metric(port, "pg_task_py_task_run_seconds_count") == 25
            wait_until(lambda: metric(port, "pg_task_py_task_start_lag_seconds_count") == 25, 10,
                       message="the start lags observed")
            assert metric(port, "pg_task_py_due_tasks", group="held", owner="postgres") == 1
            assert 60 <= metric(port, "pg_task_py_oldest_due_seconds", group="held") < 120
            assert metric(port, "pg_task_py_workers") >= 1
            assert 'pg_task_py_paused_seconds{database="metered@' in scrape(port, "/metrics")[1]
            with cluster.connect("metered") as conn:  # a pause written by hand, since a time to come
                conn.execute("INSERT INTO pgtaskpy.group_pause VALUES ('postgres', 'later', now() + interval '1 h')")
            wait_until(lambda: 'group="later"' in scrape(port, "/metrics")[1], 10, message="the hand-written pause")
            assert metric(port, "pg_task_py_paused_seconds", group="later") == 0
            assert 0 < metric(port, "pg_task_py_paused_seconds", group="held", owner="postgres") < 60
            with cluster.connect("metered") as conn:
                conn.execute("SELECT task_resume('held')")
            wait_until(lambda: not any(line.startswith("pg_task_py_paused_seconds") and 'group="held"' in line
                                       for line in scrape(port, "/metrics")[1].splitlines()), 10,
                       message="the paused gauge gone once the group is resumed")
            assert abs(metric(port, "pg_task_py_last_turn_timestamp_seconds") - time.time()) < 5
            cluster.stop()
            wait_until(lambda: scrape(port, "/health")[0] == 503, 20, message="/health 503 with the server down")
            assert "no turn within" in scrape(port, "/health")[1]
            wait_until(lambda: metric(port, "pg_task_py_reconnects_total") >= 1, 20, message="a reconnect counted")
            cluster.start()
            wait_until(lambda: scrape(port, "/health")[0] == 200, 30, message="/health 200 again")
        finally:
            assert launcher.stop() == 0, launcher.output()


def test_metrics_flag_is_checked():
    for bad in ("9187", "host:", "host:port", "host:70000"):
        result = subprocess.run([str(LAUNCHER), "run", "--metrics", bad], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and "--metrics: must be ADDR:PORT" in result.stderr, result.stderr
    # An address that does not resolve: exit 2 too (it was 1, from the launcher's start).
    result = subprocess.run([str(LAUNCHER), "run", "--metrics", "999.1.1.1:9187"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "--metrics: cannot listen on 999.1.1.1" in result.stderr, result.stderr


# --- pg_task_py status --------------------------------------------------------------------------

def test_status_prints_the_groups_at_a_glance(running, authors):
    alice = authors["alice"]
    alice.execute("SELECT task_pause('held')")
    insert_as(alice, "SELECT 1", group="held", plan=running.value("SELECT now() - interval '5 min'"))
    running.wait_done(insert_as(alice, "SELECT 1/0", group="broken", delete=False))
    # (a paused group with nothing due came before a late one that a rate limit holds: a probe)
    alice.execute("SELECT task_pause('idle')")
    insert_as(alice, "SELECT 1", group="idle", plan="9999-01-01")
    alice.execute("SELECT task_limit('limited', 1, '1 hour')")
    running.wait_done(insert_as(alice, "SELECT 1", group="limited"))
    insert_as(alice, "SELECT 1", group="limited", plan=running.value("SELECT now() - interval '10 min'"))
    alice_dsn = running.cluster.dsn(running.name, "ops_alice")
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", alice_dsn], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    header, rule, *lines = result.stdout.splitlines()
    assert header.split() == ["owner", "group", "running", "due", "late", "later", "done", "1h", "fail", "1h",
                              "gone", "1h", "paused", "last", "error"]
    assert set(rule) == {"-", " "}
    assert [line.split()[1] for line in lines] == ["limited", "held", "idle", "broken"], lines  # only alice's
    held = lines[1].split()
    assert held[:4] + held[5:] == ["ops_alice", "held", "0", "1", "0", "0", "0", "0", "PAUSED"]
    assert held[4] in {f"5m{second:02d}s" for second in range(20)}  # late by 5 minutes and the test's time
    assert lines[2].split()[:4] + lines[2].split()[-1:] == ["ops_alice", "idle", "0", "0", "PAUSED"]
    assert lines[3].split()[:9] == ["ops_alice", "broken", "0", "0", "0", "0", "1", "0", "ERROR:"]  # (no lateness)
    assert lines[3].endswith("ERROR:  division by zero")


def test_status_watch_refreshes_until_interrupted(running):
    running.insert("SELECT 1", plan="9999-01-01")
    watcher = subprocess.Popen([str(LAUNCHER), "status", "--dsn", running.dsn, "--watch", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        screens = []
        wait_until(lambda: screens.append(watcher.stdout.readline()) or sum("owner" in s for s in screens) >= 3,
                   20, interval=0, message="three refreshes")
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 0, watcher.stderr.read()
    assert "\033[2J" not in "".join(screens)  # (a pipe gets the tables one after another; a terminal is cleared)


def test_status_watch_goes_on_after_its_connection_is_lost(running):
    """A server restart under `status --watch` ended it, exit 1, `terminating connection due to
    administrator command`: it says the connection was lost and shows the table again."""
    running.insert("SELECT 1", plan="9999-01-01")
    watcher = subprocess.Popen([str(LAUNCHER), "status", "--dsn", running.dsn, "--watch", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        wait_until(lambda: lines.append(watcher.stdout.readline()) or any("owner" in line for line in lines), 20,
                   interval=0, message="the first table")
        assert running.value("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                             " WHERE application_name = 'pg_task_py status'") == 1
        wait_until(lambda: lines.append(watcher.stdout.readline()) or any("connection lost" in line for line in lines),
                   20, interval=0, message="the lost connection told")
        lost = len(lines)
        wait_until(lambda: lines.append(watcher.stdout.readline()) or any("owner" in line for line in lines[lost:]),
                   20, interval=0, message="a table after the lost connection")
        assert watcher.poll() is None
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 0, watcher.stderr.read()
    assert [line for line in lines if "connection lost" in line][0].startswith(
        "connection lost: terminating connection due to administrator command; trying again in 0.2s"), lines


def test_status_watch_into_a_pipe_that_closes_ends_quietly(running):
    """`status --watch | head -1`: the reader goes, and status ends with 0 and no traceback."""
    watcher = subprocess.Popen([str(LAUNCHER), "status", "--dsn", running.dsn, "--watch", "0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher.stdout.readline()
    watcher.stdout.close()
    assert watcher.wait(20) == 0
    assert watcher.stderr.read() == ""


def test_status_stops_on_a_signal_while_it_waits_for_a_lock(running):
    """`status` while `VACUUM FULL task` (or an extension update) holds the table: SIGINT and
    SIGTERM only set a flag read between tables, and it waited on until SIGKILL.  It cancels its
    query and ends, saying that it was stopped."""
    with running.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE task IN ACCESS EXCLUSIVE MODE")
        for signum in (signal.SIGINT, signal.SIGTERM):
            status = subprocess.Popen([str(LAUNCHER), "status", "--dsn", running.dsn],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                                                 " 'pg_task_py status' AND wait_event_type = 'Lock'") == 1,
                           20, message="status waiting for the lock")
                status.send_signal(signum)
                assert status.wait(10) == 1
            finally:
                status.kill()
            stderr = status.stderr.read()
            name = signal.Signals(signum).name
            assert stderr == f"pg_task_py status: stopped by {name} before the table was read\n", stderr
            # (its query was cancelled, not left waiting for the lock)
            wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity"
                                             " WHERE application_name = 'pg_task_py status'") == 0,
                       10, message="the status session gone")
        holder.execute("ROLLBACK")


def test_status_watch_stopped_by_two_signals_at_once_ends_quietly(running):
    """Two SIGINTs in a row (a key held down): the second raised inside the first's unwinding, and
    `status --watch` hung until SIGKILL (7 runs of 40) or printed a traceback; SIGINT then SIGTERM,
    a traceback of CPython's for a signal pending as it was ignored (reviews)."""
    for second in (signal.SIGINT, signal.SIGTERM) * 10:
        watcher = subprocess.Popen([str(LAUNCHER), "status", "--dsn", running.dsn, "--watch", "5"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            watcher.stdout.readline()  # (the first table is under way)
            watcher.send_signal(signal.SIGINT)
            watcher.send_signal(second)
            code = watcher.wait(10)
        finally:
            watcher.kill()
        assert (code, watcher.stderr.read()) == (0, "")


def test_status_under_a_held_down_ctrl_c_exits_1_with_one_line(tmp_path):
    """SIGINT every 33 ms from its start (a key held down) against a server it cannot reach: the
    system's default at the interpreter's exit killed it (-2), or a signal during its error line
    raised a traceback (reviews).  One line, exit 1, every time."""
    for _ in range(10):
        status = subprocess.Popen([str(LAUNCHER), "status", "--dsn", f"host={tmp_path} port=1 dbname=x"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # (from its handlers' first moment, SIGTERM's caught: before, Python's own start meets it)
            wait_until(lambda status=status: status.poll() is not None or int(re.search(
                r"^SigCgt:\s*([0-9a-f]+)$", Path(f"/proc/{status.pid}/status").read_text(), re.MULTILINE).group(1),
                16) & (1 << (signal.SIGTERM - 1)), 10, 0.001, "status to catch its stop signals")
            while status.poll() is None:
                status.send_signal(signal.SIGINT)
                time.sleep(0.033)
            code = status.wait(10)
        finally:
            status.kill()
        stderr = status.stderr.read()
        assert code == 1 and stderr.startswith("pg_task_py status: ") and stderr.count("\n") == 1, (code, stderr)


def test_status_says_why_it_cannot_write(running):
    """A full disk, a closed stdout or a locale that cannot write a role's group: tracebacks."""
    running.insert("SELECT 1", plan="9999-01-01", group="日本語")
    with open("/dev/full", "w") as full:
        result = subprocess.run([str(LAUNCHER), "status", "--dsn", running.dsn], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=30)
    assert (result.returncode, result.stderr) == (1, "pg_task_py status: cannot write the table:"
                                                     " No space left on device\n"), result
    result = subprocess.run(f"exec {LAUNCHER} status --dsn '{running.dsn}' >&-", shell=True, capture_output=True,
                            text=True, timeout=30)
    assert (result.returncode, result.stderr) == (1, "pg_task_py status: cannot write the table: stdout is closed\n")
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", running.dsn], capture_output=True, timeout=30,
                            env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and result.stderr == b"", result
    assert b"\\u65e5\\u672c\\u8a9e" in result.stdout, result.stdout


def test_status_reads_the_extensions_schema_off_the_search_path(db):
    """It looked for task_stats on the search_path only: 'no view task_stats here'."""
    db.sql("DROP EXTENSION pg_task_py CASCADE")
    db.sql('CREATE SCHEMA "Odd Schema"')
    db.sql('CREATE EXTENSION pg_task_py SCHEMA "Odd Schema" CASCADE')
    db.sql('INSERT INTO "Odd Schema".task ("group", plan, input) VALUES (\'odd\', \'9999-01-01\', \'SELECT 1\')')
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", db.dsn], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2].split()[:2] == ["postgres", "odd"], result.stdout


def test_status_reads_a_database_of_another_interval_style(db):
    """psycopg reads intervals in IntervalStyle postgres only: a database's iso_8601 (or a role's)
    failed `status` with a traceback on the lateness of a due task."""
    db.sql(f"ALTER DATABASE {db.name} SET IntervalStyle = 'iso_8601'")
    db.insert("SELECT 1", plan=db.value("SELECT now() - interval '5 min'"), group="late")
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", db.dsn], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result
    assert "late" in result.stdout and "5m" in result.stdout, result.stdout


def test_status_says_why_it_cannot_read(db):
    db.sql("DROP EXTENSION pg_task_py CASCADE")
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", db.dsn], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    # (not "ALTER EXTENSION ... UPDATE", which fails where there is none to update)
    assert "the extension pg_task_py is not installed in this database (CREATE EXTENSION" in result.stderr, result
    result = subprocess.run([str(LAUNCHER), "status", "--dsn", db.cluster.dsn("no_such_database")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and 'database "no_such_database" does not exist' in result.stderr
    # A conninfo libpq cannot read: exit 2, as `run`, and none of it told (libpq's message quoted it all:
    # 'missing "]" in IPv6 host address in URI: "postgresql://u:SECRETPW@[bad/db"').
    for dsn in ("postgresql://u:SECRETPW@[bad/db", "postgresql://u:SECRET%zzPW@localhost/db", "port=x password=SECRET"):
        result = subprocess.run([str(LAUNCHER), "status", "--dsn", dsn], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and "SECRET" not in result.stderr + result.stdout, result
        assert result.stderr.startswith("pg_task_py status: --dsn "), result


def test_a_full_window_is_counted_once_a_claim_whatever_its_due_tasks(db):
    """A limit's check reads every start in its window.  It ran once for each due task a claim
    looked at, so that a role's full window of many starts, with due tasks of as many remotes
    (each its own group hash), slowed every role's claims (1.6-2.4 s for another role's task,
    12-17 s with 100,000 starts in the window).  It runs once a group and claim."""
    db.sql(f"ALTER DATABASE {db.name} SET track_functions = 'pl'")
    db.launcher()
    db.sql("SELECT task_limit('full', 1, '1 hour')")
    assert db.wait_done(db.insert("SELECT 1", group="full", delete=False))["state"] == "DONE"
    held = [db.insert("SELECT 1", group="full", remote=f"application_name=remote{n}", delete=False)
            for n in range(40)]
    for n in range(5):
        assert db.wait_done(db.insert("SELECT 'others run'", group=f"other{n}"))["output"] == "others run"

    def calls():
        return dict(db.sql("SELECT funcname::text, calls FROM pg_stat_user_functions"
                           " WHERE funcname IN ('claim_due_tasks', 'rate_room')"))

    # (A backend's counts reach the view when it goes idle, within a second.)
    wait_until(lambda: calls().get("rate_room", 0) > 0, 10, message="the counts of the claims")
    counted = calls()
    assert counted["rate_room"] <= 2 * counted["claim_due_tasks"], counted  # (two passes at most)
    assert set(states(db, held)) == {"PLAN"}


def test_a_limit_made_again_counts_none_of_the_removed_one_s_starts(running, authors):
    """A start whose transaction read the limit just before a DELETE of it (held open) noted its
    start after the DELETE had forgotten the group's starts: made again, the limit counted it,
    and the tasks within it waited for up to an hour."""
    alice = authors["alice"]
    alice.execute("SELECT task_limit('again', 5, '1 hour')")
    with running.connect("ops_alice") as remover:
        remover.autocommit = False
        remover.execute("DELETE FROM pgtaskpy.group_limit WHERE \"group\" = 'again'")
        ran = [insert_as(alice, "SELECT 1", group="again", delete=False) for _ in range(3)]
        assert [running.wait_done(task_id)["state"] for task_id in ran] == ["DONE"] * 3
        remover.commit()
    alice.execute("SELECT task_limit('again', 3, '1 hour')")
    ran = [insert_as(alice, "SELECT 1", group="again", delete=False) for _ in range(3)]
    assert [running.wait_done(task_id)["state"] for task_id in ran] == ["DONE"] * 3


def test_an_admin_ends_another_roles_named_series_with_task_cancel(running, authors):
    """task_unschedule(key) is the caller's series only (False for another role's, as for none):
    an admin ends one with task_cancel(id, stop_series => true), as README says."""
    scheduled = authors["alice"].execute("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1')").fetchone()[0]
    assert running.value("SELECT task_unschedule('nightly')") is False
    assert running.value("SELECT state::text FROM task WHERE id = %s", [scheduled]) == "PLAN"
    assert running.value("SELECT task_cancel(%s, stop_series => true)", [scheduled]) is True
    assert running.value("SELECT state::text FROM task WHERE id = %s", [scheduled]) == "STOP"
    assert authors["alice"].execute("SELECT count(*) FROM task_series WHERE key = 'nightly'").fetchone()[0] == 0
    assert authors["alice"].execute("SELECT count(*) FROM task WHERE state = 'PLAN'").fetchone()[0] == 0
