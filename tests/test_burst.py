"""A burst: more due tasks than idle workers.  The local tasks that start a new session each go
to a few workers, up to 100 a worker (dispatch.py, TASKS_A_WORKER), which run them side by side
(pgtaskpy.run_tasks): a running task holds its session and a share of a worker, not a worker of
its own.  Each task behaves as it does alone."""

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
from pg_task_py_testing import Launcher, throwaway_cluster, wait_until

WORKERS = ("SELECT count(*) FROM pg_stat_activity"
           " WHERE datname = current_database() AND application_name = pgtaskpy.name_of('worker')")


def working(db):
    return db.value("SELECT count(*) FROM task WHERE state = 'WORK'")


@contextlib.contextmanager
def launcher_on_cluster_of(settings: dict[str, str], name: str) -> Iterator[tuple[Launcher, psycopg.Connection]]:
    """A launcher on database `name` of a throw-away cluster with `settings`, and an autocommit
    connection to it; the launcher must stop cleanly."""
    with throwaway_cluster(settings) as cluster:
        cluster.create_database(name)
        launcher = Launcher(cluster.dsn(name)).start()
        try:
            launcher.wait_active()
            with psycopg.connect(cluster.dsn(name), autocommit=True) as conn:
                yield launcher, conn
        finally:
            assert launcher.stop() == 0


def test_a_burst_runs_side_by_side_in_a_few_workers(running):
    running.sql("INSERT INTO task (\"group\", input, delete)"
                " SELECT 'g' || i, 'SELECT pg_sleep(2), ' || i, false FROM generate_series(1, 60) AS i")
    wait_until(lambda: working(running) == 60, 30, 0.02, "the burst running at once")
    workers = running.value(WORKERS)
    assert workers <= 8, f"{workers} worker backends for 60 running tasks"
    # (worker is cleared when a task ends: read while they run)
    assert running.value("SELECT count(DISTINCT worker) FROM task WHERE state = 'WORK'") <= 2  # up to 100 a worker
    running.wait_all_done(60)
    rows = running.sql("SELECT \"group\", output, pid FROM task ORDER BY id")
    assert [row[1] for row in rows] == [f"pg_sleep\t?column?\n\t{i}" for i in range(1, 61)]
    assert len({row[2] for row in rows}) == 60  # a session each


def test_a_burst_whose_runs_truncate_restart_identity_removed_returns_when_they_end(running):
    """TRUNCATE task RESTART IDENTITY under a burst: the new tasks given its tasks' ids, running in
    another worker, were taken for rows a client held, and the burst's worker waited for them to
    end to write its runs' ends, as long as they ran (a review: 15 s, not 3)."""
    running.sql("INSERT INTO task (\"group\", input, delete)"
                " SELECT 'old' || i, 'SELECT pg_sleep(1)', false FROM generate_series(1, 20) AS i")
    wait_until(lambda: working(running) == 20, 30, 0.02, "the burst running")
    burst_worker = running.value("SELECT min(worker) FROM task WHERE state = 'WORK'")
    running.sql("TRUNCATE task RESTART IDENTITY")
    running.sql("INSERT INTO task (\"group\", input, delete)"
                " SELECT 'new' || i, 'SELECT pg_sleep(20)', false FROM generate_series(1, 20) AS i")
    wait_until(lambda: running.value("SELECT state <> 'active' FROM pg_stat_activity WHERE pid = %s",
                                     [burst_worker]) is not False, 15, 0.05, "the burst's worker to return")
    assert running.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") == 20  # (still running)
    running.sql("SELECT task_cancel(id) FROM task")


