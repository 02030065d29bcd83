"""pg_task's time and group rules through the real launcher: repeat, drift, active, timeout,
pauses, priority, worker reuse, STOP, and tasks of dead backends."""

import re
import signal
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from pg_task_py_testing import Launcher, insert_as, throwaway_cluster, wait_until


def state_of(db, task_id):
    return db.value("SELECT state::text FROM task WHERE id = %s", [task_id])


def series(db, first):
    """The rows of a repeat series, first run first."""
    return db.sql("WITH RECURSIVE s AS (SELECT * FROM task WHERE id = %s"
                  " UNION ALL SELECT t.* FROM task t JOIN s ON t.parent = s.id)"
                  " SELECT id, parent, plan, start, stop, state::text FROM s ORDER BY id", [first])


def test_repeat_chain_keeps_its_plan_grid(running):
    first = running.insert("SELECT 1", repeat="0.4 s", delete=False)
    wait_until(lambda: sum(r[5] == "DONE" for r in series(running, first)) >= 3, 15, 0.05, "3 runs")
    running.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")  # a user ends the series
    rows = series(running, first)
    assert [r[1] for r in rows[1:]] == [r[0] for r in rows[:-1]]  # each run's parent is the run before
    assert running.value("SELECT count(*) - count(DISTINCT parent) FROM task WHERE parent IS NOT NULL") == 0
    for earlier, later in zip(rows, rows[1:]):
        step = (later[2] - earlier[2]) / timedelta(seconds=0.4)
        assert step == round(step) >= 1  # plan + k * repeat, on the first run's grid
    count = len(series(running, first))
    running.wait_all_done()
    assert len(series(running, first)) == count  # STOP ended the series


def test_columns_a_user_added_go_to_the_next_run_and_the_retries(running):
    """pg_task lets a user add the columns they need to the task table, and copies them into a
    task's next run: they were NULL (or their default) there, and in every retry (a probe)."""
    running.sql("ALTER TABLE task ADD COLUMN customer text, ADD COLUMN region text DEFAULT 'eu'")
    try:
        assert running.value("SELECT count(*) FROM pg_attribute WHERE attrelid = 'task'::regclass AND attnum > 0"
                             " AND NOT attisdropped AND attname <> ALL (pgtaskpy.own_columns())") == 2
        series_run = running.insert("SELECT 1", repeat="1 hour", customer="acme", region="us", delete=False)
        failing = running.insert("SELECT 1/0", retry=1, retry_delay="1 hour", retry_on="{22012}", customer="bolt",
                                 region="us", delete=False)
        for first in (series_run, failing):
            running.wait_done(first)
            follower = wait_until(lambda first=first: running.value("SELECT id FROM task WHERE parent = %s", [first]),
                                  10, 0.02, "the next run or the retry")
            assert running.sql("SELECT customer, region FROM task WHERE id = %s", [follower]) == \
                running.sql("SELECT customer, region FROM task WHERE id = %s", [first]), follower
        running.sql("UPDATE task SET state = 'STOP' WHERE parent = %s", [failing])
        again = running.value("SELECT task_retry(%s)", [failing])  # (a copy by hand, as the caller)
        assert running.sql("SELECT customer, region FROM task WHERE id = %s", [again]) == [("bolt", "us")]
    finally:
        running.sql("DELETE FROM task")
        running.sql("ALTER TABLE task DROP COLUMN customer, DROP COLUMN region")
    # On the table as the extension makes it, every column is its own.
    assert running.value("SELECT count(*) FROM pg_attribute WHERE attrelid = 'task'::regclass AND attnum > 0"
                         " AND NOT attisdropped AND attname <> ALL (pgtaskpy.own_columns())") == 0


def test_a_run_that_truncate_restart_identity_removed_never_ends_the_new_task_of_its_id(running):
    """TRUNCATE task RESTART IDENTITY under a running task (README: its run goes on, unseen): a new
    task given the same id, run by another worker, got the old run's end and output as its own,
    DONE while it ran (a probe; another role's, and a series' next run overlapped its run)."""
    old = running.insert("SELECT 'old' FROM pg_sleep(1)", group="old", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [old]) == "WORK", 10, 0.01,
               "the old task to run")
    running.sql("TRUNCATE task RESTART IDENTITY")
    new = running.insert("SELECT 'new' FROM pg_sleep(3)", group="new", delete=False)
    assert new == old
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [new]) == "WORK", 10, 0.01,
               "the new task to run")
    row = running.wait_done(new, 10)  # (the old run ends 2 s before it: its end was written here)
    assert (row["state"], row["output"]) == ("DONE", "new"), row
    assert row["stop"] - row["start"] >= timedelta(seconds=3), row


def test_drift_plans_from_the_stop(running):
    first = running.insert("SELECT pg_sleep(0.3)", repeat="0.2 s", drift=True, delete=False)
    wait_until(lambda: len(series(running, first)) >= 3, 15, 0.05, "3 runs")
    running.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")
    rows = series(running, first)
    for earlier, later in zip(rows[:2], rows[1:3]):
        assert later[2] - earlier[4] == timedelta(seconds=0.2)  # next plan = stop + repeat


