"""Workflows: dependencies (after, after_any, task_chain), exclusive tasks and deduplicated
enqueues (task_enqueue's key and on_conflict), through the real launcher."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from pg_task_py_testing import Launcher, insert_as, most_at_once, new_database, throwaway_cluster, wait_until


def rows(db, ids: list[int]) -> dict[int, dict]:
    return {task_id: db.task(task_id) for task_id in ids}


def diamond(db, group_max: int, a_input: str = "SELECT pg_sleep(0.3)", d_any: bool = False,
            branch_input: str = "SELECT pg_sleep(0.6)") -> list[int]:
    """A -> (B, C) -> D, all in group "wf" (B and C may overlap when max >= 1)."""
    a = db.insert(a_input, group="wf", max=group_max, delete=False)
    b = db.insert(branch_input, group="wf", max=group_max, delete=False, after=[a])
    c = db.insert(branch_input, group="wf", max=group_max, delete=False, after=[a])
    d = db.insert("SELECT 'd'", group="wf", max=group_max, delete=False, after=[b, c], after_any=d_any)
    return [a, b, c, d]


def test_diamond_runs_in_order_and_branches_overlap(running):
    # B and C run until the test lets them end, once both run: with a fixed sleep, the second
    # could start after the first had ended on a busy machine.  One at a time, the first would
    # hold the group's slot for good, and the wait for both fails.
    with running.connect() as gate:
        gate.execute("SELECT pg_advisory_lock(4243)")
        a, b, c, d = diamond(running, group_max=1, branch_input="SELECT pg_advisory_xact_lock_shared(4243)")
        assert running.task(d)["waiting_for"] == 2
        wait_until(lambda: [running.task(i)["state"] for i in (b, c)] == ["WORK", "WORK"], 20,
                   message="B and C to run side by side")
    running.wait_done(d)
    t = rows(running, [a, b, c, d])
    assert all(row["state"] == "DONE" for row in t.values()), t
    assert t[b]["start"] >= t[a]["stop"] and t[c]["start"] >= t[a]["stop"]
    assert t[d]["start"] >= max(t[b]["stop"], t[c]["stop"])
    assert most_at_once([(t[b]["start"], t[b]["stop"]), (t[c]["start"], t[c]["stop"])]) == 2
    assert t[d]["output"] == "d" and t[d]["waiting_for"] == 0


def test_failed_prerequisite_stops_dependents_transitively(running):
    a, b, c, d = diamond(running, group_max=1, a_input="SELECT 1/0")
    e = running.insert("SELECT 'e'", delete=False, after=[d])
    running.wait_done(a)
    t = rows(running, [a, b, c, d, e])
    assert t[a]["state"] == "FAIL"
    assert (t[b]["state"], t[b]["error"]) == ("STOP", f"ERROR:  prerequisite task {a} ended FAIL")
    assert (t[c]["state"], t[c]["error"]) == ("STOP", f"ERROR:  prerequisite task {a} ended FAIL")
    assert (t[d]["state"], t[d]["error"]) == ("STOP", f"ERROR:  prerequisite task {b} ended STOP")
    assert (t[e]["state"], t[e]["error"]) == ("STOP", f"ERROR:  prerequisite task {d} ended STOP")
    assert all(row["start"] is None and row["stop"] is not None for row in (t[b], t[c], t[d], t[e]))
    # Inserted after the failure: stopped at once, as the failure would have stopped it.
    late = running.insert("SELECT 'late'", delete=False, after=[a])
    assert (running.task(late)["state"], running.task(late)["error"]) == (
        "STOP", f"ERROR:  prerequisite task {a} ended FAIL")


def test_after_any_runs_whatever_the_prerequisites_ended(running):
    a, b, c, d = diamond(running, group_max=1, a_input="SELECT 1/0", d_any=True)
    row = running.wait_done(d)
    assert row["state"] == "DONE" and row["output"] == "d"
    t = rows(running, [a, b, c])
    assert [t[i]["state"] for i in (a, b, c)] == ["FAIL", "STOP", "STOP"]
    assert row["start"] >= max(t[b]["stop"], t[c]["stop"])


def test_stopped_or_deleted_prerequisite_stops_dependents(db):
    """A user's STOP (UPDATE or task_cancel) and a DELETE of a waiting prerequisite are ends too."""
    ahead = "now() + interval '1 hour'"
    a1, a2, a3 = (db.value(f"INSERT INTO task (input, plan) VALUES ('SELECT 1', {ahead}) RETURNING id")
                  for _ in range(3))
    d1, d2, d3 = (db.insert("SELECT 2", after=[a]) for a in (a1, a2, a3))
    d1_next = db.insert("SELECT 3", after=[d1])
    any_of_them = db.insert("SELECT 4", after=[a1, a2, a3], after_any=True)
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [a1])
    assert db.value("SELECT task_cancel(%s)", [a2]) is True
    db.sql("DELETE FROM task WHERE id = %s", [a3])
    assert (db.task(d1)["state"], db.task(d1)["error"]) == ("STOP", f"ERROR:  prerequisite task {a1} ended STOP")
    assert db.task(d2)["error"] == f"ERROR:  prerequisite task {a2} ended STOP"
    assert db.task(d3)["error"] == f"ERROR:  prerequisite task {a3} was deleted"
    assert db.task(d1_next)["error"] == f"ERROR:  prerequisite task {d1} ended STOP"
    released = db.task(any_of_them)
    assert (released["state"], released["waiting_for"]) == ("PLAN", 0)
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_prerequisite_deleted_in_the_transaction_that_inserted_its_dependent_stops_it(db):
    """The dependent's commit settles its prerequisites before the DELETE's own trigger fires: it
    took the deleted one for ended and released the dependent, which ran without it.  Inserted
    before the transaction or in it, with a dependent of the dependent, and beside after_any."""
    before = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 hour') RETURNING id")
    with db.connect() as conn:
        with conn.transaction():
            inside = conn.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 hour')"
                                  " RETURNING id").fetchone()[0]
            dependents = [conn.execute("INSERT INTO task (input, after) VALUES ('SELECT 2', %s) RETURNING id",
                                       [[p]]).fetchone()[0] for p in (before, inside)]
            next_one = conn.execute("INSERT INTO task (input, after) VALUES ('SELECT 3', %s) RETURNING id",
                                    [[dependents[0]]]).fetchone()[0]
            any_of_them = conn.execute("INSERT INTO task (input, after, after_any) VALUES ('SELECT 4', %s, true)"
                                       " RETURNING id", [[before, inside]]).fetchone()[0]
            conn.execute("DELETE FROM task WHERE id = ANY(%s)", [[before, inside]])
    for dependent, prerequisite in zip(dependents, (before, inside)):
        assert (db.task(dependent)["state"], db.task(dependent)["error"]) == (
            "STOP", f"ERROR:  prerequisite task {prerequisite} was deleted")
    assert db.task(next_one)["error"] == f"ERROR:  prerequisite task {dependents[0]} ended STOP"
    released = db.task(any_of_them)
    assert (released["state"], released["waiting_for"]) == ("PLAN", 0)
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_waiting_task_that_ends_or_is_deleted_leaves_no_wait_behind(db):
    """A deleted waiting task left its edge: the next task inserted with its id (ids the sequence
    has given may be inserted again), another role's too, was stopped when the prerequisite it
    never named ended, and inserting that id after the same prerequisite failed on the edges' key.
    So did a dependent a user stopped, and one stopped by another of its prerequisites."""
    ahead = "now() + interval '1 hour'"
    first, second, other = (db.value(f"INSERT INTO task (input, plan) VALUES ('SELECT 1', {ahead}) RETURNING id")
                            for _ in range(3))
    deleted = db.insert("SELECT 2", after=[first])
    stopped = db.insert("SELECT 3", after=[first])
    stopped_by_other = db.insert("SELECT 4", after=[second, first])
    db.sql("DELETE FROM task WHERE id = %s", [deleted])
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [stopped])
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [second])
    assert db.task(stopped_by_other)["state"] == "STOP"
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0
    again = db.value("INSERT INTO task (id, input, after) VALUES (%s, 'SELECT 5', %s) RETURNING id",
                     [deleted, [other]])
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [first])
    assert (db.task(again)["state"], db.task(again)["waiting_for"]) == ("PLAN", 1)
    db.sql("DELETE FROM task WHERE id = %s", [again])
    db.insert("SELECT 6", id=deleted, after=[other])  # (the same id after the same prerequisite)
    assert db.sql("SELECT prerequisite, dependent FROM pgtaskpy.pending_prerequisite") == [(other, deleted)]