def test_each_task_of_a_burst_behaves_as_it_does_alone(running):
    running.sql("INSERT INTO task (\"group\", input, delete)"
                " SELECT 'g' || i, 'SELECT pg_sleep(1)', false FROM generate_series(1, 30) AS i")
    failing = running.insert("SELECT 1/0", group="failing", delete=False)
    timed_out = running.insert("SELECT pg_sleep(20)", group="timed_out", timeout="0.5 s", delete=False)
    cancelled = running.insert("SELECT pg_sleep(20)", group="cancelled", delete=False)
    left_open = running.insert("BEGIN; SELECT 5", group="left_open", delete=False)
    noticing = running.insert("DO $$ BEGIN RAISE NOTICE 'hello'; END $$", group="noticing", delete=False)
    itself = running.insert("SELECT current_setting('pg_task.id'), current_setting('pg_task.group')",
                            group="itself", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [cancelled]) == "WORK",
               30, 0.02, "the task to cancel running")
    assert running.value("SELECT task_cancel(%s)", [cancelled]) is True
    running.wait_all_done(60)
    task = {task_id: running.task(task_id) for task_id in (failing, timed_out, cancelled, left_open, noticing, itself)}
    assert (task[failing]["state"], task[failing]["sqlstate"]) == ("FAIL", "22012")
    assert "division by zero" in task[failing]["error"]
    assert (task[timed_out]["state"], task[timed_out]["sqlstate"]) == ("FAIL", "57014")
    assert "statement timeout" in task[timed_out]["error"]
    assert (task[cancelled]["state"], task[cancelled]["sqlstate"]) == ("FAIL", "57014")
    assert "user request" in task[cancelled]["error"]
    assert task[left_open]["state"] == "DONE" and task[left_open]["output"].endswith("COMMIT")
    assert task[noticing]["state"] == "DONE" and "hello" in task[noticing]["notice"]
    assert task[itself]["output"] == f"current_setting\tcurrent_setting\n{itself}\titself"
    assert running.value("SELECT count(DISTINCT worker) FROM task") <= 3  # side by side, not a worker each


def test_burst_tasks_run_in_their_first_sessions_whatever_the_owners_idle_session_timeout(running):
    """A burst's worker marks its connected tasks WORK, and here each WORK update sleeps past the
    role's idle_session_timeout (a trigger of the test, as a client's lock on a task's row would
    hold it), so the sessions that wait behind it sit idle longer than the role allows.  A
    burst's session runs one task and starts without the timeout: each task runs in the session
    its start named, and none fails.  (They ended idle, and each such task moved to a new one.)"""
    running.sql("CREATE ROLE burst_role LOGIN IN ROLE pgtaskpy_user")
    running.sql("CREATE TABLE started_in (id bigint, pid int)")
    running.sql("CREATE FUNCTION slow_start() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN INSERT INTO public.started_in VALUES (NEW.id, NEW.pid); PERFORM pg_sleep(0.3);"
                " RETURN NULL; END$$")
    running.sql("CREATE TRIGGER slow_start AFTER UPDATE ON task FOR EACH ROW"
                " WHEN (OLD.state <> 'WORK' AND NEW.state = 'WORK') EXECUTE FUNCTION slow_start()")
    try:
        running.sql("ALTER ROLE burst_role SET idle_session_timeout = '200ms'")
        running.sql("INSERT INTO task (\"group\", owner, input, delete) SELECT 'g' || i, 'burst_role',"
                    " 'SELECT pg_backend_pid(), current_setting(''idle_session_timeout'')', false"
                    " FROM generate_series(1, 20) AS i")
        wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity"
                                         " WHERE query LIKE 'CALL pgtaskpy.run_tasks(%'"), 20, 0.02, "a burst's worker")
        running.wait_all_done(60)
    finally:
        running.sql("DROP TRIGGER slow_start ON task")
        running.sql("DROP ROLE burst_role")
    rows = running.sql("SELECT t.id, t.state::text, t.output, t.pid, s.pid"
                       " FROM task AS t JOIN started_in AS s USING (id) ORDER BY t.id")
    assert len(rows) == 20, rows  # each started once
    for _, state, output, pid, started_pid in rows:
        # (the setting, as the task's session has it: off)
        assert (state, pid, output) == ("DONE", started_pid, f"pg_backend_pid\tcurrent_setting\n{pid}\t0"), rows


def test_a_burst_of_a_role_whose_sessions_end_idle_within_1_ms_runs_every_task():
    """A burst's worker writes the starts of sessions that connect within 10 ms together: a
    session connected first waited that long, and more on busy cores, before its input.  With
    the owner's idle_session_timeout at 50 ms, 95 of 150 tasks ended FAIL 57P05 after three
    sessions each, and their new sessions, all at once, kept the cores too busy for the next
    ones.  A burst's sessions start without the timeout."""
    with launcher_on_cluster_of({"max_connections": "300"}, "idle") as (_, conn):
        conn.execute("CREATE ROLE quick LOGIN IN ROLE pgtaskpy_user")
        conn.execute("ALTER ROLE quick SET idle_session_timeout = '1ms'")
        conn.execute("INSERT INTO task (\"group\", owner, input, delete) SELECT 'g' || i, 'quick',"
                     " 'SELECT pg_sleep(0.5), ' || i, false FROM generate_series(1, 150) AS i")
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL')").fetchone()[0]
                   == 150, 120, 0.1, "the burst's end")
        failed = conn.execute("SELECT id, sqlstate, left(error, 200) FROM task WHERE state <> 'DONE'").fetchall()
        assert failed == [], failed
        outputs = conn.execute("SELECT output FROM task ORDER BY id").fetchall()
        assert outputs == [(f"pg_sleep\t?column?\n\t{i}",) for i in range(1, 151)]


