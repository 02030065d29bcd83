"""Retries: a failed run whose SQLSTATE retry_on names is run again as a new row, after a delay
that doubles up to retry_max; what may have run (a lost worker) is not, unless the task says
it is safe; a series never has two waiting runs and keeps its beat; task_retry redrives."""

import concurrent.futures
import signal
from datetime import timedelta

import psycopg
import pytest
from pg_task_py_testing import wait_until

# Fails with `code` on its first `failures` attempts (it reads its own row: its attempt).
FLAKY = ("DO $$ BEGIN IF (SELECT attempt FROM task WHERE id = current_setting('pg_task.id')::bigint) <= {failures}"
         " THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '{code}'; END IF; END $$")


def attempts(db, first_id):
    """The rows of a task's attempts, first to last (each the parent of the next)."""
    cursor = db.conn.execute(
        "WITH RECURSIVE a AS (SELECT * FROM task WHERE id = %s"
        " UNION ALL SELECT t.* FROM task AS t JOIN a ON t.parent = a.id AND t.attempt = a.attempt + 1)"
        " SELECT id, attempt, state::text, sqlstate, plan, start, stop, error FROM a ORDER BY attempt", [first_id])
    return [dict(zip([d.name for d in cursor.description], row)) for row in cursor.fetchall()]


def wait_attempts(db, first_id, count, timeout=30.0):
    """The attempts once there are `count` of them and the last has ended."""
    def ended():
        rows = attempts(db, first_id)
        return rows if len(rows) == count and rows[-1]["state"] not in ("PLAN", "TAKE", "WORK") else None
    return wait_until(ended, timeout, message=f"{count} ended attempts of task {first_id}: {attempts(db, first_id)}")


def test_a_serialization_failure_is_retried_with_growing_delays_until_it_succeeds(running):
    first = running.insert(FLAKY.format(failures=2, code="40001"), retry=5, retry_delay="0.5 s", delete=False)
    rows = wait_attempts(running, first, 3)
    assert [(r["attempt"], r["state"], r["sqlstate"]) for r in rows] == [
        (1, "FAIL", "40001"), (2, "FAIL", "40001"), (3, "DONE", None)]
    assert "ERROR:  flaky" in rows[0]["error"]
    # plan = the failed run's stop + retry_delay * 2^(attempt - 1), +-10 %
    for failed, retry, delay in ((rows[0], rows[1], 0.5), (rows[1], rows[2], 1.0)):
        gap = (retry["plan"] - failed["stop"]).total_seconds()
        assert 0.9 * delay - 0.001 <= gap <= 1.1 * delay + 0.001, (gap, delay)
        assert retry["start"] >= retry["plan"]


def test_retry_max_caps_the_delay(running):
    first = running.insert(FLAKY.format(failures=2, code="40P01"), retry=2, retry_delay="0.4 s",
                           retry_max="0.5 s", delete=False)
    rows = wait_attempts(running, first, 3)
    gap = (rows[2]["plan"] - rows[1]["stop"]).total_seconds()
    assert 0.45 - 0.001 <= gap <= 0.5 + 0.001  # 0.8 s +-10 % capped at 0.5 s: within its last 10 %


def test_delays_at_retry_max_are_spread_too(db):
    """Tasks that fail together and have reached retry_max retry at different times: the cap
    came after the spread, and every one of them was planned exactly retry_max after its end."""
    failed = ("jsonb_populate_record(NULL::task, jsonb_build_object('state', 'FAIL', 'attempt', a, 'retry', 30,"
              " 'sqlstate', '40001', 'retry_on', '{40001}'::text[], 'retry_delay', '1 s', 'retry_max', '10 s',"
              " 'timeout', '0', 'stop', '2026-01-01 00:00+00'))")
    delays = db.sql(f"SELECT a, extract(epoch FROM pgtaskpy.retry_plan({failed}) - '2026-01-01 00:00+00')::float8"
                    " FROM generate_series(1, 25) AS a, generate_series(1, 40)")
    capped = [delay for attempt, delay in delays if attempt >= 5]  # (1 s * 2^4 is over 10 s)
    assert all(9.0 - 1e-6 <= delay <= 10.0 + 1e-6 for delay in capped), (min(capped), max(capped))
    assert len({round(delay, 3) for delay in capped}) > 100
    first = [delay for attempt, delay in delays if attempt == 1]
    assert all(0.9 - 1e-6 <= delay <= 1.1 + 1e-6 for delay in first) and len(set(first)) > 10


def test_an_error_retry_on_does_not_name_is_not_retried(running):
    task_id = running.insert("SELECT 1/0", retry=3, retry_delay="0 s")
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "22012")
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task") == 1


@pytest.mark.parametrize("retry_on", ["{*}", "{22}", "{22012}"])
def test_retry_on_names_codes_classes_or_every_error(running, retry_on):
    first = running.insert("SELECT 1/0", retry=2, retry_delay="0 s", retry_on=retry_on)
    rows = wait_attempts(running, first, 3)
    assert [(r["attempt"], r["state"], r["sqlstate"]) for r in rows] == [
        (1, "FAIL", "22012"), (2, "FAIL", "22012"), (3, "FAIL", "22012")]
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task") == 3  # then the retries stop


def test_a_timeout_is_retried_only_when_retry_on_names_57014(running):
    every = running.insert("SELECT pg_sleep(5)", timeout="0.2 s", retry=1, retry_delay="0 s", retry_on="{*}")
    named = running.insert("SELECT pg_sleep(5)", timeout="0.2 s", retry=1, retry_delay="0 s",
                           retry_on="{57014}", **{"group": "other"})
    assert [r["state"] for r in wait_attempts(running, named, 2)] == ["FAIL", "FAIL"]
    assert running.wait_done(every)["sqlstate"] == "57014"
    running.wait_all_done()
    assert len(attempts(running, every)) == 1


def test_a_cancelled_task_is_not_retried(running):
    task_id = running.insert("SELECT pg_sleep(30)", retry=3, retry_delay="0 s", retry_on="{*,57014}")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [task_id]) == "WORK", 20)
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    assert running.wait_done(task_id)["sqlstate"] == "57014"
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