def test_truncate_takes_the_waits_with_the_tasks(db):
    """TRUNCATE task RESTART IDENTITY left every edge: a new task 3 waiting for task 1 was
    released when an unrelated task 2 ended."""
    first = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 hour') RETURNING id")
    second = db.insert("SELECT 2", after=[first])
    db.insert("SELECT 3", after=[second])
    db.sql("TRUNCATE task RESTART IDENTITY")
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0
    ids = [db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 hour') RETURNING id")
           for _ in range(2)]
    third = db.insert("SELECT 3", after=[ids[0]])
    assert [*ids, third] == [1, 2, 3]
    db.sql("UPDATE task SET state = 'DONE' WHERE id = 2")  # (an admin's hand end)
    assert (db.task(third)["state"], db.task(third)["waiting_for"]) == ("PLAN", 1)


def test_a_dependent_released_in_a_long_transaction_is_due_from_its_release(db):
    """Released by a cancel in a transaction that began a second before, the dependent's plan
    was that beginning (now()), and with an `active` shorter than the transaction it went GONE
    without ever having been due."""
    prerequisite = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 hour')"
                            " RETURNING id")
    dependent = db.insert("SELECT 2", after=[prerequisite], after_any=True, active="1 s")
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("SELECT pg_sleep(1.2)")
            conn.execute("SELECT task_cancel(%s)", [prerequisite])
    assert db.task(dependent)["plan"] >= db.task(prerequisite)["stop"]
    assert db.value("SELECT pgtaskpy.expire_inactive_tasks()") == 0
    assert db.task(dependent)["state"] == "PLAN"


def test_a_waiting_prerequisite_an_admin_ends_by_hand_is_followed_by_its_dependents(db):
    """Superusers and pgtaskpy_admin may repair a row by hand: a waiting prerequisite set to DONE
    or FAIL left its dependents waiting for ever (a waiting dependent never goes GONE)."""
    ahead = "now() + interval '1 hour'"
    done, failed = (db.value(f"INSERT INTO task (input, plan) VALUES ('SELECT 1', {ahead}) RETURNING id")
                    for _ in range(2))
    released, stopped = (db.insert("SELECT 2", after=[p]) for p in (done, failed))
    db.sql("UPDATE task SET state = 'DONE', stop = now() WHERE id = %s", [done])
    db.sql("UPDATE task SET state = 'FAIL', stop = now(), error = 'by hand' WHERE id = %s", [failed])
    assert (db.task(released)["state"], db.task(released)["waiting_for"]) == ("PLAN", 0)
    assert (db.task(stopped)["state"], db.task(stopped)["error"]) == (
        "STOP", f"ERROR:  prerequisite task {failed} ended FAIL")
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_running_or_claimed_prerequisite_an_admin_ends_by_hand_is_followed_by_its_dependents(db):
    """An admin's hand end of a claimed or running prerequisite (to DONE, FAIL or STOP), or of a
    waiting one to GONE, left its dependents waiting for ever: only ends from PLAN were followed."""
    ahead = "now() + interval '1 hour'"
    ends = [("WORK", "DONE"), ("WORK", "FAIL"), ("TAKE", "STOP"), ("PLAN", "GONE")]
    prerequisites = [db.value(f"INSERT INTO task (input, plan) VALUES ('SELECT 1', {ahead}) RETURNING id")
                     for _ in ends]
    dependents = [db.insert("SELECT 2", after=[p]) for p in prerequisites]
    for prerequisite, (running, _) in zip(prerequisites, ends):  # (as a launcher and a worker would)
        if running != "PLAN":
            db.sql("UPDATE task SET state = %s, start = now(), pid = 1 WHERE id = %s", [running, prerequisite])
    for prerequisite, (_, end) in zip(prerequisites, ends):
        db.sql("UPDATE task SET state = %s, stop = now() WHERE id = %s", [end, prerequisite])
    assert [(db.task(d)["state"], db.task(d)["waiting_for"], db.task(d)["error"]) for d in dependents] == [
        ("PLAN", 0, None)] + [("STOP", 1, f"ERROR:  prerequisite task {p} ended {end}")
                              for p, (_, end) in zip(prerequisites[1:], ends[1:])]
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_an_admin_re_arming_a_failed_step_and_its_stopped_dependents_runs_them_in_order(running):
    """The repair a workflow needs: the failed step and what it stopped set back to PLAN (by an
    admin: a task author may not), in one statement, rows in any order.  Each waits again for its
    prerequisites that have not ended, and runs after them; one whose prerequisites have all
    ended runs at once.  A stopped dependent kept the count it was stopped with and waited for ever."""
    running.sql("CREATE TABLE rearm_gate (x int)")
    a = running.insert("SELECT 1 / (SELECT count(*) FROM rearm_gate)::int FROM pg_sleep(0.2)", delete=False)
    b = running.insert("SELECT pg_sleep(0.2), 'b'", delete=False, after=[a])
    c = running.insert("SELECT 'c'", delete=False, after=[b])
    alone = running.insert("SELECT 'alone'", delete=False, after=[a])
    assert running.wait_done(c)["state"] == "STOP"
    running.sql("INSERT INTO rearm_gate VALUES (1)")
    with running.connect() as conn, conn.transaction():
        conn.execute("UPDATE task SET state = 'PLAN', stop = NULL, error = NULL WHERE id = ANY (%s)", [[c, a, b]])
    t = {i: running.wait_done(i) for i in (a, b, c)}
    assert [t[i]["state"] for i in (a, b, c)] == ["DONE"] * 3, t
    assert t[a]["stop"] <= t[b]["start"] and t[b]["stop"] <= t[c]["start"]
    assert t[c]["output"] == "c"
    # The stopped dependent of a prerequisite that stays FAIL: re-armed, it waits for nothing.
    running.sql("UPDATE task SET state = 'FAIL' WHERE id = %s", [a])
    running.sql("UPDATE task SET state = 'PLAN', error = NULL WHERE id = %s", [alone])
    assert running.wait_done(alone)["output"] == "alone"
    # Re-armed with `after` dropped in the same UPDATE: it waits for nothing (it kept its count
    # of 1 with no edge, for ever); a count set by hand in a later statement is kept.
    dropped = running.insert("SELECT 'dropped'", delete=False, after=[a])
    held = running.insert("SELECT 'held'", delete=False, after=[a])
    assert [running.wait_done(i)["state"] for i in (dropped, held)] == ["STOP", "STOP"]
    running.sql("UPDATE task SET state = 'PLAN', error = NULL, after = NULL WHERE id = %s", [dropped])
    assert running.wait_done(dropped)["output"] == "dropped"
    with running.connect() as conn, conn.transaction():
        conn.execute("UPDATE task SET state = 'PLAN', error = NULL, plan = now() + interval '1 hour' WHERE id = %s",
                     [held])
        conn.execute("UPDATE task SET waiting_for = 5 WHERE id = %s", [held])
    assert running.task(held)["waiting_for"] == 5
    assert running.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_an_admin_re_arm_that_builds_a_cycle_is_refused(db):
    """An admin's re-arm may give the task a new `after`: one naming the task itself, or a task
    re-armed with it that waits for it, made tasks that waited for each other for ever (tasks
    waiting for prerequisites never go GONE; a probe).  The commit fails, naming the task."""
    a = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h') RETURNING id")
    b = db.insert("SELECT 2", after=[a])
    c = db.insert("SELECT 3", after=[a])
    db.sql("UPDATE task SET state = 'FAIL', stop = now() WHERE id = %s", [a])
    assert [db.task(i)["state"] for i in (b, c)] == ["STOP", "STOP"]
    with db.connect() as admin:
        with pytest.raises(psycopg.errors.InvalidParameterValue,
                           match=f"task ({a}|{b}) cannot wait for its prerequisites: one of them waits for it"), \
                admin.transaction():
            admin.execute("UPDATE task SET state = 'PLAN', stop = NULL, error = NULL,"
                          " after = CASE WHEN id = %s THEN ARRAY[%s]::bigint[] ELSE after END WHERE id = ANY (%s)",
                          [a, b, [a, b]])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"task {c} cannot wait"), admin.transaction():
            admin.execute("UPDATE task SET state = 'PLAN', stop = NULL, after = ARRAY[id] WHERE id = %s", [c])
    assert [(db.task(i)["state"], db.task(i)["after"]) for i in (a, b, c)] == [
        ("FAIL", None), ("STOP", [a]), ("STOP", [a])]
    assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0
    # Re-armed without the cycle, b waits for a again.
    db.sql("UPDATE task SET state = 'PLAN', stop = NULL, error = NULL WHERE id = ANY (%s)", [[a, b]])
    assert [(db.task(i)["state"], db.task(i)["waiting_for"]) for i in (a, b)] == [("PLAN", 0), ("PLAN", 1)]