def test_the_ended_tasks_of_a_burst_make_room_under_run_while_one_runs_on(db):
    # --run counts the tasks running: a burst's worker returns only with its last task, but those
    # that have ended count no more.  20 tasks in 20 groups, one of them long, go to one worker.
    db.launcher("--run", "20")
    db.sql("INSERT INTO task (\"group\", input, delete) SELECT 'g' || i,"
           " CASE WHEN i = 1 THEN 'SELECT pg_sleep(60)' ELSE 'SELECT 1' END, false FROM generate_series(1, 20) AS i")
    long = db.value("SELECT id FROM task WHERE input = 'SELECT pg_sleep(60)'")
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 19, 30, 0.02,
               "the short tasks of the burst to end")
    db.sql("INSERT INTO task (\"group\", input, delete)"
           " SELECT 'later' || i, 'SELECT pg_sleep(3)', false FROM generate_series(1, 5) AS i")
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE \"group\" LIKE 'later%%' AND state = 'WORK'") == 5,
               15, 0.02, "5 later tasks running at once beside the long one")
    assert db.value("SELECT state::text FROM task WHERE id = %s", [long]) == "WORK"  # it still runs
    assert db.value("SELECT task_cancel(%s)", [long])


def test_a_burst_of_tasks_that_take_a_worker_each_is_claimed_as_workers_take_it(db):
    # Tasks with `count` keep their session for their group: a worker each, connected 8 a turn.
    # A turn claims what its workers take, not hundreds of them only to unclaim the rest (each
    # claim and unclaim rewrites the row).  A trigger of the test's notes every unclaim.
    db.sql("CREATE TABLE unclaimed (id bigint)")
    db.sql("CREATE FUNCTION note_unclaim() RETURNS trigger LANGUAGE plpgsql"
           " AS $$ BEGIN INSERT INTO public.unclaimed VALUES (NEW.id); RETURN NULL; END $$")
    db.sql("CREATE TRIGGER note_unclaim AFTER UPDATE ON task FOR EACH ROW"
           " WHEN (OLD.state = 'TAKE' AND NEW.state = 'PLAN') EXECUTE FUNCTION note_unclaim()")
    db.launcher()
    db.sql("INSERT INTO task (\"group\", count, input, delete)"
           " SELECT 'g' || i, 5, 'SELECT 1', false FROM generate_series(1, 100) AS i")
    db.wait_all_done(60)
    assert db.sql("SELECT state::text, count(*) FROM task GROUP BY 1") == [("DONE", 100)]
    assert db.value("SELECT count(*) FROM unclaimed") == 0


def test_a_burst_worker_that_dies_fails_its_running_tasks_and_runs_none_twice(running):
    running.sql("CREATE TABLE ran (i integer)")
    running.sql("INSERT INTO task (\"group\", input, delete) SELECT 'g' || i,"
                " 'SELECT pg_sleep(1.5); INSERT INTO ran VALUES (' || i || ')', false FROM generate_series(1, 30) AS i")
    wait_until(lambda: working(running) >= 25, 30, 0.02, "the burst running")
    worker, tasks = running.sql("SELECT worker, array_agg(id) FROM task WHERE state = 'WORK'"
                                " GROUP BY worker ORDER BY count(*) DESC LIMIT 1")[0]
    assert len(tasks) >= 5
    running.sql("SELECT pg_terminate_backend(%s)", [worker])
    running.wait_all_done(60)
    lost = running.sql("SELECT state::text, sqlstate, error FROM task WHERE id = ANY(%s)", [tasks])
    assert all(state == "FAIL" and sqlstate == "08006" and "worker" in error for state, sqlstate, error in lost), lost
    # The rest ran, or (still starting in that worker, WORK after the look) were lost with it.
    ends = running.sql("SELECT state::text, sqlstate, count(*) FROM task GROUP BY 1, 2")
    assert {(state, sqlstate) for state, sqlstate, _ in ends} <= {("DONE", None), ("FAIL", "08006")}, ends
    # At most once: no input ran twice (a lost run may have done its work, as its error says).
    assert running.value("SELECT count(*) - count(DISTINCT i) FROM ran") == 0
    assert running.value("SELECT count(*) FROM task") == 30