def test_a_run_a_launchers_stop_cancels_is_retried_as_an_error(db):
    """A launcher stopped past its --grace (a deploy, a restart) cancels its running tasks: that
    was taken for a user's cancel, never retried, and a workflow's step with retry_on '{*}' failed
    for good, its workflow stopped (a probe), where a SIGKILL of the launcher let the step finish.
    Nobody asked the task to end: it is retried as any error, when retry_on names 57014, its class
    or *; not by the default retry_on."""
    slow_first = ("SELECT pg_sleep(CASE WHEN (SELECT attempt FROM task"
                  " WHERE id = current_setting('pg_task.id')::bigint) = 1 THEN 60 ELSE 0 END), 'step'")
    launcher = db.launcher("--grace", "0.5")
    retried = db.insert(slow_first, retry=2, retry_delay="0 s", retry_on="{*}", group="a", delete=False)
    not_named = db.insert(slow_first, retry=2, retry_delay="0 s", group="b", delete=False)
    after = db.insert("SELECT 'next step'", after=[retried], delete=False)
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 2, 20, message="both running")
    launcher.signal(signal.SIGTERM)
    assert launcher.process.wait(30) == 0, launcher.output()
    assert [row["sqlstate"] for row in attempts(db, retried)] == ["57014", None]  # (the retry, waiting)
    assert [row["sqlstate"] for row in attempts(db, not_named)] == ["57014"]
    db.launcher()
    assert [(row["state"], row["sqlstate"]) for row in wait_attempts(db, retried, 2)] == [
        ("FAIL", "57014"), ("DONE", None)]
    assert db.wait_done(after)["output"] == "next step"


# A task that catches the first cancel (and says so with an advisory lock of its id) and sleeps
# on: what ends it comes after a user's cancel.
CATCHES_A_CANCEL = ("DO $$ BEGIN BEGIN PERFORM pg_sleep(60); EXCEPTION WHEN query_canceled THEN"
                    " PERFORM pg_advisory_lock(current_setting('pg_task.id')::bigint); END;"
                    " PERFORM pg_sleep(60); END $$")


def test_a_run_the_user_cancelled_is_not_retried_whatever_ends_it_after(db):
    """task_cancel of a task that caught the cancel, then a DBA's pg_terminate_backend of its
    session, or a launcher's stop past its --grace: the end was taken for a lost run or a stop's
    cancel and retried (a probe); and a task_cancel rolled back after its signal was taken for a
    timeout of a task that had run longer than its `timeout`.  Somebody wanted each to stop."""
    launcher = db.launcher("--grace", "0.5")
    terminated = db.insert(CATCHES_A_CANCEL, retry=2, retry_delay="0 s", retry_on="{*}", retry_unsafe=True,
                           group="t", delete=False)
    stopped = db.insert(CATCHES_A_CANCEL, retry=2, retry_delay="0 s", retry_on="{*}", group="s", delete=False)
    rolled_back = db.insert("SELECT pg_sleep(0.6);" * 20, timeout="1 s", retry=1, retry_delay="0 s",
                            retry_on="{57014}", group="r", delete=False)

    def sleeping(task_id):
        return db.value("SELECT a.wait_event = 'PgSleep' AND clock_timestamp() - t.start > interval '1.3 s'"
                        " FROM task AS t JOIN pg_stat_activity AS a ON a.pid = t.pid WHERE t.id = %s", [task_id])
    for task_id in (terminated, stopped, rolled_back):
        wait_until(lambda task_id=task_id: sleeping(task_id), 20, 0.02, f"task {task_id} sleeping")
    assert db.value("SELECT task_cancel(%s) AND task_cancel(%s)", [terminated, stopped]) is True
    with db.connect() as conn:
        conn.autocommit = False
        assert conn.execute("SELECT task_cancel(%s)", [rolled_back]).fetchone() == (True,)
        conn.rollback()
    assert db.wait_done(rolled_back)["sqlstate"] == "57014"
    wait_until(lambda: db.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                                " AND objid IN (%s, %s)", [terminated, stopped]) == 2, 20, 0.02,
               "both tasks to catch their cancel")
    db.value("SELECT pg_terminate_backend(pid) FROM task WHERE id = %s", [terminated])
    assert db.wait_done(terminated)["sqlstate"] == "57P01"
    launcher.signal(signal.SIGTERM)
    assert launcher.process.wait(30) == 0, launcher.output()
    assert db.task(stopped)["sqlstate"] == "57014"
    assert db.value("SELECT count(*) FROM task WHERE parent IS NOT NULL") == 0


def test_a_users_cancel_that_commits_while_a_stop_cancels_the_task_is_not_retried(db):
    """A launcher's stop cancels a task that holds its own row (its progress in `data`) while a
    user's transaction that cancelled it is open: the stop's mark waited for the user's, then
    was taken for the stop's, and the run the user cancelled was retried (a review)."""
    launcher = db.launcher("--grace", "0.5")
    task_id = db.insert("UPDATE task SET data = 'p' WHERE id = current_setting('pg_task.id')::bigint; "
                        + CATCHES_A_CANCEL, retry=1, retry_delay="0 s", retry_on="{*}", delete=False)
    wait_until(lambda: db.value("SELECT a.wait_event = 'PgSleep' FROM task AS t JOIN pg_stat_activity AS a"
                                " ON a.pid = t.pid WHERE t.id = %s", [task_id]), 20, 0.02, "the task sleeping")
    with db.connect() as conn:
        conn.autocommit = False
        assert conn.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
        wait_until(lambda: db.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                                    " AND objid = %s", [task_id]) == 1, 20, 0.02, "the task to catch the cancel")
        launcher.signal(signal.SIGTERM)
        wait_until(lambda: db.value("SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid'"
                                    " AND NOT granted") > 0, 20, 0.02, "the stop's cancel to wait for the user's")
        conn.commit()
    assert launcher.process.wait(30) == 0, launcher.output()
    assert db.task(task_id)["sqlstate"] == "57014"
    assert db.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