def test_after_any_of_a_task_with_prerequisites_is_kept_like_after(db):
    """Each prerequisite's end counts the task down, or stops it, by the after_any of that moment:
    an author who turned after_any off once a prerequisite had failed had the task run after the
    others ended DONE (a probe).  An author may not change it, as `after`; an admin is told."""
    db.sql("CREATE ROLE wf_carol LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect("wf_carol") as carol:
            carol.autocommit = True
            later = "SELECT task_enqueue('SELECT 1', plan => now() + interval '1 h')"
            first, alone = (carol.execute(later).fetchone()[0] for _ in range(2))
            waiting = carol.execute("SELECT task_enqueue('SELECT 2', after => %s, after_any => true)",
                                    [[first]]).fetchone()[0]
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="task.after_any cannot change"):
                carol.execute("UPDATE task SET after_any = false WHERE id = %s", [waiting])
            carol.execute("UPDATE task SET after_any = true WHERE id = %s", [alone])  # (no prerequisites)
            empty = carol.execute("SELECT task_enqueue('SELECT 4', after => '{}')").fetchone()[0]
            carol.execute("UPDATE task SET after_any = true WHERE id = %s", [empty])  # (none either: a review)
        notices = []
        with db.connect() as admin:
            admin.add_notice_handler(lambda notice: notices.append((notice.severity, notice.message_primary)))
            admin.execute("UPDATE task SET after_any = false WHERE id = %s", [waiting])
        assert notices == [("WARNING", f"task {waiting}: its after_any changed, but not what it waits for"
                                       ": 1 of the prerequisites its INSERT named")], notices
        assert [db.task(i)["after_any"] for i in (waiting, alone)] == [False, True]
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP OWNED BY wf_carol; DROP ROLE wf_carol")


def test_stop_cascades_down_a_wide_fan_out(db):
    """One prerequisite, 3,000 dependents, each with one of its own: a STOP of the prerequisite
    stops all 6,000 in its transaction (within the server's lock table), and so does a DELETE."""
    for how in ("UPDATE task SET state = 'STOP' WHERE id = %s", "DELETE FROM task WHERE id = %s"):
        first = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h') RETURNING id")
        db.sql("WITH level AS (INSERT INTO task (input, after) SELECT 'SELECT 2', ARRAY[%s]::bigint[]"
               " FROM generate_series(1, 3000) RETURNING id)"
               " SELECT count(*) FROM level", [first])
        db.sql("INSERT INTO task (input, after) SELECT 'SELECT 3', ARRAY[id] FROM task"
               " WHERE after = ARRAY[%s]::bigint[]", [first])
        assert db.value("SELECT count(*) FROM task WHERE state = 'PLAN' AND waiting_for = 1") == 6000
        db.sql(how, [first])
        assert db.value("SELECT count(*) FROM task WHERE state = 'STOP' AND error LIKE 'ERROR:  prerequisite task %%'"
                        ) == 6000
        assert db.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0
        db.sql("DELETE FROM task")


def test_an_open_transaction_with_dependents_holds_back_no_other_tasks_end(running):
    """A transaction that inserts a task `after` 3,000 others, or stops 3,000 waiting tasks, and
    stays open, holds nothing that another task's end waits for.  It held the lock of each
    prerequisite's key (one of 1,024, shared by every task) until it committed: the ends of
    nearly every other task waited for it, and so did their groups' next tasks."""
    running.sql("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'later', now() + interval '1 hour'"
                " FROM generate_series(1, 3000)")
    for held in ("INSERT INTO task (input, after) SELECT 'SELECT 1', array_agg(id) FROM task"
                 " WHERE \"group\" = 'later'",
                 "UPDATE task SET state = 'STOP' WHERE \"group\" = 'later'"):
        with running.connect() as author, author.transaction(force_rollback=True):
            author.execute(held)
            others = [running.insert("SELECT 1", group=f"other {i}", delete=False) for i in range(20)]
            wait_until(lambda others=others: running.value(
                "SELECT count(*) FROM task WHERE state = 'DONE' AND id = ANY (%s)", [others]) == 20,
                20, 0.05, "the other tasks to end while it is open")


@pytest.mark.parametrize("ends", ["DONE", "FAIL"])
def test_a_prerequisite_that_ends_before_the_insert_commits_counts_at_the_commit(running, ends):
    """The end of a prerequisite cannot see the edges of a transaction that has not committed:
    that transaction reads the prerequisite's state again as it commits, and the dependents it
    inserted follow the end as if they had been there.  Meanwhile the prerequisite, which
    produced nothing and so is deleted at its end, is kept for them (the INSERT locks it FOR KEY
    SHARE until the commit)."""
    # (a condition the planner cannot fold: pg_sleep runs, then no row, or a division by zero)
    condition = "1 / floor(random())::int = 1" if ends == "FAIL" else "random() < 0"
    prerequisite = running.insert(f"SELECT FROM pg_sleep(0.5) WHERE {condition}")
    wait_until(lambda: running.task(prerequisite)["state"] == "WORK", 20, 0.01, "the prerequisite running")

    def insert(author, input: str, after: int, after_any: bool = False) -> int:
        return author.execute("INSERT INTO task (input, after, after_any, delete) VALUES (%s, %s, %s, false)"
                              " RETURNING id", [input, [after], after_any]).fetchone()[0]

    with running.connect() as author:
        with author.transaction():
            dependent = insert(author, "SELECT 'd'", prerequisite)
            next_step = insert(author, "SELECT 'n'", dependent)
            either = insert(author, "SELECT 'e'", prerequisite, after_any=True)
            wait_until(lambda: running.task(prerequisite)["state"] == ends, 20, 0.02,
                       "the prerequisite's end while the insert is open")
    assert running.wait_done(either)["output"] == "e"
    if ends == "DONE":
        assert running.wait_done(dependent)["output"] == "d" and running.wait_done(next_step)["output"] == "n"
    else:
        assert (running.task(dependent)["state"], running.task(dependent)["error"]) == (
            "STOP", f"ERROR:  prerequisite task {prerequisite} ended FAIL")
        assert running.task(next_step)["error"] == f"ERROR:  prerequisite task {dependent} ended STOP"
    assert running.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_dependent_inserted_while_a_failed_prerequisite_waits_for_its_retry_waits_for_the_retry(running):
    """A dependent inserted after its prerequisite's first attempt failed, while the retry waited,
    was inserted STOP ("prerequisite ended FAIL"), though the retry then ended DONE and the
    dependents inserted a moment earlier ran (a probe): it waits for the retry, as they do."""
    flaky = ("DO $$ BEGIN IF (SELECT attempt FROM task WHERE id = current_setting('pg_task.id')::bigint) = 1"
             " THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; END $$")
    prerequisite = running.insert(flaky, retry=2, retry_delay="2 s", delete=False)
    retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2 AND state = 'PLAN'",
                                             [prerequisite]), 20, 0.02, "the failure and its retry waiting")
    dependent = running.insert("SELECT 'after the retry'", after=[prerequisite], delete=False)
    assert running.task(dependent)["state"] == "PLAN" and running.task(dependent)["after"] == [retry]
    retried = running.wait_done(retry)
    row = running.wait_done(dependent)
    assert (row["state"], row["output"]) == ("DONE", "after the retry"), row
    assert retried["state"] == "DONE" and row["start"] >= retried["stop"], (row, retried)
    assert running.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_dependent_inserted_after_a_failed_prerequisites_retry_did_the_work_runs(running):
    """A dependent of a failed attempt inserted once its retry had ended DONE, having produced
    nothing: the retry's row was deleted at its end, the dependent could not follow the attempt to
    it, and was inserted STOP, "prerequisite ended FAIL" (a review).  A retry's row is kept."""
    running.sql("CREATE FUNCTION fails_at_first() RETURNS void LANGUAGE plpgsql AS $$ BEGIN"
                " IF (SELECT attempt FROM task WHERE id = current_setting('pg_task.id')::bigint) = 1 THEN"
                " RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; END $$")
    try:
        nothing = "SELECT FROM fails_at_first() AS f WHERE random() < 0"  # (no row, no command tag)
        prerequisite = running.insert(nothing, retry=1, retry_delay="0.2 s")
        retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2"
                                                 " AND state = 'DONE'", [prerequisite]), 20, 0.05, "the retry done")
        assert running.task(retry)["output"] is None
        dependent = running.insert("SELECT 'after the retry'", after=[prerequisite], delete=False)
        row = running.wait_done(dependent)
        assert (row["state"], row["output"], row["after"]) == ("DONE", "after the retry", [retry]), row
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP FUNCTION fails_at_first()")


