"""Standbys and failover, against a real primary and a streaming standby made by `pg_basebackup -R`
(testkit's ReplicatedPair): a launcher on a standby runs nothing and takes over within 2 s of a
promotion; a launcher given every node follows the primary; what becomes of each task at a
failover; an old primary rejoining as a standby runs nothing."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest
from pg_task_py_testing import (
    Launcher,
    ReplicatedPair,
    free_port,
    multi_host_dsn,
    replicated_pair,
    scrape,
    wait_until,
)

pytestmark = pytest.mark.failover

DB = "app"
ACTIVE = "scheduling (active)"
WAITING = "waiting for a promotion"
# Each one-off task records its own id: a second run would violate the primary key and FAIL.
AUDITED = "INSERT INTO audit VALUES (current_setting('pg_task.id')::bigint)"
WORKER_GONE = "ERROR:  task worker ended before the task finished"
# A run whose session the old primary's stop ended before its worker: the worker wrote that end
# itself, and the stop sent it to the standby (seen under a CPU load).
SESSION_STOPPED = "FATAL:  terminating connection due to administrator command"


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    """A primary with database `app` (the extension, table audit) and its streaming standby."""
    with replicated_pair() as pair:
        with pair.primary.connect() as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with pair.primary.connect(DB) as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
            conn.execute("CREATE TABLE audit (task_id bigint PRIMARY KEY,"
                         " ran_at timestamptz DEFAULT clock_timestamp())")
        pair.wait_replayed()
        launchers: list[Launcher] = []
        pair.launchers = launchers
        try:
            yield pair
        finally:
            for launcher in launchers:
                launcher.kill()


def launch(pair: ReplicatedPair, dsn: str) -> Launcher:
    launcher = Launcher(dsn, args=("--grace", "1")).start()
    pair.launchers.append(launcher)
    return launcher


def wait_log(launcher: Launcher, text: str, timeout: float = 30.0, after: int = 0) -> None:
    wait_until(lambda: text in launcher.output()[after:] or launcher.process.poll() is not None, timeout,
               message=f"{text!r} in the launcher's log")
    assert launcher.process.poll() is None, f"launcher exited:\n{launcher.output()}"


def workers_on(node) -> int:
    with node.connect(DB) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_task_py %%'"
                            " AND application_name NOT IN ('pg_task_py launcher', 'pg_task_py listener')"
                            ).fetchone()[0]


def started(launcher: Launcher, after: int = 0) -> list[str]:
    return re.findall(r"task \d+ started", launcher.output()[after:])


def test_a_standby_launcher_runs_nothing_and_writes_nothing(pair):
    on_primary = launch(pair, pair.primary.dsn(DB))
    on_standby = launch(pair, pair.standby.dsn(DB))
    on_primary.wait_active()
    wait_log(on_standby, WAITING)
    with pair.primary.connect(DB) as conn:
        ids = [conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                            [f"{AUDITED}; SELECT pg_is_in_recovery()"]).fetchone()[0] for _ in range(5)]
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE state = 'DONE'").fetchone()[0] == 5, 20,
                   message="the primary's launcher to run the tasks")
        outputs = conn.execute("SELECT output FROM task WHERE id = ANY(%s)", [ids]).fetchall()
    assert {output for (output,) in outputs} == {"INSERT 0 1\nf"}
    pair.wait_replayed()
    # The standby's launcher stayed connected, opened no worker and wrote nothing (a standby refuses writes:
    # any attempt would have logged an error and reconnected).
    time.sleep(1.5)  # three of its looks for a promotion
    assert on_standby.process.poll() is None
    assert started(on_standby) == []
    assert workers_on(pair.standby) == 0
    log = on_standby.output()
    assert log.count(WAITING) == 1, log
    assert "WARNING" not in log and "ERROR" not in log and ACTIVE not in log, log
    # dispatch() itself, called on a standby, claims nothing and answers "standby".
    with pair.standby.connect(DB) as conn:
        events, wake_in, running = conn.execute("SELECT * FROM pgtaskpy.dispatch(10)").fetchone()
    assert (events, running) == ([{"event": "standby"}], 0) and 0 < wake_in <= 1
    # A waiting launcher stops at once, cleanly.
    assert on_standby.stop(timeout=5) == 0
    assert on_standby.output().rstrip().endswith("stopped"), on_standby.output()


def health(port: int) -> int:
    return scrape(port, "/health")[0]


def test_a_standby_launcher_is_healthy_while_it_waits(pair):
    """Its looks for a promotion are its turns: /health answered 503 on every standby past its
    first 5 s, and a liveness probe restarted launchers that did as README says."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launcher = Launcher(pair.standby.dsn(DB), args=("--grace", "1", "--metrics", f"127.0.0.1:{port}")).start()
    pair.launchers.append(launcher)
    wait_log(launcher, WAITING)
    wait_until(lambda: health(port) == 200, 10, message="/health 200")
    until = time.monotonic() + 7  # past the 5 s a turn may be old
    while time.monotonic() < until:
        assert health(port) == 200
        time.sleep(0.5)