def test_a_task_authors_setting_does_not_make_its_cancel_a_stops(running):
    """pgtaskpy.stop_cancels, which a launcher's stop sets around its cancels, is a setting any
    role may SET: a task author's own cancel was retried so, and an admin's of another role's task
    (a review).  Only a superuser's session's counts."""
    running.sql("CREATE ROLE erin LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("erin") as erin:
            task_id = erin.execute("INSERT INTO task (input, retry, retry_delay, retry_on, delete) VALUES"
                                   " ('SELECT pg_sleep(60)', 1, '0 s', '{*,57014}', false) RETURNING id").fetchone()[0]
            wait_until(lambda: running.task(task_id)["state"] == "WORK", 20, 0.02, "the task running")
            erin.execute("SET pgtaskpy.stop_cancels = on")
            assert erin.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
        assert running.wait_done(task_id)["sqlstate"] == "57014"
        running.wait_all_done()
        assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY erin")
        running.sql("DROP ROLE erin")


def test_the_retries_of_runs_lost_together_are_spread(running):
    """Runs a crash lost together were all retried exactly a minute after their ends (the minute
    came after the spread): together again.  Their delays are spread over the 10 % after it."""
    ids = [running.insert("SELECT pg_sleep(60)", retry=1, retry_delay="1 s", retry_on="{*}", retry_unsafe=True,
                          group=f"lost {i}", delete=False) for i in range(6)]
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 6, 20, 0.02, "all running")
    running.sql("SELECT pg_terminate_backend(pid) FROM task WHERE state = 'WORK'")
    for task_id in ids:
        assert running.wait_done(task_id)["sqlstate"] == "57P01"
    delays = [seconds for (seconds,) in running.sql(
        "SELECT extract(epoch FROM r.plan - t.stop)::float8 FROM task AS t JOIN task AS r ON r.parent = t.id"
        " WHERE t.id = ANY(%s)", [ids])]
    assert len(delays) == 6 and all(60 <= delay <= 66 for delay in delays), delays
    assert len(set(delays)) > 1, delays
    running.sql("DELETE FROM task")


def test_a_task_writing_its_progress_to_its_row_is_cancelled_at_once_and_not_retried(running):
    """A task that wrote `data` (README's progress) holds its row until its input ends: task_cancel
    waited that long, returned false and the task ended DONE (a probe: 8 s of 8)."""
    task_id = running.insert("UPDATE task SET data = 'step 1' WHERE id = current_setting('pg_task.id')::bigint;"
                             " SELECT pg_sleep(60)", retry=3, retry_delay="0 s", retry_on="{*,57014}", delete=False)
    wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'UPDATE task SET data%%'"
                                     " AND wait_event = 'PgSleep'") == 1, 20, 0.02, "the task to sleep")
    with running.connect() as conn:
        conn.execute("SET statement_timeout = '20s'")
        assert conn.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"], row["data"]) == ("FAIL", "57014", None), row
    assert row["stop"] - row["start"] < timedelta(seconds=30), row
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


def test_task_wait_after_task_cancel_in_one_transaction_says_to_commit_first(running):
    """The cancel's row lock holds the task's end until the caller commits: task_wait waited in
    vain, then blamed the launcher."""
    task_id = running.insert("SELECT pg_sleep(60)")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [task_id]) == "WORK", 20)
    with running.connect() as conn:
        conn.autocommit = False
        assert conn.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="locked by this transaction"):
            conn.execute("SELECT task_wait(%s, '5 s')", [task_id])
        conn.rollback()
    assert running.wait_done(task_id)["sqlstate"] == "57014"


def kill_worker_mid_run(db, task_id):
    wait_until(lambda: db.value("SELECT state::text FROM task WHERE id = %s", [task_id]) == "WORK", 20)
    assert db.value("SELECT pg_terminate_backend(worker) FROM task WHERE id = %s", [task_id]) is True
    return db.wait_done(task_id)


def test_a_cancel_after_the_timeout_has_passed_is_not_taken_for_a_timeout(running):
    """A multi-statement task runs past its `timeout` (each statement's): task_cancel then is a
    cancel all the same, not retried though retry_on names 57014 (it was, by the time alone)."""
    task_id = running.insert("SELECT pg_sleep(0.6); SELECT pg_sleep(0.6); SELECT pg_sleep(0.6); SELECT pg_sleep(5)",
                             timeout="1 s", retry=1, retry_delay="0 s", retry_on="{57014}", delete=False)
    wait_until(lambda: running.value("SELECT state = 'WORK' AND clock_timestamp() - start > interval '1.3 s'"
                                     " FROM task WHERE id = %s", [task_id]), 20, 0.02, "a run past its timeout")
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "57014")
    assert "user request" in row["error"]
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0
    wait_until(lambda: running.value("SELECT count(*) FROM pgtaskpy.cancelled_run") == 0, 10, 0.1,
               "housekeeping to drop the mark")


def test_a_task_whose_worker_died_is_not_retried_by_default(running):
    task_id = running.insert("SELECT pg_sleep(30)", retry=3, retry_delay="0 s", retry_on="{*}")
    row = kill_worker_mid_run(running, task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006")
    assert "the task is not run again" in row["error"], row
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


@pytest.mark.parametrize("unsafe", [False, True])
def test_a_task_whose_session_was_terminated_is_a_lost_run(running, unsafe):
    """pg_terminate_backend of the task's session (57P01): it may have done its work, as a run
    whose worker died.  retry_on '{*}' retried it at once."""
    task_id = running.insert("SELECT pg_sleep(30)", retry=1, retry_delay="0 s", retry_on="{*}", retry_unsafe=unsafe,
                             delete=False)
    wait_until(lambda: running.task(task_id)["state"] == "WORK", 20, 0.02, "the task running")
    running.value("SELECT pg_terminate_backend(pid) FROM task WHERE id = %s", [task_id])
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "57P01")
    retries = running.sql("SELECT plan FROM task WHERE parent = %s", [task_id])
    if unsafe:
        assert len(retries) == 1 and retries[0][0] - row["stop"] >= timedelta(minutes=1)
    else:
        assert retries == []