def test_a_prerequisite_retried_before_the_insert_commits_hands_it_on_to_the_retry(running):
    """A prerequisite that fails, and is retried, while the dependents' INSERT is open: they wait
    for the retry, as those committed before the failure do (they were stopped, and one with
    after_any ran before the retry did)."""
    flaky = ("DO $$ BEGIN PERFORM pg_sleep(0.3); IF (SELECT attempt FROM task WHERE id ="
             " current_setting('pg_task.id')::bigint) = 1 THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001';"
             " END IF; END $$")
    prerequisite = running.insert(flaky, retry=2, retry_delay="1 s", delete=False)
    wait_until(lambda: running.task(prerequisite)["state"] == "WORK", 20, 0.01, "the prerequisite running")
    with running.connect() as author:
        with author.transaction():
            dependent, either = [author.execute(
                "INSERT INTO task (input, after, after_any, delete) VALUES ('SELECT 1', %s, %s, false) RETURNING id",
                [[prerequisite], after_any]).fetchone()[0] for after_any in (False, True)]
            retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2",
                                                     [prerequisite]), 20, 0.02, "the failure and its retry")
    assert running.task(dependent)["after"] == [retry] and running.task(either)["after"] == [retry]
    retried = running.wait_done(retry)
    for task_id in (dependent, either):
        row = running.wait_done(task_id)
        assert row["state"] == "DONE" and row["start"] >= retried["stop"], (row, retried)
    assert running.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0


def test_a_prerequisite_retried_before_the_insert_commits_whose_retry_produced_nothing_releases_it(running):
    """The retry that ended DONE had produced nothing, and its row was deleted at its end: the
    dependent's commit could not follow the failed attempt to it, and stopped the dependent,
    "prerequisite ended FAIL", after the retry had done the work.  The row is kept for it.  And
    the author is not warned that her task's `after` changed but not what it waits for (the
    commit's change of it is the scheduler's: a review)."""
    running.sql("CREATE FUNCTION fails_first() RETURNS void LANGUAGE plpgsql AS $$ BEGIN"
                " IF (SELECT attempt FROM task WHERE id = current_setting('pg_task.id')::bigint) = 1 THEN"
                " PERFORM pg_advisory_lock(4246); RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; END $$")
    nothing = "SELECT FROM fails_first() AS f WHERE random() < 0"  # (no row, no command tag: nothing kept)
    notices = []
    with running.connect() as gate, running.connect() as author:
        author.add_notice_handler(lambda notice: notices.append((notice.severity, notice.message_primary)))
        gate.execute("SELECT pg_advisory_lock(4246)")
        prerequisite = running.value("SELECT task_enqueue(%s, retry => 1, retry_delay => '0.1 s')", [nothing])
        wait_until(lambda: running.task(prerequisite)["state"] == "WORK", 20, 0.01, "the prerequisite running")
        with author.transaction():
            dependent = author.execute("SELECT task_enqueue('SELECT 42', after => ARRAY[%s::bigint])",
                                       [prerequisite]).fetchone()[0]
            gate.execute("SELECT pg_advisory_unlock(4246)")
            # (its row kept, or deleted: the retry's id given, none of the task's attempts left to run)
            wait_until(lambda: running.value(
                "SELECT pg_sequence_last_value('task_id_seq') > %s AND NOT EXISTS (SELECT FROM task"
                " WHERE parent = %s AND state IN ('PLAN', 'TAKE', 'WORK'))", [dependent, prerequisite]),
                20, 0.02, "the retry's end while the insert is open")
    row = running.wait_done(dependent)
    assert (row["state"], row["output"], row["error"]) == ("DONE", "42", None), row
    assert running.value("SELECT count(*) FROM pgtaskpy.pending_prerequisite") == 0
    assert notices == []


def test_done_prerequisite_deleted_at_its_end_releases_dependents(running):
    """delete = true and no output: the scheduler deletes the row at its end, after its dependents
    have counted it as DONE."""
    a = running.insert("SELECT WHERE false")  # no rows, no tag: nothing to keep
    d = running.insert("SELECT 'd'", delete=False, after=[a])
    row = running.wait_done(d)
    assert running.task(a) is None
    assert (row["state"], row["output"]) == ("DONE", "d")


def test_unknown_or_invisible_prerequisite_is_refused(db):
    before = db.value("SELECT count(*) FROM task")
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="prerequisite task 987654 not found"):
        db.insert("SELECT 1", after=[987654])
    with pytest.raises(psycopg.errors.NotNullViolation, match="task.after must not contain NULL"):
        db.insert("SELECT 1", after=[None])
    others = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h') RETURNING id")
    db.sql("CREATE ROLE wf_alice LOGIN; GRANT pgtaskpy_user TO wf_alice")
    try:
        with db.connect("wf_alice") as alice:
            alice.autocommit = True
            with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"prerequisite task {others} not found"):
                alice.execute("INSERT INTO task (input, after) VALUES ('SELECT 1', %s)", [[others]])
            with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"prerequisite task {others} not found"):
                alice.execute("SELECT task_enqueue('SELECT 1', after => %s)", [[others]])
            own = alice.execute("SELECT task_enqueue('SELECT 1', plan => now() + interval '1 h')").fetchone()[0]
            mine = alice.execute("SELECT task_enqueue('SELECT 2', after => %s)", [[own]]).fetchone()[0]
            # The scheduler's columns and the list are not the author's to change.
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="task.after cannot change"):
                alice.execute("UPDATE task SET after = NULL WHERE id = %s", [mine])
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="task.waiting_for"):
                alice.execute("UPDATE task SET waiting_for = 0 WHERE id = %s", [mine])
            # A waiting task of somebody else is stopped, its dependents with it, whoever stops it.
            alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [own])
            assert alice.execute("SELECT state::text FROM task WHERE id = %s", [mine]).fetchone()[0] == "STOP"
        assert db.value("SELECT count(*) FROM task") == before + 3
        # An admin may change the list (a repair), and is told when it changes nothing the task waits for.
        first = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h') RETURNING id")
        second = db.insert("SELECT 2", after=[first])
        notices = []
        with db.connect() as admin:
            admin.add_notice_handler(lambda notice: notices.append((notice.severity, notice.message_primary)))
            admin.execute("UPDATE task SET after = '{}' WHERE id = %s", [second])
            admin.execute("UPDATE task SET after = '{}' WHERE id = %s", [own])  # (ended: nothing to tell)
        assert notices == [("WARNING", f"task {second}: its after changed, but not what it waits for"
                                       ": 1 of the prerequisites its INSERT named")], notices
        assert (db.task(second)["after"], db.task(second)["waiting_for"]) == ([], 1)
        db.sql("DELETE FROM task")
    finally:
        db.sql("DROP OWNED BY wf_alice; DROP ROLE wf_alice")