def test_task_not_started_within_active_is_gone_and_repeats(running):
    task_id = running.value("INSERT INTO task (plan, active, repeat, input, delete)"
                            " VALUES (now() - interval '10 s', '1 s', '1 hour', 'SELECT 1', false) RETURNING id")
    row = running.wait_done(task_id, 10)
    assert (row["state"], row["error"], row["start"]) == ("GONE", "ERROR:  task not active", None)
    assert state_of(running, running.value("SELECT id FROM task WHERE parent = %s", [task_id])) == "PLAN"


def test_tasks_expired_in_bulk_end_gone_within_seconds_and_what_follows_them_follows(db):
    """20,000 tasks past `active` (a launcher that was down longer): they end GONE a batch each
    turn, 10 ms apart, not a batch a second (which took 20 s here), each counted in task_stats.
    A series' run among them is followed by its next run, a dependent of one stops."""
    db.sql("INSERT INTO task (input, plan, active) SELECT 'SELECT 1', now() - interval '2 hours', '1 hour'"
           " FROM generate_series(1, 20000)")
    series = db.value("INSERT INTO task (plan, active, repeat, input, delete)"
                      " VALUES (now() - interval '2 hours', '1 hour', '1 day', 'SELECT 1', false) RETURNING id")
    prerequisite = db.value("SELECT min(id) FROM task")
    dependent = db.insert("SELECT 'never'", after=[prerequisite])
    started = time.monotonic()
    launcher = db.launcher()
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'GONE'") == 20001, 60, 0.2,
               "every expired task GONE")
    took = time.monotonic() - started
    assert took < 12, took
    assert db.value("SELECT error FROM task WHERE id = %s", [prerequisite]) == "ERROR:  task not active"
    assert db.value("SELECT count(*) FROM task WHERE parent = %s AND state = 'PLAN'", [series]) == 1
    row = db.wait_done(dependent, 10)
    assert (row["state"], row["error"]) == ("STOP", f"ERROR:  prerequisite task {prerequisite} ended GONE")
    wait_until(lambda: db.value("SELECT gone_1h = 20001 AND gone_total = 20001 FROM task_stats"
                                " WHERE \"group\" = 'group'"), 10, 0.1, "task_stats to count every GONE")
    assert launcher.stop() == 0, launcher.output()


def test_timeout_cancels_a_long_task(running):
    row = running.wait_done(running.insert("SELECT pg_sleep(10)", timeout="0.3 s"), 10)
    assert row["state"] == "FAIL"
    assert row["error"] == "ERROR:  canceling statement due to statement timeout\nSTATEMENT:  SELECT pg_sleep(10)"
    assert (row["stop"] - row["start"]).total_seconds() < 3


def test_negative_max_pauses_between_tasks(running):
    """One at a time, each -max ms after the previous one's plan (or its stop, with drift)."""
    for group, drift in (("plans", False), ("stops", True)):
        running.sql("INSERT INTO task (\"group\", max, drift, input, delete)"
                    " SELECT %s, -700, %s, 'SELECT pg_sleep(0.1)', false FROM generate_series(1, 3)", [group, drift])
    running.wait_all_done(20)
    for group, anchor in (("plans", 0), ("stops", 2)):
        rows = running.sql("SELECT plan, start, stop FROM task WHERE \"group\" = %s ORDER BY start", [group])
        assert all(start >= plan for plan, start, _ in rows)
        for earlier, later in zip(rows, rows[1:]):
            assert later[0] - earlier[anchor] == timedelta(seconds=0.7), group
            assert later[1] >= earlier[2]  # one at a time
        starts = [r[1] for r in rows]
        assert all((b - a).total_seconds() < 3 for a, b in zip(starts, starts[1:]))


def test_negative_max_keeps_its_pause_in_a_group_running_late(running):
    """Without drift, the next task waited until the previous one's plan + the pause, which a
    group running late had passed: three tasks behind a long one ran 10 ms apart (a probe).  The
    pause is counted on from the plan, as a repeat's next run is: the first multiple still ahead."""
    running.sql("INSERT INTO task (\"group\", max, input, delete)"
                " VALUES ('late', -1000, 'SELECT pg_sleep(2.5)', false)")
    running.sql("INSERT INTO task (\"group\", max, input, delete)"
                " SELECT 'late', -1000, 'SELECT 1', false FROM generate_series(1, 3)")
    running.wait_all_done(30)
    rows = running.sql("SELECT plan, start, stop FROM task WHERE \"group\" = 'late' ORDER BY start")
    first_plan = rows[0][0]
    for earlier, later in zip(rows, rows[1:]):
        assert later[1] >= earlier[2] and later[1] - earlier[1] >= timedelta(seconds=0.9), rows
        assert (later[0] - first_plan) % timedelta(seconds=1) == timedelta(0), rows  # (on the group's beat)