def test_kept_sessions_a_dba_terminates_fail_their_tasks_with_the_servers_error(running):
    """A group's kept sessions (`count`) that a DBA's pg_terminate_backend ends between its tasks:
    a task sent to one failed 08001, `could not open the task's session`, with pg_hba.conf's
    hint, and was retried as a network error; one whose session broke as its query was sent
    failed `ERROR:  FATAL:  terminating connection ...` (a probe: 30 to 40 % of the tasks).  Each
    fails with the server's error, 57P01, as a terminate while a task runs does (not retried)."""
    running.sql("INSERT INTO task (input, \"group\", count, retry, retry_delay, \"delete\") SELECT"
                " 'SELECT pg_sleep(0.01)', 'kept' || i % 4, 1000, 1, '1 h', false FROM generate_series(1, 300) AS i")
    running.terminate_task_sessions(4)
    running.wait_first_attempts_done()
    ends = running.sql("SELECT state::text, sqlstate, split_part(error, E'\\n', 1), count(*) FROM task"
                       " WHERE parent IS NULL GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    assert {(state, sqlstate, first_line) for state, sqlstate, first_line, _ in ends} <= {
        ("DONE", None, None), ("FAIL", "57P01", "FATAL:  terminating connection due to administrator command")}, ends
    assert sum(count for state, *_, count in ends if state == "FAIL") > 0, ends
    assert running.value("SELECT count(*) FROM task WHERE parent IS NOT NULL") == 0
    running.sql("DELETE FROM task")


def test_retry_unsafe_retries_a_lost_run_once_after_the_crash_wait(running):
    task_id = running.insert("SELECT pg_sleep(30)", retry=1, retry_delay="0 s", retry_unsafe=True)
    row = kill_worker_mid_run(running, task_id)
    # (its hint said "the task is not run again", with the retry planned: a probe)
    assert "its retry_unsafe runs it again, a minute from now at the earliest" in row["error"], row
    retries = running.sql("SELECT attempt, state::text, plan FROM task WHERE parent = %s", [task_id])
    assert len(retries) == 1
    attempt, state, plan = retries[0]
    assert (attempt, state) == (2, "PLAN")
    assert plan - row["stop"] >= timedelta(minutes=1)


def test_a_repeating_task_retries_without_two_waiting_runs_and_keeps_its_beat(running):
    # Every regular run (attempt 1) fails once; its retry 0.3 s later succeeds.
    first = running.insert(FLAKY.format(failures=1, code="40001"), repeat="1.5 s", retry=2,
                           retry_delay="0.3 s", delete=False, **{"group": "series"})
    base = running.value("SELECT plan FROM task WHERE id = %s", [first])

    def series_has_run_four_regular_runs():
        assert running.value("SELECT count(*) FROM task WHERE state = 'PLAN'") <= 1
        return running.value("SELECT count(*) FROM task WHERE attempt = 1 AND state <> 'PLAN'") >= 4 or None
    wait_until(series_has_run_four_regular_runs, 30, interval=0.01)
    rows = running.sql("SELECT attempt, state::text, plan FROM task WHERE state <> 'PLAN' ORDER BY id")
    regular = [plan for attempt, _, plan in rows if attempt == 1]
    for k, plan in enumerate(regular):
        assert plan == base + timedelta(seconds=1.5 * k)  # the beat of the first plan
    assert [(a, s) for a, s, _ in rows][:6] == [(1, "FAIL"), (2, "DONE")] * 3


