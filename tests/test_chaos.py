"""Faults under load: killed worker backends and task sessions, SIGKILLed launchers, several
launchers at once, server restarts, failovers to a standby.  At the end the table itself must
show that no task was lost, none ran twice, none is stuck, every repeat series has exactly one
next run, and every retry the rules ask for was inserted once (a third of the tasks retry every
error twice).

The default run lasts about 30 s; CHAOS_SECONDS=600 makes it a soak.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pg_task_py_testing import Launcher, multi_host_dsn, replicated_pair, throwaway_cluster, wait_until

CHAOS_SECONDS = float(os.environ.get("CHAOS_SECONDS", "30"))
ONE_OFF_TASKS = 1500
SERIES = 10

# Each one-off task records its own id: a second run would violate the primary key and FAIL.
AUDITED = "INSERT INTO audit VALUES (current_setting('pg_task.id')::bigint); {extra}"


pytestmark = pytest.mark.chaos


@pytest.fixture
def chaos_cluster():
    """A cluster of its own (testing.postgresql): the test restarts it, fast and immediate."""
    with throwaway_cluster() as cluster:
        cluster.create_database("chaos")
        yield cluster


def connect(cluster):
    """A connection that survives the server restarts of the test."""
    return wait_until(lambda: try_connect(cluster), 60, 0.2, "the server to accept connections")


def try_connect(cluster):
    try:
        return cluster.connect("chaos")
    except Exception:  # noqa: BLE001 - the server is restarting
        return None


def enqueue(conn, rng: random.Random) -> None:
    conn.execute("CREATE TABLE audit (task_id bigint PRIMARY KEY)")
    extras = ["SELECT 1"] * 6 + ["SELECT 1/0"] + ["SELECT pg_sleep(0.2)"] * 2 + ["SELECT pg_sleep(0.02)"]
    rows = [(AUDITED.format(extra=rng.choice(extras)), f"g{rng.randrange(12)}", rng.choice([0, 0, 1, 3]),
             rng.choice([0, 0, 2])) for _ in range(ONE_OFF_TASKS)]
    with conn.cursor() as cursor:
        cursor.executemany('INSERT INTO task (input, "group", max, retry, retry_delay, retry_on, delete)'
                           " VALUES (%s, %s, %s, %s, '0.05 s', '{*}', false)", rows)
    for i in range(SERIES):
        conn.execute("INSERT INTO task (input, \"group\", repeat, delete, data)"
                     " VALUES ('SELECT pg_sleep(0.05)', %s, '0.3 s', false, 'series')", [f"series{i}"])


def test_no_task_lost_or_run_twice_under_faults(chaos_cluster):
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "7")))
    cluster = chaos_cluster
    launchers = [Launcher(cluster.dsn("chaos"), args=("--grace", "2")).start() for _ in range(2)]
    faults: dict[str, int] = {}
    try:
        with connect(cluster) as conn:
            enqueue(conn, rng)
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 1.5))
            fault = rng.choice(["terminate worker", "terminate task session", "kill launcher",
                                "third launcher", "terminate worker", "terminate task session",
                                "restart fast", "restart immediate"])
            faults[fault] = faults.get(fault, 0) + 1
            if fault.startswith("terminate"):
                app = "pg_task_py worker" if fault == "terminate worker" else "pg_task_py task"
                conn = try_connect(cluster)
                if conn is not None:
                    with conn:
                        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                     " WHERE application_name = %s ORDER BY random() LIMIT 1", [app])
            elif fault == "kill launcher":
                victim = rng.choice(launchers)
                victim.signal(signal.SIGKILL)
                victim.process.wait(10)
                launchers.remove(victim)
                launchers.append(Launcher(cluster.dsn("chaos"), args=("--grace", "2")).start())
            elif fault == "third launcher" and len(launchers) < 3:
                launchers.append(Launcher(cluster.dsn("chaos"), args=("--grace", "2")).start())
            elif fault.startswith("restart"):
                cluster.restart(fault.split()[1])
        # Faults over: stop the repeat series, let everything else end.
        with connect(cluster) as conn:
            settle(conn)
            check_invariants(conn, faults)
    finally:
        statuses = [launcher.stop(30) for launcher in launchers]
    assert statuses == [0] * len(statuses), [launcher.output()[-2000:] for launcher in launchers]
    tracebacks = [launcher.output() for launcher in launchers if "Traceback" in launcher.output()]
    assert not tracebacks, tracebacks[0][tracebacks[0].index("Traceback") - 500:][:3000]


def check_retries(conn, one_off: str) -> None:
    """Each failed attempt with attempts left has exactly one retry, unless the scheduler lost it
    while it ran (08006, or its session terminated: 57P01, 57P02; it may have done its work) or it
    was cancelled; no attempt has two."""
    retried = conn.execute(
        f"SELECT f.id, f.attempt, f.retry, f.sqlstate, f.start IS NOT NULL,"
        f" (SELECT count(*) FROM task AS r WHERE r.parent = f.id AND r.attempt = f.attempt + 1)"
        f" FROM task AS f WHERE {one_off.replace('input', 'f.input')} AND f.state = 'FAIL'").fetchall()
    for task_id, attempt, retry, sqlstate, started, retries in retried:
        lost = sqlstate in ("08006", "57P01", "57P02") and started
        wanted = 1 if attempt <= retry and not lost and sqlstate not in (None, "57014") else 0
        assert retries == wanted, (task_id, attempt, retry, sqlstate, started, retries)
    assert conn.execute(f"SELECT count(*) FROM task WHERE {one_off} AND state = 'FAIL' AND sqlstate IS NULL"
                        ).fetchone()[0] == 0


def test_no_task_lost_or_run_twice_across_failovers():
    """The failover round: a launcher on each node and one following the primary (multi-host conninfo)
    while the primary is stopped (fast or immediate), the standby promoted and the old primary
    rewound to be the new standby, between killed workers and launchers."""
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "7")))
    with replicated_pair() as pair:
        nodes = [pair.primary, pair.standby]
        dsn = multi_host_dsn(nodes, "chaos", target_session_attrs="read-write")
        with pair.primary.connect() as conn:
            conn.execute("CREATE DATABASE chaos")
        with pair.primary.connect("chaos") as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
            enqueue(conn, rng)
        pair.wait_replayed()
        dsns = [nodes[0].dsn("chaos"), nodes[1].dsn("chaos"), dsn]
        # --run: two launchers schedule the primary at once; this test's own connections (promotion,
        # pg_rewind) need free slots, which the other test leaves to the launchers' learnt limit.
        args = ("--grace", "2", "--run", "15")
        launchers = [Launcher(d, args=args).start() for d in dsns]
        faults: dict[str, int] = {}
        try:
            deadline = time.monotonic() + CHAOS_SECONDS
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.5, 2.0))
                fault = rng.choice(["fail over fast", "fail over immediate", "terminate worker", "kill launcher"])
                faults[fault] = faults.get(fault, 0) + 1
                if fault.startswith("fail over"):
                    pair.fail_over(fault.split()[2])
                    pair.rejoin("pg_rewind")
                elif fault == "terminate worker":
                    conn = try_connect(pair.primary)  # (None when the server has no connection to spare)
                    if conn is not None:
                        with conn:
                            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                         " WHERE application_name = 'pg_task_py worker' ORDER BY random() LIMIT 1")
                else:
                    victim = rng.randrange(len(launchers))
                    launchers[victim].signal(signal.SIGKILL)
                    launchers[victim].process.wait(10)
                    launchers[victim] = Launcher(dsns[victim], args=args).start()
            with connect(pair.primary) as conn:
                settle(conn)
                check_invariants(conn, faults)
            # The standby's launcher ran nothing while it waited: no worker of it there.
            with connect(pair.standby) as conn:
                assert conn.execute("SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name = 'pg_task_py worker'").fetchone()[0] == 0
        finally:
            statuses = [launcher.stop(30) for launcher in launchers]
        assert statuses == [0] * len(statuses), [launcher.output()[-2000:] for launcher in launchers]
        tracebacks = [launcher.output() for launcher in launchers if "Traceback" in launcher.output()]
        assert not tracebacks, tracebacks[0][tracebacks[0].index("Traceback") - 500:][:3000]


def settle(conn) -> None:
    """Faults over: stop the repeat series and wait until every other task has ended."""
    def settled() -> bool:
        conn.execute("UPDATE task SET state = 'STOP' WHERE state = 'PLAN' AND data = 'series'")
        unfinished = "SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')"
        return conn.execute(unfinished).fetchone()[0] == 0
    wait_until(settled, 120, 0.2, "every task to end")


def check_invariants(conn, faults: dict[str, int]) -> None:
    one_off = "input LIKE 'INSERT INTO audit%%'"
    counts = dict(conn.execute(f"SELECT state::text, count(*) FROM task WHERE {one_off} AND attempt = 1"
                               " GROUP BY 1").fetchall())
    # Nothing lost: every one-off task ended, DONE or FAIL, once.
    assert sum(counts.values()) == ONE_OFF_TASKS, counts
    check_retries(conn, one_off)
    assert set(counts) <= {"DONE", "FAIL"}, counts
    # Nothing ran twice: a second run of a task would have hit the audit table's key.
    twice = conn.execute(f"SELECT count(*) FROM task WHERE {one_off} AND error LIKE '%%duplicate key%%'").fetchone()[0]
    assert twice == 0
    # Every DONE task ran, exactly once.
    missing = conn.execute(f"SELECT count(*) FROM task t WHERE {one_off} AND state = 'DONE'"
                           " AND NOT EXISTS (SELECT FROM audit a WHERE a.task_id = t.id)").fetchone()[0]
    assert missing == 0
    # Every FAIL says why.
    assert conn.execute(f"SELECT count(*) FROM task WHERE {one_off} AND state = 'FAIL' AND error IS NULL"
                        ).fetchone()[0] == 0
    # Repeat series: no run has two next runs, and each series ends in exactly one stopped next run.
    assert conn.execute("SELECT count(*) FROM (SELECT parent FROM task WHERE data = 'series' AND parent IS NOT NULL"
                        " GROUP BY parent HAVING count(*) > 1) AS d").fetchone()[0] == 0
    stopped = conn.execute("SELECT \"group\", count(*) FROM task WHERE data = 'series' AND state = 'STOP'"
                           " GROUP BY 1").fetchall()
    assert len(stopped) == SERIES and all(n == 1 for _, n in stopped), stopped
    ran = conn.execute("SELECT count(*) FROM audit").fetchone()[0]
    failed_by_faults = conn.execute(f"SELECT count(*) FROM task WHERE {one_off} AND state = 'FAIL'"
                                    " AND error NOT LIKE 'ERROR:  division by zero%%'").fetchone()[0]
    reasons = conn.execute(f"SELECT split_part(error, E'\\n', 1), count(*) FROM task WHERE {one_off}"
                           " AND state = 'FAIL' GROUP BY 1 ORDER BY 2 DESC").fetchall()
    print(f"\nchaos: {ONE_OFF_TASKS} one-off tasks, {counts}, audit rows {ran}, failed by faults {failed_by_faults},"
          f" faults {faults}, lost 0, duplicated 0\nwhy they failed: {reasons}")


def test_a_start_outlives_an_immediate_restart_with_synchronous_commit_off():
    """The commit of WORK could still be in the WAL buffers when the server went down (the
    cluster's synchronous_commit is off): the task was waiting again after recovery and ran a
    second time, its effect outside the database twice (3 restarts in 5, a probe).  The WAL
    writer's ten-second delay keeps such a commit unflushed until the restart."""
    runs = Path(tempfile.mkdtemp(prefix="pgtaskpy_runs_"))  # (the server's OS user writes there)
    runs.chmod(0o777)
    log = runs / "started"
    record = f"COPY (SELECT current_setting('pg_task.id')) TO PROGRAM 'cat >> {log}'; SELECT pg_sleep(60)"
    with throwaway_cluster({"wal_writer_delay": "10000ms", "wal_writer_flush_after": "1GB"}) as cluster:
        cluster.create_database("chaos")
        launcher = Launcher(cluster.dsn("chaos")).start()
        try:
            with connect(cluster) as conn:
                conn.execute("SET synchronous_commit = on")
                ids = [conn.execute("INSERT INTO task (input, \"group\", delete) VALUES (%s, %s, false) RETURNING id",
                                    [record, f"g{i}"]).fetchone()[0] for i in range(5)]
            wait_until(lambda: log.exists() and len(log.read_text().split()) == 5, 30, 0.05, "every task to start")
            cluster.restart("immediate")

            def settled() -> bool:
                with connect(cluster) as conn:
                    waiting = conn.execute(
                        "SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')").fetchone()[0]
                return waiting == 0 or len(log.read_text().split()) > 5
            wait_until(settled, 60, 0.2, "the tasks to end or run again")
            assert sorted(log.read_text().split()) == sorted(str(i) for i in ids)
            with connect(cluster) as conn:
                assert conn.execute("SELECT array_agg(DISTINCT state::text) FROM task").fetchone()[0] == ["FAIL"]
        finally:
            launcher.stop()
            shutil.rmtree(runs, ignore_errors=True)


def sessions_before_login(admin) -> list[int]:
    """Backends of the server of `admin` that the postmaster has forked and that have not read
    their login yet (their title is still the postmaster's command line)."""
    data = admin.execute("SHOW data_directory").fetchone()[0]
    postmaster = Path(data, "postmaster.pid").read_text().split()[0]
    listed = subprocess.run(["ps", "--ppid", postmaster, "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in listed.splitlines() if line.split()[1].endswith("/postgres")]


def test_a_task_whose_session_the_server_ends_as_it_opens_waits_and_runs():
    """A fast or immediate shutdown ends the sessions being opened before it reaches their
    workers: such a task ended FAIL 08001 without having run, with pg_hba.conf's hint, and for
    good without a retry (a probe: 3 tasks of 6,000 in bursts across 20 restarts).  Here the
    task's session is held before its login (pre_auth_delay) and ended as a shutdown ends it
    (SIGTERM: the server closes the connection without a word)."""
    with throwaway_cluster() as cluster:
        cluster.create_database("chaos")
        launcher = Launcher(cluster.dsn("chaos")).start()
        try:
            with connect(cluster) as admin:
                admin.execute("ALTER SYSTEM SET pre_auth_delay = '3s'")
                admin.execute("SELECT pg_reload_conf()")

                def login_waits() -> bool:
                    began = time.monotonic()
                    cluster.connect("chaos").close()
                    return time.monotonic() - began > 2
                wait_until(login_waits, 60, 0.1, "new sessions to wait before their login")
                task = admin.execute("INSERT INTO task (input, delete) VALUES ('SELECT ''ran''', false)"
                                     " RETURNING id").fetchone()[0]
                told = f"task {task} waits: its session's server is starting up or shutting down"

                def end_sessions_opening() -> bool:
                    # (an idle worker backend may be opening beside the task's session, or before it: while
                    # the task's worker runs it, every session opening is ended until the task's has been, or
                    # the task has ended otherwise)
                    running = admin.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE state = 'active'"
                                            " AND query LIKE format('CALL pgtaskpy.run_task(%%s,%%%%', %s::bigint))",
                                            [task]).fetchone()[0]
                    for pid in sessions_before_login(admin) if running else []:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
                    return told in launcher.output() or admin.execute(
                        "SELECT state NOT IN ('PLAN', 'TAKE', 'WORK') FROM task WHERE id = %s", [task]).fetchone()[0]
                wait_until(end_sessions_opening, 30, 0.05, "the task's session to be ended as it opens")
                admin.execute("ALTER SYSTEM RESET pre_auth_delay")
                admin.execute("SELECT pg_reload_conf()")
                row = wait_until(lambda: admin.execute(
                    "SELECT state::text, output, sqlstate, error FROM task WHERE id = %s AND state NOT IN"
                    " ('PLAN', 'TAKE', 'WORK')", [task]).fetchone(), 30, 0.1, "the task to end")
            assert row[:2] == ("DONE", "ran"), row
            # (its session was the one ended; the log says why it waits, not "no free connection")
            assert told in launcher.output(), launcher.output()
        finally:
            launcher.stop()