def test_a_launcher_on_a_standby_with_hot_standby_off_says_so_once_and_takes_over_within_2_s():
    """Such a standby refuses connections (57P03): the launcher logged a warning at each attempt,
    its backoff grew to 10 s, and the takeover after a promotion took as long."""
    with replicated_pair() as pair:
        with pair.primary.connect() as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with pair.primary.connect(DB) as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
        pair.wait_replayed()
        pair.standby.stop()
        with open(pair.standby.data / "postgresql.conf", "a") as conf:
            conf.write("hot_standby = off\n")
        pair.standby.start(wait=False)
        launcher = Launcher(pair.standby.dsn(DB), args=("--grace", "1")).start()
        try:
            wait_log(launcher, "not accepting connections")
            time.sleep(4)  # (four more attempts, unlogged)
            assert launcher.output().count("not accepting connections") == 1, launcher.output()
            assert "trying again each second" in launcher.output()
            pair.fail_over("fast")
            promoted = time.monotonic()
            wait_log(launcher, ACTIVE, timeout=15)
            assert time.monotonic() - promoted < 2.0, launcher.output()
            with pair.primary.connect(DB) as conn:
                task_id = conn.execute("INSERT INTO task (input, delete) VALUES ('SELECT 1', false) RETURNING id"
                                       ).fetchone()[0]
                wait_until(lambda: conn.execute("SELECT state::text FROM task WHERE id = %s", [task_id]).fetchone()[0]
                           == "DONE", 10, message="a task run on the promoted standby")
        finally:
            launcher.kill()


def metrics(port: int) -> str:
    return scrape(port, "/metrics")[1]


def test_a_launcher_whose_primary_comes_back_as_a_standby_exports_none_of_its_groups(pair):
    """It went on exporting its last snapshot as the primary, frozen: the due tasks, lateness and
    pauses the new primary's launcher exports too (sums counted each group twice, an alert on a
    late group fired for good).  A standby's launcher says it is one."""
    port = free_port()
    launcher = Launcher(pair.primary.dsn(DB), args=("--grace", "1", "--metrics", f"127.0.0.1:{port}")).start()
    pair.launchers.append(launcher)
    launcher.wait_active()
    with pair.primary.connect(DB) as conn:
        conn.execute("SELECT task_pause('held')")
        conn.execute("INSERT INTO task (input, \"group\") VALUES ('SELECT 1', 'held')")
    wait_until(lambda: 'pg_task_py_paused_seconds{database=' in metrics(port)
               and 'group="held"' in metrics(port), 10, message="the paused group's metrics")
    assert re.search(r"^pg_task_py_standby\{[^}]*\} 0\.0$", metrics(port), re.MULTILINE), metrics(port)
    mark = len(launcher.output())
    pair.fail_over("fast")
    pair.rejoin("base backup")
    wait_log(launcher, WAITING, timeout=60, after=mark)
    wait_until(lambda: re.search(r"^pg_task_py_standby\{[^}]*\} 1\.0$", metrics(port), re.MULTILINE), 5,
               message="pg_task_py_standby 1")
    text = metrics(port)
    assert 'group="held"' not in text, text
    assert re.search(r"^pg_task_py_workers\{[^}]*\} 0\.0$", text, re.MULTILINE), text
    assert health(port) == 200