def test_a_series_keeps_its_beat_when_keep_runs_would_delete_the_failed_run_its_retry_follows(running):
    """keep_runs (here 0) deleted a series' failed run while its retry waited; the retry's end
    found no first attempt to count the series' beat from, and the series went on from the
    retry's own plan, late for good (a probe: 10 s series, runs at 0, 14.7 and 29.1 s)."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.keep_runs = 0")
    try:
        first = running.insert(FLAKY.format(failures=1, code="40001"), repeat="3 s", retry=1,
                               retry_delay="1.5 s", delete=False, **{"group": "kept"})
        base = running.value("SELECT plan FROM task WHERE id = %s", [first])
        retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2", [first]),
                           20, 0.01, "the retry")
        # (a housekeeping turn or two while the retry waits: the failed run stays)
        wait_until(lambda: running.value("SELECT clock_timestamp() > plan - interval '0.3 s' FROM task WHERE id = %s",
                                         [retry]), 10, 0.01, "the retry's time, nearly")
        assert running.value("SELECT state::text FROM task WHERE id = %s", [first]) == "FAIL"
        nxt = wait_until(lambda: running.value("SELECT plan FROM task WHERE parent = %s AND attempt = 1", [retry]),
                         20, 0.01, "the series' next regular run")
        assert nxt == base + timedelta(seconds=3), (nxt - base)
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id = %s", [first]) == 0, 10, 0.05,
                   "the failed run deleted once its retry has ended")
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.keep_runs")
        running.sql("UPDATE task SET repeat = '0' WHERE state = 'PLAN'")
        running.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")


def test_a_retry_after_the_series_next_run_is_not_inserted(running):
    first = running.insert("SELECT 1/0", repeat="1 s", retry=3, retry_delay="5 s", retry_on="{*}")
    running.wait_done(first)
    nxt = running.sql("SELECT attempt, plan FROM task WHERE parent = %s", [first])
    assert len(nxt) == 1 and nxt[0][0] == 1  # the regular run, not a retry 5 s later
    running.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")


def test_task_retry_runs_an_ended_task_of_ones_own_again(running):
    running.sql("CREATE ROLE alice LOGIN IN ROLE pgtaskpy_user; CREATE ROLE bob LOGIN IN ROLE pgtaskpy_user")
    try:
        alice, bob = running.connect("alice"), running.connect("bob")
        failed = alice.execute("INSERT INTO task (input, retry) VALUES ('SELECT 1/0', 0) RETURNING id").fetchone()[0]
        running.wait_done(failed)
        with pytest.raises(psycopg.errors.NoDataFound, match=f"task {failed} does not exist or is not yours"):
            bob.execute("SELECT task_retry(%s)", [failed])
        # (an admin who sees alice's task, and is not alice: the refusal named the owner check)
        running.sql("GRANT pgtaskpy_admin TO bob")
        with pytest.raises(psycopg.errors.NoDataFound, match=f"task {failed} does not exist or is not yours"):
            bob.execute("SELECT task_retry(%s)", [failed])
        running.sql("REVOKE pgtaskpy_admin FROM bob")
        with pytest.raises(psycopg.errors.NullValueNotAllowed, match="task_retry needs a task id"):
            bob.execute("SELECT task_retry(NULL)")
        waiting = alice.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h')"
                                " RETURNING id").fetchone()[0]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="only a FAIL, GONE or STOP"):
            alice.execute("SELECT task_retry(%s)", [waiting])
        running.sql("UPDATE task SET exclusive = true, target = 'standby' WHERE id = %s", [failed])
        again = alice.execute("SELECT task_retry(%s)", [failed]).fetchone()[0]
        # One run again at a time: a second press of "retry" ran the work twice.
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match=f"task {failed} is being run again already: task {again}"):
            alice.execute("SELECT task_retry(%s)", [failed])
        row = running.wait_done(again)
        assert (row["parent"], row["attempt"], row["owner"], row["state"], row["input"]) == (
            failed, 1, "alice", "FAIL", "SELECT 1/0")
        assert (row["exclusive"], row["target"]) == (True, "standby")  # (with no standby, it ran on the primary)
        with_retry = alice.execute("INSERT INTO task (input, retry, retry_delay, retry_on)"
                                   " VALUES ('SELECT 1/0', 1, '1 hour', '{22012}') RETURNING id").fetchone()[0]
        wait_until(lambda: running.task(with_retry)["state"] == "FAIL", 20, 0.02, "the first attempt's failure")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is being run again already"):
            alice.execute("SELECT task_retry(%s)", [with_retry])  # (its automatic retry waits)
        alice.close()
        bob.close()
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY alice; DROP OWNED BY bob; DROP ROLE alice; DROP ROLE bob")


def test_task_retry_sees_a_later_attempt_of_the_task_still_to_run(db):
    """A task's third attempt waits, behind its failed second: task_retry of the first made
    another run beside it (it looked at the first's own retry only), and the work ran twice."""
    first = db.value("INSERT INTO task (input, retry, state, stop) VALUES ('SELECT 1/0', 3, 'FAIL', now())"
                     " RETURNING id")
    second = db.value("INSERT INTO task (input, retry, parent, attempt, state, stop)"
                      " VALUES ('SELECT 1/0', 3, %s, 2, 'FAIL', now()) RETURNING id", [first])
    third = db.value("INSERT INTO task (input, retry, parent, attempt, plan)"
                     " VALUES ('SELECT 1/0', 3, %s, 3, now() + interval '1 hour') RETURNING id", [second])
    for task_id in (first, second):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match=f"task {task_id} is being run again already: task {third}"):
            db.value("SELECT task_retry(%s)", [task_id])
    assert db.value("SELECT count(*) FROM task") == 3
    db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [third])
    again = db.value("SELECT task_retry(%s)", [first])  # (once the last attempt has ended)
    assert db.task(again)["parent"] == first and db.task(again)["attempt"] == 1


def test_task_retry_of_a_task_that_inserted_a_task_runs_it_again(db):
    """A task's SQL inserted a task (its child, by pg_task.id) that waits, then failed:
    task_retry took that child for a run again of the task, and refused."""
    failed = db.value("INSERT INTO task (input, state, stop) VALUES ('SELECT 1/0', 'FAIL', now()) RETURNING id")
    db.sql("SELECT set_config('pg_task.id', %s, false)", [str(failed)])  # (as in the task's own session)
    child = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 2', now() + interval '1 hour') RETURNING id")
    db.sql("RESET pg_task.id")
    assert db.task(child)["parent"] == failed
    again = db.value("SELECT task_retry(%s)", [failed])
    assert (db.task(again)["input"], db.task(again)["parent"]) == ("SELECT 1/0", failed)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                       match=f"task {failed} is being run again already: task {again}"):
        db.value("SELECT task_retry(%s)", [failed])
    assert db.value("SELECT count(*) FROM task") == 3


def test_task_retry_of_an_exclusive_series_failed_run_by_its_owner(db):
    """An administrator made a role's series exclusive; a run failed.  The owner's task_retry
    was refused ("permission denied to make a task exclusive"): the series' next regular run,
    waiting, was taken for a run again already to come."""
    db.sql("CREATE ROLE erin LOGIN IN ROLE pgtaskpy_user")
    try:
        erin = db.connect("erin")
        failed = db.value("INSERT INTO task (input, repeat, exclusive, owner, state, stop)"
                          " VALUES ('SELECT 1/0', '1 hour', true, 'erin', 'FAIL', now()) RETURNING id")
        db.sql("INSERT INTO task (input, repeat, exclusive, owner, parent, plan)"
               " VALUES ('SELECT 1/0', '1 hour', true, 'erin', %s, now() + interval '1 hour')", [failed])
        again = erin.execute("SELECT task_retry(%s)", [failed]).fetchone()[0]
        row = db.task(again)
        assert (row["exclusive"], row["repeat"], row["owner"], row["parent"]) == (True, timedelta(0), "erin", failed)
        # Still one at a time: another copy of her own is refused while that one waits.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to make a task exclusive"):
            erin.execute("INSERT INTO task (input, exclusive, parent) VALUES ('SELECT 1/0', true, %s)", [failed])
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"being run again already: task {again}"):
            erin.execute("SELECT task_retry(%s)", [failed])
        erin.close()
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP OWNED BY erin; DROP ROLE erin")