def test_waiting_task_does_not_expire_and_active_counts_from_release(running):
    """A task waiting for a prerequisite planned 1.5 s ahead, with active 0.5 s and a plan long
    past: it is not GONE, and runs once the prerequisite is DONE (its plan moved to that moment)."""
    a = running.value("INSERT INTO task (input, plan, delete) VALUES ('SELECT 1', clock_timestamp()"
                      " + interval '1.5 s', false) RETURNING id")
    d = running.value("INSERT INTO task (input, plan, active, after, delete)"
                      " VALUES ('SELECT 2', now() - interval '1 hour', '0.5 s', %s, false) RETURNING id", [[a]])
    assert running.value("SELECT pgtaskpy.expire_inactive_tasks()") == 0
    row = running.wait_done(d)
    prerequisite = running.task(a)
    assert row["state"] == "DONE", row
    assert row["plan"] >= prerequisite["stop"] - timedelta(seconds=1)
    assert row["start"] >= prerequisite["stop"]


def test_chain_and_fan_in_of_a_thousand(running):
    ids = running.value("SELECT task_chain(array_agg('SELECT ' || i ORDER BY i), 'chain')"
                        " FROM generate_series(1, 1000) AS i")
    assert len(ids) == 1000
    fan = running.value("SELECT array_agg(task_enqueue('SELECT ' || i, \"group\" => 'fan' || (i % 4)))"
                        " FROM generate_series(1, 1000) AS i")
    last = running.value("SELECT task_enqueue('SELECT ''all''', after => %s)", [fan])
    assert running.task(last)["waiting_for"] + running.value(
        "SELECT count(*) FROM task WHERE id = ANY(%s) AND state NOT IN ('PLAN', 'TAKE', 'WORK')", [fan]) >= 1000
    running.wait_all_done(timeout=120)
    starts = running.sql("SELECT start, stop, output FROM task WHERE id = ANY(%s) ORDER BY id", [ids])
    assert [output for _, _, output in starts] == [str(i) for i in range(1, 1001)]
    assert all(later[0] >= earlier[1] for earlier, later in zip(starts, starts[1:]))
    final = running.task(last)
    assert (final["state"], final["output"]) == ("DONE", "all")
    assert final["start"] >= running.value("SELECT max(stop) FROM task WHERE id = ANY(%s)", [fan])


@pytest.mark.parametrize("launchers", [1, 2])
def test_exclusive_task_waits_for_the_running_and_runs_alone(db, launchers):
    for _ in range(launchers):
        db.launcher()
    # The eight run until the test lets them end: eight new workers start in 0.3 s on an idle
    # machine, and a fixed sleep of theirs ended before the last had started on a busy one.
    with db.connect() as gate:
        gate.execute("SELECT pg_advisory_lock(4242)")
        busy = [db.insert("SELECT pg_advisory_xact_lock_shared(4242)", group=f"busy{i}", delete=False)
                for i in range(8)]
        wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 8, 15,
                   message="the eight tasks to run")
        exclusive = db.insert("SELECT pg_sleep(0.5)", exclusive=True, delete=False, group="maintenance")
        later = [db.insert("SELECT 1", group=f"later{i % 3}", delete=False) for i in range(6)]
    row = db.wait_done(exclusive)
    db.wait_all_done()
    assert row["state"] == "DONE"
    ended = db.value("SELECT max(stop) FROM task WHERE id = ANY(%s)", [busy])
    assert row["start"] >= ended
    others = db.sql("SELECT start, stop FROM task WHERE id <> %s", [exclusive])
    assert not any(start < row["stop"] and stop > row["start"] for start, stop in others)
    assert db.value("SELECT min(start) FROM task WHERE id = ANY(%s)", [later]) >= row["stop"]


def test_a_turn_begun_before_an_exclusive_task_was_due_claims_nothing_else_after(db):
    """A launcher's turn judged "due" by its transaction's start: one that began before the
    exclusive task's plan and waited for the scheduling lock past it claimed other tasks, which
    started after the exclusive task was due, and held it back while they ran."""
    db.launcher()
    with db.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE pgtaskpy.scheduling_lock IN EXCLUSIVE MODE")
        with db.connect() as author, author.transaction():  # (one commit: the turn it wakes sees both)
            # (3 s: the turn must wait for the lock before the plan; a busy machine may take 1 s to get there)
            plan = author.execute("SELECT now() + interval '3 s'").fetchone()[0]
            exclusive = insert_as(author, "SELECT pg_sleep(0.5)", exclusive=True, plan=plan, delete=False,
                                  group="maintenance")
            # (due already at the start of any turn that may be waiting: one woken before this commit)
            other = insert_as(author, "SELECT 1", group="other", delete=False, plan=plan - timedelta(seconds=10))
        wait_until(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                    " AND application_name IN ('pg_task_py', 'pg_task_py launcher')") == 1, 10,
                   message="the launcher's turn to wait for the scheduling lock")
        assert db.value("SELECT now() < %s", [plan])
        wait_until(lambda: db.value("SELECT clock_timestamp() > %s + interval '0.3 s'", [plan]), 5,
                   message="the exclusive task to be due")
        holder.execute("COMMIT")
    row = db.wait_done(exclusive)
    assert row["state"] == "DONE"
    assert db.wait_done(other)["start"] >= row["stop"], (db.task(other), row)


@pytest.mark.parametrize("hold", ["FOR UPDATE", "FOR SHARE"])
def test_a_due_exclusive_task_that_a_client_holds_holds_back_nothing_else(db, hold):
    """A client's lock on a waiting task holds back that task alone (README's Guarantees): a due
    exclusive task held by a client (SELECT ... FOR UPDATE, an owner's task_schedule of its
    series) was counted due by the claims' gate, which the claim itself then skipped: no task of
    the database started for as long as the lock lasted (a probe).  It runs once let go."""
    db.launcher()
    exclusive = db.insert("SELECT pg_sleep(0.3)", exclusive=True, delete=False, group="maintenance",
                          plan=db.value("SELECT now() + interval '0.5 s'"))
    with db.connect() as client:
        client.execute("BEGIN")
        client.execute(f"SELECT FROM task WHERE id = %s {hold}", [exclusive])
        wait_until(lambda: db.value("SELECT plan <= now() FROM task WHERE id = %s", [exclusive]), 10,
                   message="the exclusive task to be due")
        others = [db.insert("SELECT 1", group=f"other{i}", delete=False) for i in range(3)]
        for task_id in others:
            assert db.wait_done(task_id, 20)["state"] == "DONE"
        assert db.value("SELECT state::text FROM task WHERE id = %s", [exclusive]) == "PLAN"
        client.execute("COMMIT")
    row = db.wait_done(exclusive, 20)
    assert row["state"] == "DONE", row
    later = db.insert("SELECT 1", group="after", delete=False)
    assert db.wait_done(later, 20)["start"] >= row["stop"]