@pytest.mark.parametrize("mode, rejoin", [("fast", "base backup"), ("immediate", "pg_rewind")])
def test_failover_takes_over_within_2_s_and_loses_nothing(pair, mode, rejoin):
    old_primary = pair.primary
    on_primary = launch(pair, pair.primary.dsn(DB))
    on_standby = launch(pair, pair.standby.dsn(DB))
    on_primary.wait_active()
    wait_log(on_standby, WAITING)
    with pair.primary.connect(DB) as conn:
        running = conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                               ["SELECT pg_sleep(60)"]).fetchone()[0]
        wait_until(lambda: conn.execute("SELECT state::text FROM task WHERE id = %s", [running]).fetchone()[0]
                   == "WORK", 20, message="the long task to run")
        # A task claimed by the old primary's launcher that no worker had taken yet (TAKE, its claimer's pid).
        claimer = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'pg_task_py launcher'"
                               ).fetchone()[0]
        claimed = conn.execute("INSERT INTO task (input, state, worker, delete) VALUES (%s, 'TAKE', %s, false)"
                               " RETURNING id", [AUDITED, claimer]).fetchone()[0]
        series = conn.execute("INSERT INTO task (input, repeat, \"group\", delete, data)"
                              " VALUES ('SELECT 1', '0.5 s', 'series', false, 'series') RETURNING id").fetchone()[0]
        waiting = [conn.execute("INSERT INTO task (input, plan, delete) VALUES (%s, now() + %s * interval '1 s',"
                                " false) RETURNING id", [AUDITED, seconds]).fetchone()[0] for seconds in (5, 7)]
        backlog = [conn.execute("INSERT INTO task (input, \"group\", max, delete) VALUES (%s, 'backlog', 0, false)"
                                " RETURNING id", [f"{AUDITED}; SELECT pg_sleep(0.05)"]).fetchone()[0]
                   for _ in range(20)]
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE parent = %s", [series]).fetchone()[0], 10,
                   message="the series' next run")
    pair.wait_replayed()
    pair.fail_over(mode)
    promoted = time.monotonic()
    wait_log(on_standby, ACTIVE, timeout=10)
    took_over = time.monotonic() - promoted
    assert took_over < 2.0, (took_over, on_standby.output())

    with pair.primary.connect(DB) as conn:
        def state(task_id: int) -> str:
            return conn.execute("SELECT state::text FROM task WHERE id = %s", [task_id]).fetchone()[0]

        def ended(task_id: int) -> bool:
            return state(task_id) not in ("PLAN", "TAKE", "WORK")
        ids = [running, claimed, *waiting, *backlog]
        wait_until(lambda: all(ended(task_id) for task_id in ids), 30, 0.1,
                   f"every task to end; launcher's log:\n{on_standby.output()[-3000:]}")
        # Running when the primary died: may have run in part, so not again (at most once): FAIL.
        row = conn.execute("SELECT state::text, error FROM task WHERE id = %s", [running]).fetchone()
        assert row[0] == "FAIL" and row[1].startswith(WORKER_GONE), row
        # Claimed but not started: it runs, once.
        assert state(claimed) == "DONE"
        # Waiting ones run on time, and every one-off task ran exactly once.
        for task_id in waiting:
            late = conn.execute("SELECT extract(epoch FROM a.ran_at - t.plan) FROM task t JOIN audit a"
                                " ON a.task_id = t.id WHERE t.id = %s", [task_id]).fetchone()
            assert late is not None and 0 <= late[0] < 2, (task_id, late)
        # Every other task ran once (a second run would have hit audit's key); one of the backlog (one at a
        # time) may have been running too, and ends as the long one did.
        failed = conn.execute("SELECT id, error FROM task WHERE id = ANY(%s) AND state <> 'DONE'", [ids]).fetchall()
        # (in full, with both launchers' logs: a failure here is timing-dependent and rare)
        why = "\n".join([f"task {task_id}: {error}" for task_id, error in failed]
                        + ["old primary's launcher:", on_primary.output()[-4000:],
                           "standby's launcher:", on_standby.output()[-4000:]])
        assert running in [task_id for task_id, _ in failed] and len(failed) <= 2, why
        assert all(error.startswith((WORKER_GONE, SESSION_STOPPED)) for _, error in failed), why
        unaudited = conn.execute("SELECT count(*) FROM task t WHERE t.id = ANY(%s) AND t.state = 'DONE'"
                                 " AND NOT EXISTS (SELECT FROM audit a WHERE a.task_id = t.id)", [ids]).fetchone()[0]
        assert unaudited == 0
        # The series goes on with exactly one next run at any time, never two after one run.
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE data = 'series' AND state = 'DONE'"
                                        " AND stop > now() - interval '1 s'").fetchone()[0], 10,
                   message="the series to run on the new primary")
        twice = conn.execute("SELECT parent FROM task WHERE data = 'series' AND parent IS NOT NULL"
                             " GROUP BY parent HAVING count(*) > 1").fetchall()
        assert twice == []
        # Stopped while waiting: a run claimed at that moment is missed, and plans the next when it ends.
        wait_until(lambda: conn.execute("UPDATE task SET state = 'STOP' WHERE data = 'series' AND state = 'PLAN'"
                                        ).rowcount == 1, 10, message="the series' waiting run stopped")
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')"
                                        ).fetchone()[0] == 0, 10, message="nothing left in PLAN, TAKE or WORK")
        assert conn.execute("SELECT count(*) FROM task WHERE data = 'series' AND state = 'STOP'").fetchone()[0] == 1

    # The old primary rejoins as a standby of the new one: its launcher reconnects and runs nothing.
    mark = len(on_primary.output())
    pair.rejoin("pg_rewind" if rejoin == "pg_rewind" else "base backup")
    assert pair.standby is old_primary and old_primary.in_recovery()
    wait_log(on_primary, WAITING, timeout=30, after=mark)
    with pair.primary.connect(DB) as conn:
        after = [conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                              [AUDITED]).fetchone()[0] for _ in range(5)]
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE id = ANY(%s) AND state = 'DONE'",
                                        [after]).fetchone()[0] == 5, 20, message="the new primary to run them")
    pair.wait_replayed()
    assert started(on_primary, after=mark) == []
    assert workers_on(old_primary) == 0
    assert on_primary.stop() == 0 and on_standby.stop() == 0