def test_two_task_retry_calls_side_by_side_make_one_run(db):
    """Two presses of "retry" at once, each in its own transaction: each saw no run of the task
    yet and made one, and the work ran twice.  The second now waits for the first's commit and
    is refused (55000); in REPEATABLE READ, whose snapshot cannot see that run, it fails to
    serialize (40001)."""
    db.sql("CREATE ROLE dana LOGIN IN ROLE pgtaskpy_user")
    try:
        first, second = db.connect("dana"), db.connect("dana")
        failed = first.execute("INSERT INTO task (input) VALUES ('SELECT 1/0') RETURNING id").fetchone()[0]
        db.sql("UPDATE task SET state = 'FAIL', stop = now() WHERE id = %s", [failed])  # (no launcher here)
        for runs, isolation, refusal in ((1, "READ COMMITTED", psycopg.errors.ObjectNotInPrerequisiteState),
                                         (2, "REPEATABLE READ", psycopg.errors.SerializationFailure)):
            first.execute("BEGIN")
            again = first.execute("SELECT task_retry(%s)", [failed]).fetchone()[0]
            second.execute(f"BEGIN ISOLATION LEVEL {isolation}")
            second.execute("SELECT 1")  # (its snapshot: before the first's commit)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                call = pool.submit(second.execute, "SELECT task_retry(%s)", [failed])
                wait_until(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE usename = 'dana'"
                                            " AND wait_event_type = 'Lock'") == 1, 10, 0.02, "the second call to wait")
                first.execute("COMMIT")
                with pytest.raises(refusal):
                    call.result(10)
            second.execute("ROLLBACK")
            assert db.value("SELECT count(*) FROM task WHERE parent = %s", [failed]) == runs
            db.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [again])  # (ended: the next round may retry)
        first.close()
        second.close()
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP OWNED BY dana; DROP ROLE dana")


def test_task_retry_of_a_series_run_sees_its_automatic_retry(running):
    """A series' run that failed and waits for its automatic retry (a row with the series' repeat,
    attempt 2) is being run again already: task_retry took that row for the series' next regular
    run and made a second run beside it."""
    failed = running.value("SELECT task_enqueue('SELECT 1/0', repeat => '1 hour', retry => 1, retry_on => '{*}',"
                           " retry_delay => '1 min')")
    wait_until(lambda: running.task(failed)["state"] == "FAIL", 20, 0.02, "the first attempt's failure")
    retry = running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2", [failed])
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                       match=f"task {failed} is being run again already: task {retry}"):
        running.sql("SELECT task_retry(%s)", [failed])
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [failed]) == 1
    running.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")


def test_the_launcher_log_says_whether_and_when_a_failed_task_runs_again(db):
    launcher = db.launcher()
    first = db.insert(FLAKY.format(failures=1, code="40001"), retry=5, retry_delay="0.2 s")
    never = db.insert("SELECT 1/0", retry=5, **{"group": "other"})
    wait_attempts(db, first, 2)
    db.wait_done(never)
    assert launcher.stop() == 0
    log = launcher.output()
    assert f"task {first} FAIL in " in log
    assert " (40001), retry 1 of 5 at " in log
    assert f"task {never} FAIL in " in log and "(22012), no retry: ERROR:  division by zero" in log


@pytest.mark.parametrize("column, value, message", [
    ("retry", -1, "task.retry must be from 0 to 2147483646"),
    ("retry_delay", "-1 s", "task.retry_delay and retry_max must be at most 1000 years"),
    ("retry_max", "1001 years", "task.retry_delay and retry_max must be at most 1000 years"),
    ("retry_on", "{4000}", "task.retry_on must hold SQLSTATEs"),
    ("retry_on", "{40001,NULL}", "task.retry_on must hold SQLSTATEs"),
    ("retry_on", '{"22,22012"}', "task.retry_on must hold SQLSTATEs"),  # (one element, matching nothing)
])
def test_impossible_retry_settings_are_rejected(db, column, value, message):
    with pytest.raises(psycopg.errors.CheckViolation, match=message):
        db.insert("SELECT 1", **{column: value})
    assert db.value("SELECT count(*) FROM task") == 0


def test_attempt_and_sqlstate_are_the_schedulers(db):
    db.sql("CREATE ROLE carol LOGIN IN ROLE pgtaskpy_user")
    try:
        carol = db.connect("carol")
        for column, value in (("attempt", 2), ("sqlstate", "40001")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"denied to write task.{column}"):
                carol.execute(f"INSERT INTO task (input, {column}) VALUES ('SELECT 1', %s)", [value])
        task_id = carol.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 h')"
                                " RETURNING id").fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="denied to write task.attempt"):
            carol.execute("UPDATE task SET attempt = 5 WHERE id = %s", [task_id])
        carol.close()
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP OWNED BY carol; DROP ROLE carol")


def test_an_attempt_below_one_is_rejected(db):
    """An administrator's attempt of 0 or less gave the task more retries than its retry says."""
    with pytest.raises(psycopg.errors.CheckViolation, match="task.attempt must be at least 1"):
        db.insert("SELECT 1", attempt=0)
    task_id = db.insert("SELECT 1", plan="2100-01-01")
    with pytest.raises(psycopg.errors.CheckViolation, match="task.attempt must be at least 1"):
        db.sql("UPDATE task SET attempt = -3 WHERE id = %s", [task_id])
    assert db.sql("SELECT attempt FROM task") == [(1,)]