def test_negative_max_pauses_before_a_dependent_its_task_released(running):
    """A task of a paused group (max < 0) that released a dependent of the same group: the
    dependent ran 10 ms after it, the pause applied only to the group's tasks already due (a
    probe).  It waits the pause too."""
    root = running.insert("SELECT 'root'", group="paused chain", max=-1500, delete=False)
    child = running.insert("SELECT 'child'", group="paused chain", max=-1500, after=[root], delete=False)
    first, second = running.wait_done(root), running.wait_done(child)
    # (without drift the pause counts from the task's plan: its first multiple still ahead)
    assert second["start"] >= first["plan"] + timedelta(seconds=1.5), (first, second)


def test_negative_max_pauses_tasks_that_come_due_during_the_pause(running):
    """A task inserted into a group in its pause (max < 0), or moved into it, ran at once: the
    pause moved only the tasks waiting as it began.  It waits for the pause's end too, an
    exclusive one as well; one of the group with a max of its own (>= 0) has no pause."""
    first = running.wait_done(running.insert("SELECT 'first'", group="spaced", max=-3000, drift=True, delete=False))
    inserted = running.insert("SELECT 'inserted'", group="spaced", max=-3000, drift=True, delete=False)
    exclusive = running.insert("SELECT 'exclusive'", group="spaced", max=-3000, drift=True, delete=False,
                               exclusive=True)
    moved = running.insert("SELECT 'moved'", group="elsewhere", max=-3000, drift=True, delete=False,
                           plan=datetime.now(timezone.utc) + timedelta(hours=1))
    running.sql("UPDATE task SET \"group\" = 'spaced', plan = now() WHERE id = %s", [moved])
    unpaused = running.wait_done(running.insert("SELECT 'max 2'", group="spaced", max=2, delete=False))
    assert unpaused["start"] < first["stop"] + timedelta(seconds=3), (first, unpaused)
    rows = sorted((running.wait_done(t, 30) for t in (inserted, exclusive, moved)), key=lambda r: r["start"])
    assert [r["state"] for r in rows] == ["DONE"] * 3, rows
    assert rows[0]["start"] >= first["stop"] + timedelta(seconds=3), (first, rows)  # (drift: from its stop)
    for earlier, later in zip(rows, rows[1:]):
        assert later["start"] >= earlier["stop"] + timedelta(seconds=3), rows  # (and each waits its own)


def test_a_client_holding_a_task_of_a_paused_group_holds_back_that_task_alone(running):
    """The end of a task of a negative max moved its group's waiting tasks under the scheduling
    lock, waiting for a row a client held (SELECT ... FOR UPDATE, a task author's open UPDATE):
    every launcher turn and every role's task waited for that client (a probe).  The held task is
    passed over, its plan unchanged, and waits for the pause's end all the same."""
    plan = datetime.now(timezone.utc) + timedelta(seconds=1)
    held, first = (running.insert(f"SELECT '{name}'", group="spaced and held", max=-3000, plan=plan, delete=False)
                   for name in ("held", "first"))
    with running.connect() as client:
        client.autocommit = False
        client.execute("SELECT FROM task WHERE id = %s FOR UPDATE", [held])
        assert running.wait_done(first, 20)["state"] == "DONE"
        other = running.wait_done(running.insert("SELECT 'other'", group="another", delete=False), 20)
        assert other["state"] == "DONE", other
        client.commit()
    row = running.wait_done(held, 20)
    assert (row["state"], row["output"]) == ("DONE", "held"), row
    assert row["start"] >= running.task(first)["plan"] + timedelta(seconds=3), row  # (its pause, from that plan)


def test_negative_max_pauses_only_after_a_task_that_ran(running):
    """A task of the group that went GONE, never started, paused the group as a run does."""
    gone = running.wait_done(running.insert("SELECT 'late'", group="gone pause", max=-60000, delete=False,
                                            plan=datetime.now(timezone.utc) - timedelta(hours=1), active="1 min"))
    assert gone["state"] == "GONE", gone
    after = running.wait_done(running.insert("SELECT 'next'", group="gone pause", max=-60000, delete=False), 30)
    assert (after["state"], after["output"]) == ("DONE", "next"), after


def test_negative_max_keeps_its_pause_after_a_task_that_came_due_during_one(running):
    """Without drift, the pause after a task counted from its plan: one that came due during a
    pause keeps its plan, and the pause after it was over 0.14 s after it ran (a review).  It
    counts from the end of the pause the task waited for."""
    first = running.wait_done(running.insert("SELECT 'first'", group="beat", max=-3000, delete=False))
    second = running.wait_done(running.insert("SELECT 'second'", group="beat", max=-3000, delete=False), 20)
    third = running.wait_done(running.insert("SELECT 'third'", group="beat", max=-3000, delete=False), 20)
    assert second["start"] >= first["plan"] + timedelta(seconds=2.9), (first, second)
    assert third["start"] >= second["start"] + timedelta(seconds=2), (second, third)