def test_a_clients_lock_on_one_task_of_a_burst_holds_back_no_other(running):
    """20 tasks in 20 groups run side by side in a burst's worker.  A client holds one running
    task's row in an open transaction (SELECT ... FOR UPDATE, as an application reading its own
    task's progress might): the worker waited for it to write that task's end, and the ends of
    the 19 others, of any role, waited as long as the client's transaction.  Now they are
    written as they come, that one once the row is free, with the time its input ended."""
    running.sql("INSERT INTO task (\"group\", input, delete) SELECT 'g' || i,"
                " CASE WHEN i = 1 THEN 'SELECT pg_sleep(1)' ELSE 'SELECT pg_sleep(3)' END, false"
                " FROM generate_series(1, 20) AS i")
    held = running.value("SELECT id FROM task WHERE \"group\" = 'g1'")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [held]) == "WORK", 20, 0.01,
               "the task to be held running")
    assert running.value("SELECT count(DISTINCT worker) FROM task WHERE worker IS NOT NULL") <= 2  # a burst's
    with running.connect() as client, client.transaction():
        client.execute("SELECT id FROM task WHERE id = %s FOR UPDATE", [held])
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 19, 20, 0.05,
                   "the other 19 tasks to end while the client holds one")
        assert running.value("SELECT state::text FROM task WHERE id = %s", [held]) == "WORK"
    row = running.wait_done(held, 20)
    assert row["state"] == "DONE", row
    # (the client's end comes after the others', 3 s after their starts and more)
    assert timedelta(seconds=1) <= row["stop"] - row["start"] < timedelta(seconds=2.5), row  # not the client's end
    logged = wait_until(lambda: re.search(rf"task {held} DONE in ([0-9.]+)s", running.launchers[-1].output()), 20,
                        0.05, "the held task's end in the launcher's log")
    assert 1.0 <= float(logged[1]) < 2.5, logged[0]  # (it counted the client's hold too)
    others = running.sql("SELECT stop - start FROM task WHERE id <> %s", [held])
    assert all(timedelta(seconds=3) <= took < timedelta(seconds=6) for (took,) in others), others


# A task of a burst's running call (CALL pgtaskpy.run_tasks(ARRAY[...]), ...) that its worker has
# taken (another task of the call runs: it started after the call took them all) and not started:
# the call's last, whose session connects last.  The one whose start a client can hold.
TAKEN_IN_A_BURST = (
    "WITH burst AS (SELECT pid, unnest(regexp_split_to_array(substring(query FROM 'ARRAY\\[([0-9, ]*)\\]'), ', ')"
    "                                   ::bigint[]) AS id"
    "               FROM pg_stat_activity WHERE query LIKE 'CALL pgtaskpy.run_tasks%%' AND state = 'active'),"
    "      taken AS (SELECT b.id FROM burst AS b WHERE b.pid IN (SELECT c.pid FROM burst AS c JOIN task AS w"
    "                                                            ON w.id = c.id AND w.state = 'WORK'))"
    " SELECT id FROM task WHERE state = 'TAKE' AND id IN (SELECT id FROM taken)"
    " ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED")