def test_settings_give_the_retry_defaults(db):
    db.sql("SET pg_task.retry = 3; SET pg_task.retry_delay = '2 s'; SET pg_task.retry_on = '{*}';"
           " SET pg_task.retry_unsafe = on")
    row = db.task(db.insert("SELECT 1"))
    assert (row["retry"], row["retry_delay"], row["retry_on"], row["retry_unsafe"], row["attempt"]) == (
        3, timedelta(seconds=2), ["*"], True, 1)
    db.sql("RESET pg_task.retry; RESET pg_task.retry_delay; RESET pg_task.retry_on; RESET pg_task.retry_unsafe")
    row = db.task(db.insert("SELECT 1"))
    assert (row["retry"], row["retry_delay"], row["retry_max"], row["retry_on"], row["retry_unsafe"]) == (
        0, timedelta(seconds=10), timedelta(hours=1), ["40001", "40P01", "55P03", "08"], False)
    db.sql("SET pg_task.retry_on = 'oops'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='setting "pg_task.retry_on"'):
        db.insert("SELECT 1")


@pytest.mark.parametrize(("input", "retry", "ends"), [
    ("SELECT pg_sleep(1), 'ran'", 0, ("DONE", None)),
    ("SELECT pg_sleep(1); SELECT 1/0", 1, ("FAIL", "22012")),
])
def test_a_run_whose_key_gets_a_waiting_task_from_an_open_transaction_ends_as_it_ran(running, input, retry, ends):
    """An application's task_enqueue under the key of a running series run (or of a run that will
    be retried), in a transaction that commits after that run's SQL has ended: the end waits for
    that transaction (the key's one waiting task), and then ended FAIL, `what follows the task
    failed: duplicate key value ... "task_key_waiting"` (23505), the series' run that had worked
    too.  It ends as it ran, and the application's task goes on for the series, as one committed
    earlier does."""
    run = running.value("SELECT task_enqueue(%s, key => 'job', repeat => '1 hour', retry => %s::integer,"
                        " retry_on => '{*}')", [input, retry])
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [run]) == "WORK", 20,
               message="the run to start")
    with running.connect() as app:
        with app.transaction():
            app.execute("SELECT task_enqueue('SELECT 2', key => 'job', repeat => '1 hour',"
                        " plan => now() + interval '1 hour')")
            wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                             " AND application_name = 'pg_task_py worker'") == 1, 20,
                       message="the run's end to wait for the application's transaction")
    row = running.wait_done(run)
    assert (row["state"], row["sqlstate"]) == ends, row
    assert "task_key_waiting" not in (row["error"] or ""), row["error"]
    assert running.sql("SELECT input, parent FROM task WHERE key = 'job' AND id <> %s", [run]) == [("SELECT 2", run)]


def test_an_output_past_the_limit_is_retried_only_if_retry_unsafe_as_its_work_may_have_committed(running):
    """The scheduler's FAIL 54000 of an output past pg_task_py.output_limit comes once the input
    has run, its work committed perhaps: retried as the server's own 54000 (which rolls back),
    the work ran again at each attempt (a probe: three rows of one task's work).  Only with
    retry_unsafe, as a lost run; the server's 54000 is retried as before."""
    running.sql("CREATE TABLE work_done (task_id bigint)")
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 1000")
    work = ("INSERT INTO work_done VALUES (current_setting('pg_task.id')::bigint);"
            " SELECT repeat('x', 5000)")
    kept = running.insert(work, retry=2, retry_delay="0.1 s", retry_on=["*"], delete=False)
    row = running.wait_done(kept)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "54000"), row
    unsafe = running.insert(work, retry=1, retry_delay="0.1 s", retry_on=["54000"], retry_unsafe=True, delete=False)
    assert [r["state"] for r in wait_attempts(running, unsafe, 2)] == ["FAIL", "FAIL"]
    server = running.insert(FLAKY.format(failures=1, code="54000"), retry=1, retry_delay="0.1 s", retry_on=["54"],
                            delete=False)
    assert [r["state"] for r in wait_attempts(running, server, 2)] == ["FAIL", "DONE"]
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [kept]) == 0
    assert running.value("SELECT count(*) FROM work_done WHERE task_id = %s", [kept]) == 1  # its work, once


def test_task_enqueue_task_schedule_and_task_chain_take_retry_arguments(running):
    """The functions users enqueue with take the retry columns as arguments, as an INSERT does;
    task_schedule's replace gives the unset ones their defaults, as it does its other arguments."""
    flaky = FLAKY.format(failures=1, code="40001")
    first = running.value("SELECT task_enqueue(%s, retry => 1, retry_delay => '0.2 s')", [flaky])
    assert [r["state"] for r in wait_attempts(running, first, 2)] == ["FAIL", "DONE"]

    # A chain's steps each retry; the step after a retried one waits for the retry.
    steps = running.value("SELECT task_chain(ARRAY[%s, 'SELECT ''after''', %s], retry => 1, retry_delay => '0.2 s',"
                          " retry_on => '{40}')", [flaky, FLAKY.format(failures=1, code="40P01")])
    assert [r["state"] for r in wait_attempts(running, steps[2], 2)] == ["FAIL", "DONE"]
    assert [r["state"] for r in wait_attempts(running, steps[0], 2)] == ["FAIL", "DONE"]
    assert running.task(steps[1])["output"] == "after"
    assert {running.task(step)["retry_on"][0] for step in steps} == {"40"}

    columns = "SELECT retry, retry_delay, retry_max, retry_on, retry_unsafe FROM task WHERE key = 'nightly'"
    running.value("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1', retry => 2, retry_delay => '1 min',"
                  " retry_max => '10 min', retry_on => '{*}', retry_unsafe => true)")
    assert running.sql(columns) == [(2, timedelta(minutes=1), timedelta(minutes=10), ["*"], True)]
    running.value("SELECT task_schedule('nightly', '0 4 * * *', 'SELECT 1', retry => 1)")
    assert running.sql(columns) == [
        (1, timedelta(seconds=10), timedelta(hours=1), ["40001", "40P01", "55P03", "08"], False)]
    with pytest.raises(psycopg.errors.CheckViolation, match="task.retry_on must hold SQLSTATEs"):
        running.value("SELECT task_schedule('nightly', '0 5 * * *', 'SELECT 2', retry_on => '{oops}')")
    assert running.value("SELECT cron FROM task WHERE key = 'nightly'") == "0 4 * * *"  # unchanged
    with pytest.raises(psycopg.errors.CheckViolation, match="task.retry must be from 0"):
        running.value("SELECT task_enqueue('SELECT 1', retry => -1)")


def test_every_fail_keeps_its_sqlstate(running):
    cases = {
        "SELECT 1/0": "22012",
        "SELECT * FROM no_such_table": "42P01",
        "CREATE TEMP TABLE c (i int); COPY c FROM STDIN": "0A000",
    }
    ids = {running.insert(sql, **{"group": f"g{i}"}): code for i, (sql, code) in enumerate(cases.items())}
    unreachable = running.insert("SELECT 1", remote="host=127.0.0.1 port=1 connect_timeout=5")
    malformed = running.insert("SELECT 1", remote="no equals sign")
    for task_id, code in ids.items():
        assert running.wait_done(task_id)["sqlstate"] == code
    assert running.wait_done(malformed)["sqlstate"] == "22023"
    assert running.wait_done(unreachable)["sqlstate"] == "08001"