def test_a_task_its_groups_pause_holds_is_counted_later_not_due(running):
    """task_stats and the metrics counted a task held by its group's pause (max < 0) as due and
    late: an hourly group's lateness alert fired for a task held on purpose (a review)."""
    running.wait_done(running.insert("SELECT 'ran'", group="hourly", max=-600000, delete=False))
    held = running.insert("SELECT 'held'", group="hourly", max=-600000, delete=False)
    try:
        wait_until(lambda: running.value("SELECT now() - plan > interval '1 s' FROM task WHERE id = %s", [held]),
                   10, 0.1, "the held task's plan to pass")
        assert running.sql("SELECT due, later, oldest_due_lateness FROM task_stats WHERE \"group\" = 'hourly'") == [
            (0, 1, None)]
        assert running.value("SELECT pgtaskpy.metrics_snapshot(now(), 100)->>'due_groups'") == "0"
    finally:
        running.sql("SELECT task_cancel(%s)", [held])


def test_higher_max_starts_beside_the_running_ones(running):
    # The six run until the test lets them end (a fixed sleep of theirs could end first on a busy machine).
    with running.connect() as gate:
        gate.execute("SELECT pg_advisory_lock(4244)")
        running.sql("INSERT INTO task (max, input, delete) SELECT 1, 'SELECT pg_advisory_xact_lock_shared(4244)',"
                    " false FROM generate_series(1, 6)")
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 2, message="2 running")
        urgent = running.insert("SELECT 'urgent'", max=2, delete=False)
        row = running.wait_done(urgent, 10)  # (beside the two, which run on: it did not wait for them)
        assert (row["state"], row["output"]) == ("DONE", "urgent"), row
        assert running.value("SELECT count(*) FROM task WHERE max = 1 AND state = 'WORK'") == 2
    running.wait_all_done(30)


def test_count_reuses_one_session_for_the_group(running):
    running.sql("INSERT INTO task (count, input, delete) SELECT 10, 'SELECT pg_backend_pid()', false"
                " FROM generate_series(1, 4)")
    running.wait_all_done()
    pids = running.sql("SELECT pid, output FROM task")
    assert len({pid for pid, _ in pids}) == 1
    assert all(output == str(pid) for pid, output in pids)


def test_a_save_session_that_listens_keeps_its_state_when_notified_between_tasks(running):
    """A notification waiting on a kept session's socket was taken for the server's end of it: the
    next task ran in a new session, without the first one's temporary table (a probe: 2 of 2)."""
    a = running.insert("LISTEN kept_news; CREATE TEMP TABLE kept AS SELECT 42 AS v", count=5, save=True, group="l",
                       delete=False)
    assert running.wait_done(a)["state"] == "DONE"
    running.sql("NOTIFY kept_news")
    b = running.insert("SELECT v FROM kept", count=5, save=True, group="l", delete=False)
    row = running.wait_done(b)
    assert (row["state"], row["output"], row["pid"]) == ("DONE", "42", running.task(a)["pid"]), row


def test_a_reused_session_never_brings_another_tasks_settings_back(running):
    """In a group of a one-off task then `count` tasks, the session started ahead with the second
    task's settings was kept for the third, whose RESET ALL brought the second's id and timeout
    back (a child it inserted would have had the second as `parent`; a probe: 3 of 3)."""
    with running.connect() as conn, conn.transaction():
        insert_as(conn, "SELECT pg_sleep(0.3)", group="m", delete=False)
        second = insert_as(conn, "SELECT 1", count=5, timeout="7 s", group="m", delete=False)
        third = insert_as(conn, "RESET ALL; SELECT current_setting('pg_task.id', true) AS id,"
                                " current_setting('statement_timeout') AS timeout", count=5, group="m", delete=False)
    running.wait_all_done()
    row = running.task(third)
    assert row["state"] == "DONE" and running.task(second)["pid"] == row["pid"], row  # (one session)
    task_id, timeout = row["output"].split("\n")[-1].split("\t")
    assert task_id != str(second) and timeout != "7s", row


def test_save_keeps_session_state_for_the_next_task(running):
    a = running.insert("CREATE TEMP TABLE kept AS SELECT 42 AS v", count=2, save=True, group="s", delete=False)
    b = running.insert("SELECT v FROM kept", count=2, save=True, group="s", delete=False)
    assert running.wait_done(a)["state"] == "DONE"
    assert running.wait_done(b)["output"] == "42"
    c = running.insert("CREATE TEMP TABLE gone AS SELECT 1 AS v", count=2, group="d", delete=False)
    d = running.insert("SELECT v FROM gone", count=2, group="d", delete=False)
    running.wait_done(c)
    row = running.wait_done(d)
    assert row["state"] == "FAIL" and 'relation "gone" does not exist' in row["error"]
    assert running.task(c)["pid"] == row["pid"]  # same session, reset between the tasks