def test_a_burst_task_stopped_while_a_client_held_its_start_fails_no_other():
    """A client holds a task of a burst that its worker has taken but not started (its start
    waits for the row), then stops it with task_cancel.  The worker closed the task's session
    when it found it stopped, then polled that closed session's socket (-1): `ValueError: file
    descriptor cannot be a negative integer`, its call failed, and the ~100 tasks it ran ended
    FAIL (a probe).  The stopped task ends STOP, and every other task DONE."""
    with launcher_on_cluster_of({"max_connections": "300"}, "stopped") as (_, conn):
        conn.execute("INSERT INTO task (\"group\", input, delete)"
                     " SELECT 'g' || i, 'SELECT pg_sleep(2)', false FROM generate_series(1, 150) AS i")
        with psycopg.connect(conn.info.dsn, autocommit=True) as client:

            def hold_a_start_and_stop_it() -> int | None:
                with client.transaction():
                    row = client.execute(TAKEN_IN_A_BURST).fetchone()
                    if row is None:
                        return None
                    time.sleep(0.3)  # (its worker's start comes meanwhile, and finds the row held)
                    client.execute("SELECT task_cancel(%s)", [row[0]])
                    return row[0]

            stopped = wait_until(hold_a_start_and_stop_it, 30, 0.005, "a taken task of the burst, held")
        wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM task"
                                        " WHERE state IN ('PLAN', 'TAKE', 'WORK')").fetchone()[0],
                   60, 0.1, "the 150 tasks ended")
        ended = conn.execute("SELECT state::text, count(*), min(error) FROM task WHERE id <> %s GROUP BY 1",
                             [stopped]).fetchall()
        assert ended == [("DONE", 149, None)], ended
        assert conn.execute("SELECT state::text FROM task WHERE id = %s", [stopped]).fetchone() == ("STOP",)


def test_a_burst_worker_starts_no_held_task_once_its_launcher_has_stopped():
    """A client holds a task a burst's worker has taken and not started; another holds the running
    tasks, whose ends the worker then waits to write.  The launcher stops (SIGTERM, --grace 0.5).
    The worker, still waiting for those ends, started the held task once its client let go, after
    its launcher had stopped (a probe).  It now leaves it claimed, and the next launcher runs it."""
    with throwaway_cluster({"max_connections": "300"}) as cluster:
        cluster.create_database("stops")
        launcher = Launcher(cluster.dsn("stops"), args=("--grace", "0.5")).start()
        with cluster.connect("stops") as conn, cluster.connect("stops") as start_holder, \
                cluster.connect("stops") as end_holder:
            launcher.wait_active()
            conn.execute("INSERT INTO task (\"group\", input, delete)"
                         " SELECT 'g' || i, 'SELECT pg_sleep(2)', false FROM generate_series(1, 150) AS i")

            def hold_a_taken_task() -> tuple | None:
                # (a transaction a look: pg_stat_activity stays as a transaction first read it)
                start_holder.execute("BEGIN")
                row = start_holder.execute(TAKEN_IN_A_BURST).fetchone()
                if row is None:
                    start_holder.execute("ROLLBACK")
                return row

            held = wait_until(hold_a_taken_task, 30, 0.005, "a taken task of the burst, held")[0]
            with end_holder.transaction():
                end_holder.execute("SELECT id FROM task WHERE state = 'WORK' FOR SHARE")
                launcher.signal(signal.SIGTERM)
                assert launcher.process.wait(30) == 0
                start_holder.execute("COMMIT")
            # (both let go: the worker writes the ends it waited for, and its call returns)
            wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM pg_stat_activity"
                                            " WHERE application_name = 'pg_task_py worker'").fetchone()[0],
                       30, 0.05, "the stopped launcher's workers gone")
            assert conn.execute("SELECT state::text, start FROM task WHERE id = %s", [held]).fetchone() == \
                ("TAKE", None)
            later = Launcher(cluster.dsn("stops")).start()
            try:
                later.wait_active()
                wait_until(lambda: conn.execute("SELECT state = 'DONE' FROM task WHERE id = %s",
                                                [held]).fetchone()[0], 30, 0.05, "the next launcher to run it")
                # (the others ran, or were cancelled past the grace period)
                wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM task"
                                                " WHERE state IN ('PLAN', 'TAKE', 'WORK')").fetchone()[0],
                           30, 0.05, "every task ended")
            finally:
                assert later.stop() == 0


def test_a_launcher_holds_no_more_workers_than_its_files_allow():
    """Tasks that each need a worker of their own (here `count`) beyond what the launcher's
    session can hold (a third of max_files_per_process, less a margin: 20 workers here) wait
    for a worker instead of failing the launcher's connections or its waits."""
    with launcher_on_cluster_of({"max_files_per_process": "150"}, "files") as (launcher, conn):
        conn.execute("INSERT INTO task (\"group\", count, input, delete)"
                     " SELECT 'g' || i, 2, 'SELECT pg_sleep(0.5)', false FROM generate_series(1, 40) AS i")
        seen = []

        def all_ended() -> bool:
            seen.append(conn.execute(WORKERS).fetchone()[0])
            return conn.execute("SELECT count(*) = 0 FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')"
                                ).fetchone()[0]

        wait_until(all_ended, 60, 0.05, "the 40 tasks done")
        assert 2 <= max(seen) <= 20, seen
        assert conn.execute("SELECT state::text, count(*) FROM task GROUP BY 1").fetchall() == [("DONE", 40)]
    output = launcher.output()
    assert "Too many open files" not in output and "too many open files" not in output, output[-3000:]