def test_a_launcher_given_every_node_follows_the_primary(pair):
    dsn = multi_host_dsn([pair.primary, pair.standby], DB, target_session_attrs="read-write")
    launcher = launch(pair, dsn)
    launcher.wait_active()
    where = "SELECT current_setting('port') || ' ' || pg_is_in_recovery()"
    with pair.primary.connect(DB) as conn:
        first = conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id", [where]).fetchone()[0]
        wait_until(lambda: conn.execute("SELECT state = 'DONE' FROM task WHERE id = %s", [first]).fetchone()[0], 20,
                   message="the first task")
        output = conn.execute("SELECT output FROM task WHERE id = %s", [first]).fetchone()[0]
        assert output == f"{pair.primary.port} false"
    pair.wait_replayed()
    mark = len(launcher.output())
    pair.fail_over("immediate")
    wait_log(launcher, ACTIVE, timeout=30, after=mark)
    with pair.primary.connect(DB) as conn:
        # Worker backends and task sessions are the new primary's: the task runs there, supervised there.
        second = conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                              [f"{where} FROM pg_sleep(1)"]).fetchone()[0]
        worker = wait_until(lambda: conn.execute("SELECT worker FROM task WHERE id = %s AND state = 'WORK'",
                                                 [second]).fetchone(), 20, message="the task to run")[0]
        app = conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [worker]).fetchone()
        assert app == ("pg_task_py worker",)
        wait_until(lambda: conn.execute("SELECT state = 'DONE' FROM task WHERE id = %s", [second]).fetchone()[0], 20,
                   message="the task to end")
        assert conn.execute("SELECT output FROM task WHERE id = %s", [second]).fetchone()[0] == \
            f"{pair.primary.port} false"
    assert launcher.stop() == 0, launcher.output()


def test_a_standby_without_the_extension_is_refused_as_a_primary_is(pair):
    """CREATE EXTENSION replicates: a database without it is refused on a standby as on a primary."""
    with pair.primary.connect() as conn:
        conn.execute("CREATE DATABASE bare")
    pair.wait_replayed()
    launcher = launch(pair, pair.standby.dsn("bare"))
    assert launcher.process.wait(30) == 1
    assert "the pg_task_py extension is not installed in this database" in launcher.output()


# --- target = 'standby' ------------------------------------------------------------------------

def wait_task(node, task_id: int, timeout: float = 20.0) -> dict:
    """The task's row on `node` once it has ended."""
    with node.connect(DB) as conn:
        def ended():
            cursor = conn.execute("SELECT state::text AS state, output, error FROM task WHERE id = %s"
                                  " AND state NOT IN ('PLAN', 'TAKE', 'WORK')", [task_id])
            row = cursor.fetchone()
            return dict(zip([d.name for d in cursor.description], row)) if row else None
        return wait_until(ended, timeout, message=f"task {task_id} to end")