def test_stop_prevents_a_waiting_task(running):
    task_id = running.value("INSERT INTO task (plan, input, delete) VALUES (now() + interval '1 s', 'SELECT 1', false)"
                            " RETURNING id")
    running.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [task_id])
    running.wait_done(running.value("INSERT INTO task (plan, input, delete) VALUES (now() + interval '1.5 s',"
                                    " 'SELECT 2', false) RETURNING id"))
    assert state_of(running, task_id) == "STOP"


def test_enqueue_wait_and_cancel(running):
    task_id = running.value("SELECT task_enqueue('SELECT 40 + 2', \"group\" => 'api')")
    assert running.value("SELECT (task_wait(%s)).output", [task_id]) == "42"
    later = running.value("SELECT task_enqueue('SELECT 1', plan => now() + interval '1 hour')")
    assert running.value("SELECT task_cancel(%s)", [later]) is True
    assert state_of(running, later) == "STOP"
    long = running.value("SELECT task_enqueue('SELECT pg_sleep(30)', \"group\" => 'long')")
    wait_until(lambda: state_of(running, long) == "WORK", message="WORK")
    assert running.value("SELECT task_cancel(%s)", [long]) is True
    row = running.wait_done(long, 10)
    assert row["state"] == "FAIL" and row["error"].startswith("ERROR:  canceling statement due to user request")


def test_claimed_task_of_a_dead_launcher_runs_again(running):
    task_id = running.value("INSERT INTO task (plan, input, delete) VALUES (now() + interval '1 hour', 'SELECT 1',"
                            " false) RETURNING id")
    running.sql("UPDATE task SET state = 'TAKE', worker = 2147483647, plan = now() WHERE id = %s", [task_id])
    row = running.wait_done(task_id, 10)
    assert row["state"] == "DONE" and row["output"] == "1"


def test_working_task_of_a_dead_worker_fails_and_repeats(running):
    task_id = running.value("INSERT INTO task (plan, repeat, input, delete) VALUES"
                            " (now() + interval '1 hour', '1 hour', 'SELECT 1', false) RETURNING id")
    running.sql("UPDATE task SET state = 'WORK', worker = 2147483647, start = now() WHERE id = %s", [task_id])
    row = running.wait_done(task_id, 10)
    assert row["state"] == "FAIL"
    assert row["error"].startswith("ERROR:  task worker ended before the task finished")
    assert running.value("SELECT count(*) FROM task WHERE parent = %s AND state = 'PLAN'", [task_id]) == 1


def test_a_dead_workers_task_ends_once_its_session_has(running):
    """The worker is its session's only client, but the session would run on (and commit) after the
    worker died: the scheduler terminates it, and the run reads FAIL only once it is gone."""
    running.sql("CREATE TABLE marks (v int)")
    task_id = running.insert("SELECT pg_sleep(5); INSERT INTO marks VALUES (1)", delete=False)
    wait_until(lambda: state_of(running, task_id) == "WORK", message="WORK")
    session = running.task(task_id)["pid"]
    running.sql("SELECT pg_terminate_backend(worker) FROM task WHERE id = %s", [task_id])
    row = running.wait_done(task_id, 10)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006")
    assert running.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [session]) == 0
    assert running.value("SELECT count(*) FROM marks") == 0  # (its session is gone: it never will)


def test_sigkill_of_the_launcher_loses_nothing(db):
    launcher = db.launcher()
    task_id = db.insert("SELECT pg_sleep(1)", delete=False)
    wait_until(lambda: state_of(db, task_id) == "WORK", message="WORK")
    launcher.signal(signal.SIGKILL)
    launcher.process.wait(10)
    assert db.wait_done(task_id, 10)["state"] == "DONE"  # its worker backend finished it alone
    waiting = db.insert("SELECT 'after'", delete=False)
    db.launcher()
    assert db.wait_done(waiting)["output"] == "after"
    assert db.value("SELECT count(*) FROM task WHERE state IN ('TAKE', 'WORK')") == 0


def test_live_reuses_one_session_for_a_while(running):
    running.sql("INSERT INTO task (live, input, delete) SELECT '10 s', 'SELECT pg_backend_pid()', false"
                " FROM generate_series(1, 3)")
    running.wait_all_done()
    assert running.value("SELECT count(DISTINCT pid) FROM task") == 1


def test_server_level_setting_is_a_default(running, cluster):
    """postgresql.conf (ALTER SYSTEM refuses settings of no loaded module, so the file itself)."""
    conf = cluster.data / "postgresql.conf"
    original = conf.read_text()
    conf.write_text(original + "pg_task.count = 7\n")
    running.sql("SELECT pg_reload_conf()")
    try:
        with cluster.connect(running.name) as conn:
            wait_until(lambda: conn.execute("SELECT current_setting('pg_task.count', true)").fetchone()[0] == "7",
                       message="the reload")
            assert conn.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', '9999-12-31')"
                                " RETURNING count").fetchone() == (7,)
            conn.execute(f"ALTER DATABASE {running.name} SET pg_task.count = 8")
        with cluster.connect(running.name) as conn:  # the database's setting beats the file's
            assert conn.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', '9999-12-31')"
                                " RETURNING count").fetchone() == (8,)
    finally:
        conf.write_text(original)
        running.sql("SELECT pg_reload_conf()")