def test_tasks_due_together_hold_their_sessions_and_workers_and_no_more(running):
    """20 tasks planned 2 s ahead in 20 groups start in 20 workers warmed for them (each with a
    session started ahead, which its task takes); a worker starts more sessions ahead only for
    its group's due tasks: none here, so about two backends a running task."""
    running.sql("INSERT INTO task (\"group\", plan, input, delete) SELECT 'g' || i, now() + interval '2 s',"
                " 'SELECT pg_sleep(2)', false FROM generate_series(1, 20) AS i")
    wait_until(lambda: working(running) == 20, 30, 0.02, "the 20 tasks running")
    backends = running.value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                             " AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
    assert backends <= 2 * 20 + 4, f"{backends} backends for 20 running tasks"
    running.wait_all_done(30)
    assert running.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 20


def test_a_burst_whose_tasks_end_at_the_same_moment_ends_every_task_done():
    """300 tasks in 300 groups that all end at the same instant, in three workers of 100.  Every
    end locks its task's key of the prerequisite locks (its dependents,
    sql/replayed/47_workflows.sql); a worker that wrote the ends it read together, in one
    transaction, took several of those keys in no order another worker shared, two workers
    deadlocked, and the loser's CALL failed: its tasks, which had all run, ended FAIL,
    `pg_task_py worker failed: deadlock detected` (1,000 tasks in `make bench`: 656 of them)."""
    with launcher_on_cluster_of({"max_connections": "400"}, "together") as (_, conn):
        for _ in range(2):  # each round's ends meet in other orders
            conn.execute("DELETE FROM task")
            conn.execute("INSERT INTO task (\"group\", input, delete) SELECT 'g' || i,"
                         " format('SELECT pg_sleep_until(%L)', clock_timestamp() + interval '4 s'), false"
                         " FROM generate_series(1, 300) AS i")
            wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM task"
                                            " WHERE state IN ('PLAN', 'TAKE', 'WORK')").fetchone()[0],
                       90, 0.1, "the 300 tasks ended")
            ended = conn.execute("SELECT state::text, count(*), min(error) FROM task GROUP BY 1").fetchall()
            assert ended == [("DONE", 300, None)], ended


def test_a_client_locking_a_bursts_tasks_newest_first_fails_none_of_them():
    """300 tasks in 300 groups start in three workers of 100 while a client locks the tasks that
    are starting or running, newest first (SELECT ... ORDER BY id DESC FOR UPDATE), again and
    again.  A worker marked the tasks whose sessions had connected WORK in one transaction, oldest
    first: holding one, it waited for a newer one the client held while the client waited for
    the one it held.  The server broke the deadlock by failing the worker's CALL, and the tasks
    it had started, which were running, ended FAIL, `pg_task_py worker failed: deadlock
    detected` (2 to 96 of the 300 in four runs of six).  The client's deadlocks (it is the other
    side) are its own, and it goes on.  (deadlock_timeout 20 ms: a cycle is broken at once.)"""
    with launcher_on_cluster_of({"max_connections": "400", "deadlock_timeout": "20ms"}, "newest") as (_, conn):
        conn.execute("INSERT INTO task (\"group\", input, delete)"
                     " SELECT 'g' || i, 'SELECT pg_sleep(1)', false FROM generate_series(1, 300) AS i")
        unfinished = "SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')"
        deadline = time.monotonic() + 90
        while conn.execute(unfinished).fetchone()[0] > 0 and time.monotonic() < deadline:
            try:
                with conn.transaction():
                    conn.execute("SELECT id FROM task WHERE state IN ('TAKE', 'WORK') ORDER BY id DESC FOR UPDATE")
            except psycopg.errors.DeadlockDetected:
                pass
        wait_until(lambda: conn.execute(unfinished).fetchone()[0] == 0, 60, 0.1, "the 300 tasks ended")
        ended = conn.execute("SELECT state::text, count(*), min(error) FROM task GROUP BY 1").fetchall()
        assert ended == [("DONE", 300, None)], ended