def test_two_exclusive_tasks_never_run_at_once(db):
    db.launcher()
    db.launcher()
    ids = [db.insert("SELECT pg_sleep(0.3)", exclusive=True, group=f"x{i}", delete=False) for i in range(4)]
    ids += [db.insert("SELECT pg_sleep(0.1)", group=f"y{i}", delete=False) for i in range(6)]
    db.wait_all_done()
    spans = db.sql("SELECT start, stop, exclusive FROM task WHERE id = ANY(%s)", [ids])
    for start, stop, exclusive in spans:
        if exclusive:
            assert not any(s < stop and e > start for s, e, _ in spans if (s, e) != (start, stop))
    # The next run of a repeating exclusive task is exclusive too.
    series = db.insert("SELECT 1", exclusive=True, repeat="1 hour")
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE parent = %s", [series]) == 1, 15)
    assert db.value("SELECT exclusive FROM task WHERE parent = %s", [series]) is True


def test_on_conflict_skip_from_twenty_sessions(db):
    barrier = threading.Barrier(20)
    ids: list[int] = []

    def enqueue() -> None:
        with db.connect() as conn:
            conn.autocommit = True
            barrier.wait()
            ids.append(conn.execute("SELECT task_enqueue('SELECT 1', plan => now() + interval '1 h',"
                                    " key => 'refresh', on_conflict => 'skip')").fetchone()[0])

    threads = [threading.Thread(target=enqueue) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(ids) == 20 and len(set(ids)) == 1
    assert db.sql("SELECT id FROM task WHERE key = 'refresh'") == [(ids[0],)]


def test_on_conflict_replace_and_error(db):
    first = db.value("SELECT task_enqueue('SELECT 1', plan => now() + interval '1 h', key => 'k', data => 'a')")
    for n in range(2, 6):
        again = db.value("SELECT task_enqueue(%s, plan => now() + %s * interval '1 min', key => 'k',"
                         " on_conflict => 'replace')", [f"SELECT {n}", n])
        assert again == first
    row = db.task(first)
    assert (row["input"], row["data"]) == ("SELECT 5", None)
    assert db.value("SELECT count(*) FROM task WHERE key = 'k'") == 1
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.value("SELECT task_enqueue('SELECT 6', key => 'k')")
    # A NULL is unset, as for the other arguments (a client's parameter for "not given"): 'error'.
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.value("SELECT task_enqueue('SELECT 6', key => 'k', on_conflict => %s)", [None])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='invalid on_conflict "merge"'):
        db.value("SELECT task_enqueue('SELECT 6', key => 'k', on_conflict => 'merge')")
    # Without a key nothing conflicts: 'skip' and 'replace' would insert a task beside the same one.
    before = db.value("SELECT count(*) FROM task")
    for how in ("skip", "replace"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"on_conflict => '{how}' needs a key"):
            db.value("SELECT task_enqueue('SELECT 6', on_conflict => %s)", [how])
    assert db.value("SELECT count(*) FROM task") == before
    assert db.value("SELECT task_enqueue('SELECT 6', on_conflict => 'error')") > first  # (the default's word)
    # The same with a plain INSERT ... ON CONFLICT on the partial unique index.
    db.sql("INSERT INTO task (key, input) VALUES ('k', 'SELECT 7') ON CONFLICT (owner, key)"
           " WHERE state = 'PLAN' AND key IS NOT NULL DO UPDATE SET input = EXCLUDED.input")
    assert db.task(first)["input"] == "SELECT 7"
    assert db.sql("INSERT INTO task (key, input) VALUES ('k', 'SELECT 8') ON CONFLICT (owner, key)"
                  " WHERE state = 'PLAN' AND key IS NOT NULL DO NOTHING RETURNING id") == []


def test_on_conflict_decides_for_a_task_whose_prerequisite_has_failed(db):
    """A task of a key whose prerequisite had ended otherwise than DONE was made STOP before it met
    the key's waiting task: each call inserted a STOP row beside it, 'skip' did not return its id,
    'replace' did not replace it, and 'error' raised nothing."""
    waiting = db.value("SELECT task_enqueue('SELECT 1', plan => now() + interval '1 h', key => 'k')")
    failed = db.value("INSERT INTO task (input, state) VALUES ('SELECT 0', 'STOP') RETURNING id")
    call = "SELECT task_enqueue('SELECT 2', key => 'k', after => ARRAY[%s::bigint], on_conflict => %s)"
    assert db.value(call, [failed, "skip"]) == waiting
    assert db.value(call, [failed, "replace"]) == waiting and db.task(waiting)["input"] == "SELECT 2"
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.value(call, [failed, "error"])
    assert db.sql("SELECT id, state::text FROM task WHERE key = 'k'") == [(waiting, "PLAN")]
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [waiting])  # (none waits: the new one stops)
    stopped = db.task(db.value(call, [failed, "skip"]))
    assert (stopped["state"], stopped["error"]) == ("STOP", f"ERROR:  prerequisite task {failed} ended STOP")


def test_an_empty_or_overlong_key_is_refused_with_a_clear_error(db):
    """A key names a series: '' names nothing, and one longer than the unique index of waiting keys
    can hold failed the insert with the server's raw index message."""
    for key in ("", "k" * 1001):
        with pytest.raises(psycopg.errors.CheckViolation, match="task.key must not be empty nor over 1000 bytes"):
            db.value("SELECT task_enqueue('SELECT 1', key => %s)", [key])
        with pytest.raises(psycopg.errors.CheckViolation, match="task.key must not be empty nor over 1000 bytes"):
            db.value("SELECT task_schedule(%s, '@daily', 'SELECT 1')", [key])
    task_id = db.value("SELECT task_enqueue('SELECT 1', key => %s)", ["é" * 500])  # 1000 bytes
    with pytest.raises(psycopg.errors.CheckViolation, match="task.key must not be empty"):
        db.sql("UPDATE task SET key = '' WHERE id = %s", [task_id])
    assert db.sql("SELECT id, length(key) FROM task") == [(task_id, 500)]


def test_running_task_of_the_key_is_untouched(running):
    first = running.value("SELECT task_enqueue('SELECT pg_sleep(1)', key => 'nightly', on_conflict => 'replace')")
    wait_until(lambda: running.task(first)["state"] == "WORK", 15)
    second = running.value("SELECT task_enqueue('SELECT 2', key => 'nightly', on_conflict => 'replace')")
    third = running.value("SELECT task_enqueue('SELECT 3', key => 'nightly', on_conflict => 'replace')")
    skipped = running.value("SELECT task_enqueue('SELECT 4', key => 'nightly', on_conflict => 'skip')")
    assert second != first and third == second and skipped == second
    assert running.task(first)["input"] == "SELECT pg_sleep(1)"
    done = running.wait_done(second)
    ran = running.task(first)
    assert ran is None or ran["input"] == "SELECT pg_sleep(1)"
    assert done["input"] == "SELECT 3" and done["output"] == "3"
    if ran is not None:
        assert done["start"] >= ran["stop"]


def test_a_claimed_task_of_a_key_given_back_after_the_key_got_a_waiting_task_ends_stop(db):
    """A claimed (TAKE) task of a key counts as started: task_enqueue inserts the key's next
    waiting task beside it.  Given back to PLAN (no free connection, its launcher gone), it was
    the key's second waiting task: the unique violation of task_key_waiting failed every turn of
    every launcher (`scheduler error (duplicate key value ...); reconnecting`), and nothing of
    the database started.  It ends STOP, never run, and the key's waiting task runs."""
    claimed = db.value("SELECT task_enqueue('SELECT 1', key => 'k')")
    with db.connect() as claimer:  # (a launcher that claimed it, then died)
        assert claimer.execute("SELECT count(*) FROM pgtaskpy.claim_due_tasks(10, pg_backend_pid())"
                               ).fetchone() == (1,)
    assert db.task(claimed)["state"] == "TAKE"
    waiting = db.value("SELECT task_enqueue('SELECT 2', key => 'k', on_conflict => 'skip')")
    assert waiting != claimed
    other = db.insert("SELECT 'other'", delete=False)
    launcher = db.launcher()
    assert db.wait_done(waiting)["output"] == "2"
    assert db.wait_done(other)["output"] == "other"
    row = db.task(claimed)
    assert (row["state"], row["start"]) == ("STOP", None), row
    assert row["error"].startswith(f"ERROR:  task {waiting} of key 'k' waits in its place"), row
    assert launcher.stop() == 0
    assert "scheduler error" not in launcher.output(), launcher.output()