def test_retention_deletes_old_finished_tasks(running):
    old = running.insert("SELECT 1", delete=False)
    running.wait_done(old)
    running.sql("UPDATE task SET stop = now() - interval '2 days' WHERE id = %s", [old])
    recent = running.wait_done(running.insert("SELECT 2", delete=False))
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention = '1 day'")
    try:
        wait_until(lambda: running.task(old) is None, 10, message="the old task to be deleted")
        assert running.task(recent["id"]) is not None
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.retention")


def test_retention_keeps_the_tasks_other_tables_reference_and_deletes_the_rest(running):
    """A finished task that another table references by a foreign key without ON DELETE
    CASCADE or SET NULL cannot be deleted, and the server fails any deletion it is part of:
    that failed the launcher's turn, every turn (no task of the database started any more),
    then kept every row retention or keep_runs would delete.  Now such a task is kept, the others
    go, the launcher says how many it kept, and a task whose reference is gone goes in the next
    pass.  A deferred key is checked at the deletion, not at the launcher's commit."""
    running.sql("CREATE TABLE job (task_id bigint REFERENCES task (id))")
    running.sql("CREATE TABLE audit (task_id bigint REFERENCES task (id) DEFERRABLE INITIALLY DEFERRED)")
    old = [running.wait_done(running.insert(f"SELECT {i}", delete=False))["id"] for i in range(6)]
    runs = [running.value("INSERT INTO task (input, state, stop, key, delete) VALUES"
                          " ('SELECT 1', 'DONE', now() - %s * interval '1 minute', 'nightly', false) RETURNING id",
                          [i]) for i in range(4)]  # newest first
    running.sql("INSERT INTO job VALUES (%s), (%s)", [old[0], runs[2]])
    running.sql("INSERT INTO audit VALUES (%s)", [old[3]])
    running.sql("UPDATE task SET stop = now() - interval '2 days' + id * interval '1 ms' WHERE id = ANY (%s)", [old])
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention = '1 day'")
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.keep_runs = 1")
    present = "SELECT array_agg(id ORDER BY id) FROM task WHERE id = ANY (%s)"
    try:
        launcher = running.launchers[0]
        wait_until(lambda: running.value(present, [old]) == [old[0], old[3]], 15,
                   message="the unreferenced old tasks to be deleted")
        wait_until(lambda: running.value(present, [runs]) == sorted([runs[0], runs[2]]), 15,
                   message="the series cut to its newest run and the referenced one")
        wait_until(lambda: "kept " in launcher.output(), 10, message="the launcher's word on the kept tasks")
        assert "other tables reference them by a foreign key" in launcher.output()
        assert running.wait_done(running.insert("SELECT 2", delete=False), 10)["state"] == "DONE"
        running.sql("DELETE FROM job")
        wait_until(lambda: running.value(present, [old]) == [old[3]], 30,
                   message="the task no longer referenced to be deleted in the next pass")
        assert running.value(present, [runs]) == [runs[0]]
        assert "scheduler error" not in launcher.output(), launcher.output()
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.retention")
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.keep_runs")


def test_a_client_holding_a_row_that_retention_cascades_to_holds_back_no_task(running):
    """Retention's deletion of a finished task cascades to the rows that reference it ON DELETE
    CASCADE, another table's, which a client may hold (here FOR UPDATE in an open transaction).
    Housekeeping waited for that client while it held the scheduling lock: no task of any role
    started for as long (a probe).  The task is kept for a later pass, and the others go."""
    running.sql("CREATE TABLE mine (task_id bigint REFERENCES task (id) ON DELETE CASCADE)")
    old = [running.wait_done(running.insert(f"SELECT {i}", delete=False))["id"] for i in range(3)]
    running.sql("INSERT INTO mine VALUES (%s)", [old[0]])
    running.sql("UPDATE task SET stop = now() - interval '2 days' + id * interval '1 ms' WHERE id = ANY (%s)", [old])
    present = "SELECT array_agg(id ORDER BY id) FROM task WHERE id = ANY (%s)"
    with running.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT * FROM mine FOR UPDATE")  # (its transaction left open)
        running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention = '1 day'")
        try:
            wait_until(lambda: running.value(present, [old]) == [old[0]], 15,
                       message="the old tasks no client holds a referencing row of to be deleted")
            row = running.wait_done(running.insert("SELECT 'on time'", delete=False), 10)
            assert (row["state"], row["output"]) == ("DONE", "on time"), row
            holder.execute("ROLLBACK")
            wait_until(lambda: running.value(present, [old]) is None, 30,
                       message="the held task to be deleted once its client let go")
            assert running.value("SELECT count(*) FROM mine") == 0
        finally:
            running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.retention")
    assert "scheduler error" not in running.launchers[0].output(), running.launchers[0].output()