def insert(node, input: str, **columns: object) -> int:
    names = ", ".join(["input", "delete", *(f'"{name}"' for name in columns)])
    marks = ", ".join(["%s"] * (2 + len(columns)))
    with node.connect(DB) as conn:
        return conn.execute(f"INSERT INTO task ({names}) VALUES ({marks}) RETURNING id",
                            [input, False, *columns.values()]).fetchone()[0]


WHERE = "SELECT pg_is_in_recovery()"


def test_target_standby_runs_read_only_on_the_standby_and_falls_back_to_the_primary(pair):
    launcher = Launcher(pair.primary.dsn(DB), args=("--standby", f"host={pair.standby.socket_dir} "
                                                    f"port={pair.standby.port}")).start()
    pair.launchers.append(launcher)
    launcher.wait_active()
    # On the standby: its session is in recovery; a write fails with PostgreSQL's read-only error.
    assert wait_task(pair.primary, insert(pair.primary, WHERE, target="standby"))["output"] == "t"
    assert wait_task(pair.primary, insert(pair.primary, WHERE))["output"] == "f"
    write = wait_task(pair.primary, insert(pair.primary, "INSERT INTO audit VALUES (1)", target="standby"))
    assert write["state"] == "FAIL"
    assert write["error"].startswith("ERROR:  cannot execute INSERT in a read-only transaction"), write
    # task_cancel reaches its query there (through its worker: the pid is the standby's).
    sleeper = insert(pair.primary, "SELECT pg_sleep(30)", target="standby")
    with pair.primary.connect(DB) as conn:
        wait_until(lambda: conn.execute("SELECT state = 'WORK' FROM task WHERE id = %s", [sleeper]).fetchone()[0],
                   10, message="the sleeper to run")
        assert conn.execute("SELECT task_cancel(%s)", [sleeper]).fetchone()[0] is True
    cancelled = wait_task(pair.primary, sleeper)
    assert cancelled["error"].startswith("ERROR:  canceling statement due to user request"), cancelled
    # Groups whose worker goes on with its next tasks in a reused session (count): a group of standby
    # tasks stays on the standby; in a group of both kinds, each task runs where its target says.
    with pair.primary.connect(DB) as conn:
        def group_of(group: str, targets: list) -> list[int]:
            return [conn.execute("INSERT INTO task (input, \"group\", count, target, delete) VALUES (%s, %s, 10, %s,"
                                 " false) RETURNING id", [WHERE, group, target]).fetchone()[0] for target in targets]
        reports = group_of("reports", ["standby"] * 5)
        mixed = group_of("mixed", ["standby", "standby", None, "standby", None, None, "standby"])
    assert [wait_task(pair.primary, task_id)["output"] for task_id in reports] == ["t"] * 5
    outputs = [wait_task(pair.primary, task_id)["output"] for task_id in mixed]
    assert outputs == ["t", "t", "f", "t", "f", "f", "t"], outputs
    # A repeating task keeps its target in every run.
    series = insert(pair.primary, WHERE, target="standby", repeat="0.2 s")
    with pair.primary.connect(DB) as conn:
        wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE parent = %s AND state = 'DONE'",
                                        [series]).fetchone()[0], 10, message="the series' second run")
        assert conn.execute("SELECT DISTINCT target, output FROM task WHERE (id = %s OR parent = %s)"
                            " AND state = 'DONE'", [series, series]).fetchall() == [("standby", "t")]
        conn.execute("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")

    # The standby stopped: its tasks run on the primary, and the launcher's log says so.
    pair.standby.stop("fast")
    fell_back = insert(pair.primary, WHERE, target="standby")
    assert wait_task(pair.primary, fell_back)["output"] == "f"
    wait_until(lambda: f"task {fell_back} of target standby runs on the primary, read-only: the standby could not"
               " be used: " in launcher.output(), 10, message="the launcher to log the fallback")
    pair.standby.start()
    pair.wait_streaming()
    assert wait_task(pair.primary, insert(pair.primary, WHERE, target="standby"))["output"] == "t"

    # A task `after` others reads their writes: on the standby once it has replayed them, else
    # (within a second) on the primary; within standby_max_lag it read the standby before them.
    def after_a_write(value: int) -> str:
        with pair.primary.connect(DB) as conn:
            first = conn.execute("INSERT INTO task (input, delete) VALUES (%s, false) RETURNING id",
                                 [f"INSERT INTO audit VALUES ({value})"]).fetchone()[0]
        seen = f"SELECT pg_is_in_recovery() || ' ' || count(*) FROM audit WHERE task_id = {value}"
        report = insert(pair.primary, seen, target="standby", after=[first])
        return wait_task(pair.primary, report)["output"]
    assert after_a_write(3) == "true 1"
    with pair.standby.connect(DB) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        assert after_a_write(4) == "false 1"
        conn.execute("SELECT pg_wal_replay_resume()")
    wait_until(lambda: "runs on the primary, read-only: the standby had not replayed what the primary had written"
               in launcher.output(), 10, message="the launcher to log why the task `after` ran on the primary")
    pair.wait_replayed()

    # The standby lags more than pg_task_py.standby_max_lag: on the primary, until it catches up.
    with pair.primary.connect(DB) as conn:
        conn.execute(f"ALTER DATABASE {DB} SET pg_task_py.standby_max_lag = '1 s'")
    pair.wait_replayed()
    with pair.standby.connect(DB) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        with pair.primary.connect(DB) as primary:
            primary.execute("INSERT INTO audit VALUES (2)")
        time.sleep(1.5)  # the last transaction the standby replayed is now older than 1 s
        assert wait_task(pair.primary, insert(pair.primary, WHERE, target="standby"))["output"] == "f"
        conn.execute("SELECT pg_wal_replay_resume()")
    pair.wait_replayed()
    assert wait_task(pair.primary, insert(pair.primary, WHERE, target="standby"))["output"] == "t"

    # After a quiet spell longer than standby_max_lag, a standby that is behind the primary by
    # the task's own insert only: the last transaction it replayed is as old as the spell, but
    # it replays the rest at once.  The first task after the spell ran on the primary (a probe).
    with pair.standby.connect(DB) as conn, pair.primary.connect(DB) as primary:
        conn.autocommit = primary.autocommit = True
        wait_until(lambda: conn.execute("SELECT now() - pg_last_xact_replay_timestamp() > interval '1.2 s'")
                   .fetchone()[0], 10, interval=0.05, message="a quiet spell longer than standby_max_lag")
        paused = conn.execute("SELECT pg_wal_replay_pause(), clock_timestamp()").fetchone()[1]
        report = insert(pair.primary, WHERE, target="standby")
        wait_until(lambda: conn.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE query LIKE '%%pg_last_wal_replay_lsn() >=%%'"
            " AND backend_start > %s AND pid <> pg_backend_pid())", [paused]).fetchone()[0]
            or primary.execute("SELECT state NOT IN ('PLAN', 'TAKE') FROM task WHERE id = %s", [report]).fetchone()[0],
            10, interval=0.005, message="the task's session on the standby")
        conn.execute("SELECT pg_wal_replay_resume()")
    assert wait_task(pair.primary, report)["output"] == "t"
    assert launcher.stop() == 0, launcher.output()
    assert "Traceback" not in launcher.output()