def test_a_remote_task_retries_against_its_remote_on_a_connection_failure(running):
    # Class 08 is in the default retry_on: a remote that cannot be reached now may be reachable later.
    remote = "host=127.0.0.1 port=1 connect_timeout=5"
    first = running.insert("SELECT 1", remote=remote, retry=1, retry_delay="0 s")
    rows = wait_attempts(running, first, 2)
    assert [(r["attempt"], r["state"], r["sqlstate"]) for r in rows] == [(1, "FAIL", "08001"), (2, "FAIL", "08001")]
    assert running.value("SELECT remote FROM task WHERE id = %s", [rows[1]["id"]]) == remote
    assert "could not open the task's session" in rows[1]["error"]


def test_a_dependent_waits_for_its_prerequisites_retry(running):
    flaky = running.insert(FLAKY.format(failures=1, code="40001"), retry=2, retry_delay="0.2 s", delete=False)
    hopeless = running.insert("SELECT 1/0", retry=1, retry_delay="0 s", retry_on="{*}", **{"group": "other"})
    after_flaky = running.insert("SELECT 'after flaky'", after=[flaky], **{"group": "g1"})
    after_hopeless = running.insert("SELECT 'after hopeless'", after=[hopeless], **{"group": "g2"})
    attempts_of_flaky = wait_attempts(running, flaky, 2)
    assert running.wait_done(after_flaky)["output"] == "after flaky"
    assert running.task(after_flaky)["start"] > attempts_of_flaky[1]["stop"]
    assert running.task(after_flaky)["after"] == [attempts_of_flaky[1]["id"]]  # it names the retry
    last = wait_attempts(running, hopeless, 2)[-1]
    row = running.wait_done(after_hopeless)
    assert (row["state"], row["error"]) == ("STOP", f"ERROR:  prerequisite task {last['id']} ended FAIL")

def test_retention_keeps_a_failed_run_whose_retry_waits(running):
    """retention_fail 0 deleted a one-off's failed attempt while its retry waited (a series' run
    it kept): a dependent whose INSERT was open as the first attempt failed then found the chain
    of attempts cut at its commit, and stopped; and task_retry of the first attempt ran it again
    beside its retry (a probe)."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention_fail = '0'")
    first = running.value("SELECT task_enqueue(%s, plan => clock_timestamp() + interval '1 s', retry => 2,"
                          " retry_delay => '2 s', retry_on => '{40001}')", [FLAKY.format(failures=2, code="40001")])
    with running.connect() as open_insert:
        open_insert.execute("BEGIN")
        dependent = open_insert.execute("INSERT INTO task (input, after, delete) VALUES ('SELECT ''ran''', %s, false)"
                                        " RETURNING id", [[first]]).fetchone()[0]
        second = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2"
                                                  " AND state = 'FAIL'", [first]), 20, message="attempt 2 failed")
        # (it fails after attempt 2, and a retention pass past attempt 2 deletes it; its FAIL may
        # last a moment only, before the next pass: waited for gone, not FAIL)
        marker = running.insert("SELECT 1/0")
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id = %s", [marker]) == 0, 30,
                   message=f"retention's pass: {running.task(marker)}")
        assert running.value("SELECT state::text FROM task WHERE parent = %s", [second]) == "PLAN"  # attempt 3
        assert running.value("SELECT count(*) FROM task WHERE id = %s", [second]) == 1
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="being run again already"):
            running.value("SELECT task_retry(%s)", [first])
        open_insert.execute("COMMIT")
    row = running.wait_done(dependent, 30)
    assert (row["state"], row["output"]) == ("DONE", "ran"), row


SERIES_FAILING = "DO $$BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = '40001'; END$$"


def series_with_a_waiting_retry(db, key):
    """The id of the waiting retry (attempt 2, an hour away) of the first run of the series `key`
    (SERIES_FAILING on 1 January at midnight, retry 1), which has just failed."""
    first = db.value("SELECT task_schedule(%s, '0 0 1 1 *', %s, retry => 1, retry_delay => '1 hour')",
                     [key, SERIES_FAILING])
    db.sql("UPDATE task SET plan = now() WHERE id = %s", [first])
    return wait_until(lambda: db.value("SELECT id FROM task WHERE parent = %s AND attempt = 2 AND state = 'PLAN'",
                                       [first]), 20, 0.05, "the retry to wait")


def test_a_series_given_a_new_schedule_while_a_retry_waits_starts_again_with_attempt_one(running):
    """The waiting retry (attempt 2) took the new cron in place and kept its attempt: the new
    definition's first run had fewer retries than it says."""
    retry = series_with_a_waiting_retry(running, "rt")
    new = running.value("SELECT task_schedule('rt', '0 0 2 1 *', %s, retry => 1)", [SERIES_FAILING])
    assert new != retry
    assert running.value("SELECT state::text FROM task WHERE id = %s", [retry]) == "STOP"
    assert running.sql("SELECT cron, attempt, retry FROM task WHERE key = 'rt' AND state = 'PLAN'") == [
        ("0 0 2 1 *", 1, 1)]
    same = running.value("SELECT task_schedule('rt', '0 0 2 1 *', 'SELECT 2', retry => 1)")  # (no new schedule)
    assert same == new


def test_a_series_given_a_new_input_while_a_retry_waits_starts_again_with_attempt_one(running):
    """The waiting retry (attempt 2) of a series whose input changed took the new input, and ran it
    at the old run's retry time, as attempt 2 with fewer retries.  The same call again leaves it."""
    retry = series_with_a_waiting_retry(running, "ri")
    same = running.value("SELECT task_schedule('ri', '0 0 1 1 *', %s, retry => 1, retry_delay => '1 hour')",
                         [SERIES_FAILING])
    assert same == retry and running.task(retry)["state"] == "PLAN"
    new = running.value("SELECT task_schedule('ri', '0 0 1 1 *', 'SELECT 2', retry => 1)")
    assert new != retry
    assert running.task(retry)["state"] == "STOP"
    assert running.sql("SELECT input, attempt, extract(month FROM plan AT TIME ZONE 'UTC') FROM task"
                       " WHERE key = 'ri' AND state = 'PLAN'") == [("SELECT 2", 1, 1)]