def test_a_dependent_inserted_as_its_prerequisite_is_cancelled_never_waits_for_nothing(db):
    """The INSERT read its prerequisites' states in two statements, whether one had ended otherwise
    than DONE, then how many were still to end: a task_cancel committed between them made the
    dependent wait for nothing (waiting_for 0, PLAN), and it ran (3 races in 300 here, 120 in
    1,250 beside launchers).  Each race here ends with the dependent STOP."""
    with db.connect() as canceller, db.connect() as author:
        canceller.autocommit = author.autocommit = True
        dependents = []
        for _ in range(400):
            prerequisite = canceller.execute(
                "SELECT task_enqueue('SELECT 1', plan => now() + interval '1 hour')").fetchone()[0]
            both = threading.Barrier(2)

            def insert_dependent(prerequisite=prerequisite, both=both):
                both.wait()
                dependents.append(author.execute("SELECT task_enqueue('SELECT 2', after => ARRAY[%s]::bigint[])",
                                                 [prerequisite]).fetchone()[0])
            inserter = threading.Thread(target=insert_dependent)
            inserter.start()
            both.wait()
            canceller.execute("SELECT task_cancel(%s)", [prerequisite])
            inserter.join()
    waiting = db.sql("SELECT id, state::text, waiting_for FROM task WHERE id = ANY(%s) AND state <> 'STOP'",
                     [dependents])
    assert len(dependents) == 400 and waiting == [], waiting


def test_task_chain(running):
    ids = running.value("SELECT task_chain(ARRAY['SELECT 1', 'SELECT 1/0', 'SELECT 3'], 'etl')")
    assert len(ids) == 3
    running.wait_done(ids[2])
    t = rows(running, ids)
    assert [t[i]["state"] for i in ids] == ["DONE", "FAIL", "STOP"]
    assert t[ids[0]]["group"] == "etl" and t[ids[1]]["after"] == [ids[0]]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="task_chain needs"):
        running.value("SELECT task_chain('{}'::text[])")


def test_task_chain_with_ignore_errors_runs_every_step(running):
    """As pg_timetable's ignore_error: a step runs once the one before has ended, whatever its end."""
    ids = running.value("SELECT task_chain(ARRAY['SELECT 1', 'SELECT 1/0', 'SELECT 3'], 'etl', ignore_errors => true)")
    running.wait_done(ids[2])
    t = rows(running, ids)
    assert [t[i]["state"] for i in ids] == ["DONE", "FAIL", "DONE"]
    assert t[ids[2]]["start"] >= t[ids[1]]["stop"]
    assert [t[i]["after_any"] for i in ids] == [False, True, True]
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="ignore_errors must be true or false"):
        running.value("SELECT task_chain(ARRAY['SELECT 1'], ignore_errors => NULL)")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="task_chain: step 2 of the inputs is NULL"):
        running.value("SELECT task_chain(ARRAY['SELECT 1', NULL])")
    # (the table's check named no step, and showed task_enqueue's INSERT: a probe)
    with pytest.raises(psycopg.errors.CheckViolation, match="task_chain: step 2 of the inputs is empty"):
        running.value("SELECT task_chain(ARRAY['SELECT 1', '  ;  '])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="one-dimensional"):
        running.value("SELECT task_chain(ARRAY[['SELECT 1'], ['SELECT 2']])")


def log_claims(db):
    """A table `claimed_by` of who moved each task out of PLAN (the backend's application_name):
    the task's row keeps no trace of it (`worker` is NULL once a task has ended)."""
    db.sql("CREATE TABLE claimed_by (id bigint, by text, at timestamptz DEFAULT clock_timestamp());"
           " CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql SET search_path = public AS $$ BEGIN"
           "   INSERT INTO claimed_by (id, by) VALUES (NEW.id, current_setting('application_name')); RETURN NULL;"
           " END $$;"
           " CREATE TRIGGER log_claim AFTER UPDATE OF state ON task FOR EACH ROW"
           " WHEN (OLD.state = 'PLAN' AND NEW.state IN ('TAKE', 'WORK')) EXECUTE FUNCTION log_claim()")


def test_a_chains_next_step_is_taken_by_the_worker_that_ran_the_step_before(running):
    """The worker that ends a step goes on with the next in the same transaction, its session
    started ahead while the step before ran; two chains of one group run in priority order.
    The released step's plan (the clock's) was after the transaction's now(), which the worker's
    claim compared: every step waited for a launcher's turn, behind the group's later tasks."""
    log_claims(running)
    first = running.value("SELECT task_chain(array_fill('SELECT (SELECT backend_start FROM pg_stat_activity"
                          " WHERE pid = pg_backend_pid()) FROM pg_sleep(0.1)'::text, ARRAY[3]), 'ahead',"
                          " ignore_errors => false)")
    second = running.value("SELECT task_chain(array_fill('SELECT clock_timestamp()'::text, ARRAY[3]), 'ahead')")
    assert running.wait_done(second[-1], 30)["state"] == "DONE"
    claims = running.sql("SELECT id, by, at - min(at) OVER () FROM claimed_by ORDER BY at")
    assert [task_id for task_id, _, _ in claims] == first + second, claims  # priority order: (max, id)
    # No launcher turn a step, but after the worker's second going on with its group (CHAIN_SECONDS,
    # which a slow machine reaches): its first chain's steps at least.
    handed_on = [by for _, by, since in claims[1:] if since < timedelta(seconds=0.9)]
    assert len(handed_on) >= 2 and set(handed_on) == {"pg_task_py worker"}, claims
    steps = running.sql("SELECT start, stop, output::timestamptz FROM task WHERE id = ANY(%s) ORDER BY id", [first])
    for earlier, later in zip(steps, steps[1:]):
        assert later[2] < earlier[1], (earlier, later)  # its backend started before the step before ended


def test_readme_scheduled_chain_runs_one_copy_at_a_time(running):
    """pg_timetable's max_instances = 1 as README writes it: the series' run inserts the chain only
    when none of its steps waits or runs (a group's max bounds steps, not copies: each match added
    a copy beside the last)."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    words = readme.index("A scheduled chain that never runs two copies at once")
    recipe = re.search(r"```sql\n(.*?)```", readme[words:], re.DOTALL).group(1)
    recipe = recipe.replace("'0 3 * * *'", "'1 seconds'").replace(
        "'CALL archive()', 'CALL reindex()'", "'SELECT 1 FROM pg_sleep(0.8)', 'SELECT 2 FROM pg_sleep(0.8)'")
    assert "'1 seconds'" in recipe and "pg_sleep(0.8)" in recipe, recipe
    running.sql(recipe)
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE \"group\" = 'nightly.steps'"
                                     " AND output = '2'") >= 3, 30, message="three copies of the chain")
    assert running.value("SELECT task_unschedule('nightly')") is True
    steps = running.sql("SELECT plan, stop FROM task WHERE \"group\" = 'nightly.steps' AND state = 'DONE'"
                        " ORDER BY id")
    copies = [(first[0], last[1]) for first, last in zip(steps[::2], steps[1::2])]
    assert len(copies) >= 3, steps
    for earlier, later in zip(copies, copies[1:]):  # each inserted once the one before had ended
        assert later[0] > earlier[1] - timedelta(milliseconds=50), (earlier, later)


def test_upgraded_database_runs_workflows(cluster):
    """The same rules after ALTER EXTENSION UPDATE from 1.2 (tests/test_upgrade.py compares the
    catalogs; this runs a dependency through the upgraded claim)."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        db.sql("ALTER EXTENSION pg_task_py UPDATE")
        db.launcher()
        a = db.insert("SELECT 1", delete=False)
        d = db.insert("SELECT 2", delete=False, after=[a])
        assert db.wait_done(d)["output"] == "2"


@pytest.mark.chaos
def test_dependencies_hold_under_faults():
    """Diamonds and chains under killed workers and task sessions, SIGKILLed launchers and server
    restarts: no dependent runs before its prerequisites have ended (DONE, unless after_any),
    every one whose prerequisite did not end DONE is stopped, and none stays waiting."""
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "17")))
    seconds = float(os.environ.get("CHAOS_SECONDS", "20"))
    with throwaway_cluster() as cluster:
        cluster.create_database("chaos")
        launchers = [Launcher(cluster.dsn("chaos"), args=("--grace", "2")).start() for _ in range(2)]
        try:
            with cluster.connect("chaos") as conn:
                enqueue_workflows(conn, rng)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 1.2))
                launchers = inflict_fault(cluster, launchers, rng)
            conn = wait_until(lambda: try_connect(cluster), 60, 0.2, "the server to accept connections")
            with conn:
                wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')"
                                                ).fetchone()[0] == 0, 120, 0.2, "every task to end")
                check_dependencies(conn)
        finally:
            statuses = [launcher.stop(30) for launcher in launchers]
        assert statuses == [0] * len(statuses), [launcher.output()[-2000:] for launcher in launchers]