def test_several_launchers_share_the_work_and_run_each_task_once(db):
    db.sql("CREATE TABLE audit (task_id bigint PRIMARY KEY)")
    # 5 groups of max 2 have 15 slots; no launcher may fill more than 5, so all
    # of them take part, however fast one launcher's workers go on with their groups.
    for _ in range(3):
        db.launcher("--run", "5")
    db.sql("INSERT INTO task (\"group\", max, input, delete)"
           " SELECT 'g' || (i % 5), 2, 'INSERT INTO audit VALUES (current_setting(''pg_task.id'')::bigint)', false"
           " FROM generate_series(1, 300) AS i")
    db.wait_all_done(60)
    assert db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 300
    assert db.value("SELECT count(*) FROM audit") == 300
    sharing = [launcher for launcher in db.launchers if " started" in launcher.output()]
    assert len(sharing) >= 2  # they share the work (each claim is exclusive, so no task ran twice)


def test_a_cancel_the_moment_a_task_starts_is_not_lost(running):
    # The task is WORK a moment before its input reaches its session; task_cancel waits for it.
    for _ in range(8):
        task_id = running.value("SELECT task_enqueue('SELECT pg_sleep(30)')")
        wait_until(lambda task_id=task_id: state_of(running, task_id) == "WORK", interval=0.001, message="WORK")
        assert running.value("SELECT task_cancel(%s)", [task_id]) is True
        row = running.wait_done(task_id, 10)
        assert (row["state"], row["sqlstate"]) == ("FAIL", "57014"), row["error"]


def test_tasks_that_an_open_transaction_references_by_a_foreign_key_start_all_the_same(running):
    """An application's table that references tasks by a foreign key locks each referenced task's
    row FOR KEY SHARE until the inserting transaction ends.  That lock holds back no claim or
    start (which change no key).  A worker's take of its task locked the row FOR UPDATE and waited
    for the application's commit, the task held in TAKE all that time; and a worker going on with
    its group skipped a referenced task (FOR UPDATE SKIP LOCKED), running the next one first."""
    running.sql("CREATE TABLE job (task_id bigint REFERENCES task (id))")
    running.sql("INSERT INTO task (\"group\", plan, input, delete)"
                " SELECT CASE WHEN i <= 6 THEN 'one at a time' ELSE 'g' || i END, now() + interval '2 s', 'SELECT 1',"
                " false FROM generate_series(1, 46) AS i")
    with running.connect() as application, application.transaction(force_rollback=True):
        application.execute("INSERT INTO job SELECT id FROM task WHERE id % 2 = 0")  # (open while the tasks run)
        running.wait_all_done(30)
        assert running.sql("SELECT state::text, count(*) FROM task GROUP BY 1") == [("DONE", 46)]
    in_group = running.sql("SELECT id FROM task WHERE \"group\" = 'one at a time' ORDER BY start")
    assert [row[0] for row in in_group] == sorted(row[0] for row in in_group)


def test_a_waiting_task_a_client_holds_does_not_hold_back_other_groups(running):
    """A client's lock on a due task's row (SELECT ... FOR UPDATE, or an open transaction's
    UPDATE or task_schedule) holds back that task only: the launcher's claim skips the row,
    where it waited for it holding the scheduling lock, and every group waited with it."""
    held = running.insert("SELECT 'held'", plan=running.value("SELECT now() + interval '1 s'"), delete=False,
                          group="held")
    with running.connect() as client, client.transaction():
        client.execute("SELECT id FROM task WHERE id = %s FOR UPDATE", [held])
        wait_until(lambda: running.value("SELECT plan < now() - interval '0.3 s' FROM task WHERE id = %s", [held]),
                   10, 0.02, "the held task to be due")
        other = running.wait_done(running.insert("SELECT 'other'", delete=False, group="other"), 10)
        assert (other["state"], other["output"]) == ("DONE", "other"), other
        assert other["start"] - other["plan"] < timedelta(seconds=3), other
        assert state_of(running, held) == "PLAN"  # its client still holds it
    row = running.wait_done(held, 10)  # and it runs once the client lets go
    assert (row["state"], row["output"]) == ("DONE", "held"), row


def test_a_clients_open_update_of_a_running_tasks_data_does_not_move_its_stop(running):
    task_id = running.insert("SELECT pg_sleep(0.5)", delete=False)
    wait_until(lambda: state_of(running, task_id) == "WORK", 10, 0.01, "the task to run")
    with running.connect() as client, client.transaction():
        client.execute("UPDATE task SET data = 'progress' WHERE id = %s", [task_id])  # (open till the block ends)
        wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                         " AND application_name = pgtaskpy.name_of('worker')"), 10, 0.02,
                   "the task's end to wait for the client's lock")
        time.sleep(3.0)  # (the client holds the row that long: what stop must not count)
    row = running.wait_done(task_id)
    assert row["state"] == "DONE" and row["data"] == "progress", row
    assert row["stop"] - row["start"] < timedelta(seconds=2), row  # (with the hold: 3.5 s and more)
    logged = wait_until(lambda: re.search(rf"task {task_id} DONE in ([0-9.]+)s", running.launchers[-1].output()),
                        10, 0.05, "the task's end in the launcher's log")
    assert float(logged[1]) < 2, logged[0]  # (nor the seconds the launcher logs, which counted the hold)