def test_a_standby_tasks_session_kept_on_a_standby_since_promoted_is_not_used(pair):
    """A group's session kept on the standby (count, live) went on running the group's standby
    tasks there once that standby was promoted (the old primary cut off but alive): a write, which
    a standby refuses, landed on the promoted server (a probe).  The task moves to a new session:
    a standby's, or the primary's, read-only."""
    launcher = Launcher(pair.primary.dsn(DB), args=("--standby", f"host={pair.standby.socket_dir} "
                                                    f"port={pair.standby.port}")).start()
    pair.launchers.append(launcher)
    launcher.wait_active()
    first = insert(pair.primary, "SELECT pg_sleep(1.5)", target="standby",
                   live="1 hour", **{"group": "reports"})
    with pair.primary.connect(DB) as conn:
        wait_until(lambda: conn.execute("SELECT state = 'WORK' FROM task WHERE id = %s", [first]).fetchone()[0],
                   10, message="the first report to run")
        pair.standby.promote()
        write = insert(pair.primary, "INSERT INTO audit VALUES (555)", target="standby", live="1 hour",
                       **{"group": "reports"})
    assert wait_task(pair.primary, first)["state"] == "DONE"
    row = wait_task(pair.primary, write)
    assert row["state"] == "FAIL", row
    assert row["error"].startswith("ERROR:  cannot execute INSERT in a read-only transaction"), row
    with pair.standby.connect(DB) as promoted:
        assert promoted.execute("SELECT count(*) FROM audit").fetchone()[0] == 0