def enqueue_workflows(conn, rng: random.Random) -> None:
    inputs = ["SELECT 1"] * 5 + ["SELECT 1/0"] + ["SELECT pg_sleep(0.2)"] * 3

    def add(group: str, after: list[int] | None = None, after_any: bool = False) -> int:
        return conn.execute("INSERT INTO task (input, \"group\", max, after, after_any, delete)"
                            " VALUES (%s, %s, 1, %s, %s, false) RETURNING id",
                            [rng.choice(inputs), group, after, after_any]).fetchone()[0]

    for i in range(150):
        group = f"g{i % 6}"
        a = add(group)
        b, c = add(group, [a]), add(group, [a])
        add(group, [b, c], after_any=rng.random() < 0.3)
    for _ in range(15):
        conn.execute("SELECT task_chain(array_agg(CASE WHEN random() < 0.02 THEN 'SELECT 1/0'"
                     " ELSE 'SELECT pg_sleep(0.05)' END), 'chains') FROM generate_series(1, 20)")


def try_connect(cluster):
    try:
        return cluster.connect("chaos")
    except Exception:  # noqa: BLE001 - the server is restarting
        return None


def inflict_fault(cluster, launchers: list, rng: random.Random) -> list:
    fault = rng.choice(["terminate worker", "terminate task session", "kill launcher", "restart fast",
                        "terminate worker", "terminate task session", "restart immediate"])
    if fault.startswith("terminate"):
        conn = try_connect(cluster)
        if conn is not None:
            with conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
                             " ORDER BY random() LIMIT 1",
                             ["pg_task_py worker" if fault == "terminate worker" else "pg_task_py task"])
    elif fault == "kill launcher":
        victim = rng.choice(launchers)
        victim.signal(signal.SIGKILL)
        victim.process.wait(10)
        launchers = [launcher for launcher in launchers if launcher is not victim]
        launchers.append(Launcher(cluster.dsn("chaos"), args=("--grace", "2")).start())
    else:
        cluster.restart(fault.split()[1])
    return launchers


def check_dependencies(conn) -> None:
    early = conn.execute(
        "SELECT d.id, p.id FROM task AS d CROSS JOIN unnest(d.after) AS a(id) JOIN task AS p ON p.id = a.id"
        " WHERE d.start IS NOT NULL AND (d.start < p.stop OR NOT (d.after_any OR p.state = 'DONE'))").fetchall()
    assert early == [], "dependents that started before their prerequisites ended DONE"
    not_stopped = conn.execute(
        "SELECT d.id, d.state::text FROM task AS d WHERE NOT d.after_any AND d.state <> 'STOP' AND EXISTS ("
        " SELECT FROM unnest(d.after) AS a(id) JOIN task AS p ON p.id = a.id WHERE p.state <> 'DONE')").fetchall()
    assert not_stopped == []
    stopped = conn.execute("SELECT count(*), count(*) FILTER (WHERE error LIKE 'ERROR:  prerequisite task %% ended %%')"
                           " FROM task WHERE state = 'STOP'").fetchone()
    assert stopped[0] == stopped[1] and stopped[0] > 0, stopped
    assert conn.execute("SELECT count(*) FROM pgtaskpy.pending_prerequisite").fetchone()[0] == 0
    ran = conn.execute("SELECT count(*) FROM task WHERE after IS NOT NULL AND state IN ('DONE', 'FAIL')").fetchone()[0]
    assert ran > 0
    print(f"\nchaos with dependencies: {conn.execute('SELECT state::text, count(*) FROM task GROUP BY 1').fetchall()}")


def test_a_task_whose_end_loses_a_deadlock_still_ends_done(running):
    """A transaction that holds a task's row FOR SHARE (as the commit of an INSERT of a task `after`
    it does) and then updates the row, while the task ends: the worker's end, queued for the row,
    and the other's update wait for each other.  The server breaks the cycle by failing one of
    them; when it failed the worker's end, the worker's call failed, and the task, which had
    run, ended FAIL (`pg_task_py worker failed: ERROR:  deadlock detected`).  The end is tried
    again instead (the deadlock rolled back what it had locked)."""
    task = running.insert("SELECT pg_sleep(1)", group="ending", delete=False)
    row = end_in_a_deadlock(running, task, "SELECT FROM task WHERE id = %s FOR SHARE", [task])
    assert (row["state"], row["error"], row["data"]) == ("DONE", None, "touched"), row


def end_in_a_deadlock(running, task, lock, args):
    """While the task runs, another session takes a lock (`lock`, `args`) that the task's end
    will want, waits until the end holds the task's row and waits for that lock, then updates
    the row: a cycle, which the worker (waiting first) finds.  The task's row once it ended."""
    wait_until(lambda: running.task(task)["state"] == "WORK", 20, 0.02, "the task running")
    worker = running.value("SELECT worker FROM task WHERE id = %s", [task])
    with running.connect() as other:
        other.execute("SET deadlock_timeout = '30s'")  # the worker, waiting first, finds the cycle
        other.execute("BEGIN")
        other.execute(lock, args)
        wait_until(lambda: running.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [worker])
                   == "Lock", 20, 0.01, "the task's end to wait for the lock")
        other.execute("UPDATE task SET data = 'touched' WHERE id = %s", [task])  # waits until the worker loses
        other.execute("COMMIT")
    return running.wait_done(task)


def test_a_series_run_whose_next_run_loses_a_deadlock_still_ends_done_and_goes_on(running):
    """The end of a run of a named series plans its next run under the series' lock.  A
    transaction that holds that lock (as task_schedule takes it) and then updates the run's row,
    while the run ends, deadlocks with the end: the end holds the row and waits for the lock.
    When the server failed the end's next run, the run, which had run, ended FAIL with "what
    follows the task failed: deadlock detected", and the series stopped.  The end is written
    again instead, with its next run."""
    task = running.insert("SELECT pg_sleep(1)", group="series_ending", key="deadlocked", repeat="1 hour",
                          delete=False)
    row = end_in_a_deadlock(running, task, "SELECT pgtaskpy.lock_series(current_user, %s)", ["deadlocked"])
    assert (row["state"], row["error"], row["data"]) == ("DONE", None, "touched"), row
    assert running.value("SELECT count(*) FROM task WHERE parent = %s AND state = 'PLAN'", [task]) == 1