def test_a_lost_task_a_client_holds_does_not_hold_back_other_tasks(running):
    """A worker and its task's session die together (terminated) while a client holds the task's
    row (SELECT ... FOR UPDATE).  The launcher ending the lost task FAIL as it collected the failed
    call waited for the row in its turn, and no task of any role started until the client let
    go; now recovery ends it once the client has."""
    lost = running.insert("SELECT pg_sleep(60)", delete=False, group="lost")
    wait_until(lambda: state_of(running, lost) == "WORK", 10, 0.01, "the task to run")
    worker, session = running.sql("SELECT worker, pid FROM task WHERE id = %s", [lost])[0]
    with running.connect() as client, client.transaction():
        client.execute("SELECT id FROM task WHERE id = %s FOR UPDATE", [lost])
        running.sql("SELECT pg_terminate_backend(%s), pg_terminate_backend(%s)", [session, worker])
        wait_until(lambda: running.value("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid IN (%s, %s)",
                                         [session, worker]), 10, 0.01, "the worker and the session gone")
        other = running.wait_done(running.insert("SELECT 'other'", delete=False, group="other"), 10)
        assert (other["state"], other["output"]) == ("DONE", "other"), other
        assert other["start"] - other["plan"] < timedelta(seconds=3), other
        assert state_of(running, lost) == "WORK"  # its client still holds it
    row = running.wait_done(lost, 10)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row


def test_a_claimed_task_a_client_holds_does_not_hold_back_recovery(running):
    """A TAKE task whose claimer died, its row held by a client (SELECT ... FOR UPDATE): recovery's
    unclaim waited for the row in the launcher's turn, holding the scheduling lock, and no task of
    any role started until the client let go."""
    held = running.insert("SELECT 'held'", plan=running.value("SELECT now() + interval '1 hour'"), delete=False)
    with running.connect() as client:
        client.autocommit = False

        def claimed_and_held() -> bool:
            # (recovery may take it back between the two statements: then again)
            running.sql("UPDATE task SET state = 'TAKE', worker = 1 WHERE id = %s", [held])  # (claimed by no backend)
            if client.execute("SELECT state::text FROM task WHERE id = %s FOR UPDATE", [held]).fetchone()[0] == "TAKE":
                return True
            client.rollback()
            return False

        wait_until(claimed_and_held, 10, 0.01, "the claimed task held by the client")
        other = running.wait_done(running.insert("SELECT 'other'", delete=False, group="other"), 10)
        assert (other["state"], other["output"]) == ("DONE", "other"), other
        time.sleep(1.5)  # (a housekeeping second: recovery skips the held row, and comes back to it)
        assert state_of(running, held) == "TAKE"
        later = running.wait_done(running.insert("SELECT 'later'", delete=False, group="other"), 10)
        assert (later["state"], later["output"]) == ("DONE", "later"), later
        client.rollback()
    wait_until(lambda: state_of(running, held) == "PLAN", 10, 0.05, "recovery to take the task back")


def test_a_task_inserted_in_a_prepared_transaction_runs_after_commit_prepared():
    """Two-phase commit (XA, JTA): a transaction that has sent NOTIFY cannot PREPARE, and every
    insert of a task sent one to wake the launchers.  With pg_task_py.wake off, it sends none,
    and the task starts at the launcher's next look, within a second or so of COMMIT PREPARED."""
    with throwaway_cluster({"max_prepared_transactions": "2"}) as cluster:
        cluster.create_database("xa")
        launcher = Launcher(cluster.dsn("xa")).start()
        try:
            launcher.wait_active()
            with cluster.connect("xa") as conn:  # (autocommit: the statements say where transactions go)
                conn.execute("BEGIN")
                conn.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
                with pytest.raises(psycopg.errors.FeatureNotSupported, match="NOTIFY"):
                    conn.execute("PREPARE TRANSACTION 'woken'")
                conn.execute("ROLLBACK")
                conn.execute("BEGIN")
                conn.execute("SET LOCAL pg_task_py.wake = off")
                task_id = conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                                       ["SELECT 'prepared'"]).fetchone()[0]
                conn.execute("PREPARE TRANSACTION 'quiet'")
                conn.execute("COMMIT PREPARED 'quiet'")
                committed = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                done = "SELECT state = 'DONE' FROM task WHERE id = %s"
                wait_until(lambda: conn.execute(done, [task_id]).fetchone()[0], 10, 0.02,
                           "the prepared transaction's task to run")
                output, start = conn.execute("SELECT output, start FROM task WHERE id = %s", [task_id]).fetchone()
                assert output == "prepared"
                assert start - committed < timedelta(seconds=3)
        finally:
            assert launcher.stop() == 0