def test_target_is_null_or_standby(db):
    for bad, columns in (("primary", {}), ("Standby", {}), ("standby", {"remote": "host=elsewhere"})):
        with pytest.raises(psycopg.errors.CheckViolation, match="task.target must be NULL or 'standby'"):
            db.insert("SELECT 1", target=bad, **columns)
    task_id = db.insert("SELECT 1", target="standby")
    with pytest.raises(psycopg.errors.CheckViolation, match="task.target must be NULL or 'standby'"):
        db.sql("UPDATE task SET target = 'replica' WHERE id = %s", [task_id])
    with pytest.raises(psycopg.errors.CheckViolation, match="task.target must be NULL or 'standby'"):
        db.sql("UPDATE task SET remote = 'host=elsewhere' WHERE id = %s", [task_id])
    assert db.value("SELECT count(*) FROM task") == 1


def test_target_standby_without_a_standby_runs_on_the_primary(running):
    """A launcher without --standby: a task of target 'standby' runs where its table is, read-only
    as on a standby (a write there succeeded whenever the standby was down or behind)."""
    task_id = running.insert(WHERE, target="standby")
    assert running.wait_done(task_id)["output"] == "f"
    wait_until(lambda: f"task {task_id} of target standby runs on the primary, read-only: its launcher has no"
               " --standby" in running.launchers[0].output(), 10, message="the launcher to log the fallback")
    running.sql("CREATE TABLE written (i int)")
    write = running.wait_done(running.insert("INSERT INTO written VALUES (1)", target="standby", delete=False))
    assert write["error"].startswith("ERROR:  cannot execute INSERT in a read-only transaction"), write
    assert running.value("SELECT count(*) FROM written") == 0


def test_a_claim_from_the_old_primary_with_a_pid_alive_here_runs(running):
    """After a failover between machines (or containers) a replicated claim (TAKE) may carry the pid
    of a scheduler backend alive on the new primary: the launcher or an idle worker of that pid
    knows the claim is not its own, and the task runs.  (The rows are written as the failover
    leaves them; pids of one machine cannot collide.)"""
    wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                                     " 'pg_task_py worker' AND state = 'idle'"), 10, message="an idle spare worker")
    launcher_pid, worker_pid = (
        running.value("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name])
        for name in ("pg_task_py launcher", "pg_task_py worker"))
    ids = [running.value("INSERT INTO task (input, state, worker, delete) VALUES ('SELECT 42', 'TAKE', %s, false)"
                         " RETURNING id", [pid]) for pid in (launcher_pid, worker_pid)]
    for task_id in ids:
        row = running.wait_done(task_id, timeout=10)
        assert (row["state"], row["output"]) == ("DONE", "42"), row


def test_a_lost_runs_pid_that_is_another_session_here_ends_the_run_and_not_that_session(running):
    """After a failover a running task's row holds the old primary's pids: its session's pid may
    be, here, a backend of the task's owner older than the run (an application's session on the
    standby this server was).  The run's recovery terminated it as the task's session (a probe:
    an application's read-only session, and the launcher's own).  A row as a crash there leaves
    it: its worker gone, its session's pid that of an idle session of the owner here."""
    running.sql("CREATE ROLE app LOGIN")
    try:
        with running.connect("app") as app:
            app.execute("SELECT 'connected long before the run'")
            task_id = running.value(
                "INSERT INTO task (input, owner, state, worker, pid, start, delete)"
                " VALUES ('SELECT pg_sleep(60)', 'app', 'WORK', 999999, %s, now(), false) RETURNING id",
                [app.info.backend_pid])
            row = running.wait_done(task_id)
            assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row
            assert app.execute("SELECT 'still here'").fetchone() == ("still here",)
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE app")


def test_a_standby_tasks_session_here_ends_with_its_lost_run(running):
    """Run here for want of a standby, a `standby` task's session was taken for one out of reach:
    its run ended FAIL once its worker died while the session went on (a series' next run started
    beside it; after a promotion, one on the old standby wrote there; a probe)."""
    task_id = running.insert("SELECT pg_sleep(60)", target="standby", delete=False)
    wait_until(lambda: running.task(task_id)["state"] == "WORK", 20, 0.02, "WORK")
    session = running.task(task_id)["pid"]
    assert running.value("SELECT pg_terminate_backend(worker) FROM task WHERE id = %s", [task_id]) is True
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row
    assert running.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [session]) == 0
