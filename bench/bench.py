"""`make bench`: how soon tasks start and how many get through, on a throw-away cluster
(testing.postgresql); the figures and what they mean: bench/RESULTS.md.

Every figure comes from the server's own timestamps (`plan`, `start`, `stop`);
every wait has a deadline, and a scenario that times out reports it instead of
hanging.  Prints a table a cluster, then one JSON line a scenario.

    make bench                      # all scenarios, and the start path's on a durable cluster too
    make bench BENCH_ARGS="-s serial -s reuse"
    make bench BENCH_ARGS="-s serial -s reuse --durable"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import least_worker
import psycopg
from pg_task_py_testing import PG_BIN, Launcher, most_at_once, throwaway_cluster

DEADLINE = 120.0  # seconds any one scenario may take


class TimedOut(Exception):
    pass


def wait_all_ended(conn, deadline: float = DEADLINE, where: str = "true", poll: float = 0.02) -> None:
    """Until no task `where` selects waits or runs (TimedOut after `deadline` seconds)."""
    end = time.monotonic() + deadline
    while conn.execute(f"SELECT count(*) FROM task WHERE {where} AND state IN ('PLAN', 'TAKE', 'WORK')").fetchone()[0]:
        if time.monotonic() > end:
            raise TimedOut(f"tasks still unfinished after {deadline}s")
        time.sleep(poll)


def span_seconds(conn, where: str) -> float:
    """Seconds from the first start to the last stop of the tasks `where` selects."""
    first, last = conn.execute(f"SELECT min(start), max(stop) FROM task WHERE {where}").fetchone()
    return (last - first).total_seconds()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def start_delay_ms(conn, task_id: int, reached: str, deadline: float, failure: str) -> float:
    """start - plan (ms) of the task, once the condition `reached` holds for its row (TimedOut,
    saying `failure`, after `deadline` seconds)."""
    end = time.monotonic() + deadline
    while True:
        row = conn.execute(f"SELECT extract(epoch FROM start - plan) * 1000 FROM task WHERE id = %s AND {reached}",
                           [task_id]).fetchone()
        if row:
            return float(row[0])
        if time.monotonic() > end:
            raise TimedOut(f"task {task_id} {failure}")
        time.sleep(0.002)


def latency(conn, planned_ahead: float, samples: int, owner: str | None = None) -> dict:
    """start - plan of single tasks on an idle launcher (immediate or planned ahead), of `owner`
    (default: the launcher's role)."""
    delays = []
    for i in range(samples):
        time.sleep(0.05 + (i % 7) * 0.013)  # land at different points of any timer
        task_id = conn.execute(
            "INSERT INTO task (plan, input, delete, owner) VALUES (clock_timestamp() + %s * interval '1 s',"
            " 'SELECT 1', false, coalesce(%s, current_user)) RETURNING id", [planned_ahead, owner]).fetchone()[0]
        delays.append(start_delay_ms(conn, task_id, "state = 'DONE'", planned_ahead + 10, "did not run"))
    return {"median_ms": round(statistics.median(delays), 2), "p95_ms": round(percentile(delays, 0.95), 2),
            "min_ms": round(min(delays), 2), "early": sum(d < 0 for d in delays), "samples": samples}


@contextlib.contextmanager
def woken_client(cluster, database: str, channel: str | None, on_wake: Callable[[psycopg.Connection, list[str]], object]
                 ) -> Iterator[None]:
    """A client of `database` in a thread of its own, LISTENing on `channel` (None: the launchers'
    channel), that calls on_wake(its connection, the payloads) each time it is woken, until the
    block ends."""
    stop = threading.Event()
    ready = threading.Event()

    def listen() -> None:
        with cluster.connect(database) as listener:
            name = channel or listener.execute("SELECT pgtaskpy.name_of('channel')").fetchone()[0]
            listener.execute(f'LISTEN "{name}"')
            ready.set()
            while not stop.is_set():
                payloads = [n.payload for n in listener.notifies(timeout=0.2, stop_after=1)]
                if payloads:
                    on_wake(listener, payloads)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield
    finally:
        stop.set()
        thread.join()


def wake_floor(cluster, conn, samples: int) -> dict:
    """The least any NOTIFY-woken scheduler needs before a task starts, in the latency scenario's
    pattern: insert a row into `task` (in STOP: no launcher takes it) with a NOTIFY, and a listening
    client, woken, stamps its `start` (one UPDATE by id).  start - plan: the insert and its commit, the
    wake-up of another process, one write; no claim, no handing over, no task session."""
    channel = "pg_task_py_bench_floor"

    def stamp(listener: psycopg.Connection, payloads: list[str]) -> None:
        listener.execute("UPDATE task SET start = clock_timestamp() WHERE id = ANY(%s)", [[int(p) for p in payloads]])

    delays = []
    with woken_client(cluster, "bench", channel, stamp):
        for i in range(samples):
            time.sleep(0.05 + (i % 7) * 0.013)  # as latency()
            task_id = conn.execute(
                "WITH t AS (INSERT INTO task (plan, state, input, delete) VALUES (clock_timestamp(), 'STOP',"
                " 'SELECT 1', false) RETURNING id) SELECT t.id FROM t, pg_notify(%s, t.id::text)",
                [channel]).fetchone()[0]
            delays.append(start_delay_ms(conn, task_id, "start IS NOT NULL", 10, "was not stamped by the listener"))
    return {"wake_floor_median_ms": round(statistics.median(delays), 2),
            "wake_floor_p95_ms": round(percentile(delays, 0.95), 2)}


def claim_floor(cluster, samples: int) -> dict:
    """The least a scheduler that applies pg_task_py's rules needs, woken by the insert's own
    NOTIFY: wake_floor()'s pattern, where the woken client claims the task with the launcher's claim
    (`claim_due_tasks`: groups, their `max`, pauses, limits) and starts it (`start_task`: WORK and
    `start`) in one statement, in the process the NOTIFY woke; no hand-over, no task session.  In a
    database of its own, with no launcher to race it; each task in a group of its own."""
    cluster.create_database("claim_floor")

    def claim_and_start(listener: psycopg.Connection, _payloads: list[str]) -> None:
        listener.execute("SELECT (pgtaskpy.start_task(c.id, pg_backend_pid(), 0)).id"
                         " FROM pgtaskpy.claim_due_tasks(1, pg_backend_pid()) AS c")

    delays = []
    with woken_client(cluster, "claim_floor", None, claim_and_start), cluster.connect("claim_floor") as conn:
        for i in range(samples):
            time.sleep(0.05 + (i % 7) * 0.013)  # as latency()
            task_id = conn.execute("INSERT INTO task (\"group\", input, delete) VALUES (%s, 'SELECT 1', false)"
                                   " RETURNING id", [f"g{i}"]).fetchone()[0]
            delays.append(start_delay_ms(conn, task_id, "start IS NOT NULL", 10, "was not started by the listener"))
    return {"claim_floor_median_ms": round(statistics.median(delays), 2),
            "claim_floor_p95_ms": round(percentile(delays, 0.95), 2)}


def latency_with_floor(cluster, conn, samples: int = 40) -> dict:
    """latency() of one-off tasks, beside wake_floor() and claim_floor() measured just before it,
    and their ratios; then (role_*) of tasks of a role that is not the launcher's, as an
    application's are."""
    floor_result = {**wake_floor(cluster, conn, samples), **claim_floor(cluster, samples)}
    conn.execute("DELETE FROM task")
    result = {**latency(conn, 0.0, samples), **floor_result}
    result["median_of_wake_floor"] = round(result["median_ms"] / floor_result["wake_floor_median_ms"], 2)
    result["p95_of_wake_floor"] = round(result["p95_ms"] / floor_result["wake_floor_p95_ms"], 2)
    result["median_of_claim_floor"] = round(result["median_ms"] / floor_result["claim_floor_median_ms"], 2)
    result["p95_of_claim_floor"] = round(result["p95_ms"] / floor_result["claim_floor_p95_ms"], 2)
    conn.execute("CREATE ROLE bench_app LOGIN IN ROLE pgtaskpy_user")
    try:
        of_role = latency(conn, 0.0, samples, owner="bench_app")
        result["role_median_ms"], result["role_p95_ms"] = of_role["median_ms"], of_role["p95_ms"]
    finally:
        conn.execute("DELETE FROM task")
        conn.execute("DROP ROLE bench_app")
    return result


def throughput(conn, insert: str, count: int, fresh: bool = True, launcher=None) -> dict:
    """Tasks per second from the first start to the last stop (fresh: emptying the table first);
    with `launcher`, also the CPU time a task costs the server and the launcher (task_cpu_ms; not
    the bench's insert, nor its polls for the ends), in two parts (server_cpu_parts: the ended
    backends and the postmaster, sessions_cpu_ms; the rest, scheduler_cpu_ms), and how many of
    this machine's cores they kept busy."""
    if fresh:
        empty_task_table(conn)
    cpu = server_cpu_parts(conn, launcher, scheduler_only=True) if launcher else None
    conn.execute(insert, [count])
    # Polled every 0.1 s, not 0.02: the times come from the rows, and each poll reads the whole
    # table (0.24 ms of CPU a task at 0.02 s in `parallel`, CPU the scheduler then did not have).
    wait_all_ended(conn, poll=0.1)
    cpu = cpu_parts_since(conn, launcher, cpu) if cpu is not None else None
    first, last, done = conn.execute(
        "SELECT min(start), max(stop), count(*) FILTER (WHERE state = 'DONE') FROM task").fetchone()
    return pace(count, done, (last - first).total_seconds(), cpu)


def cpu_parts_since(conn, launcher, before: tuple[float, float]) -> tuple[float, float]:
    """server_cpu_parts (not counting the bench's backend) used since `before`, its earlier reading."""
    return tuple(after - earlier for after, earlier in zip(server_cpu_parts(conn, launcher, True), before))


def pace(count: int, done: int, seconds: float, cpu: tuple[float, float] | None = None) -> dict:
    """A throughput scenario's figures: tasks/s over `seconds`, and with `cpu` (the sessions' and
    the rest's CPU seconds, cpu_parts_since) the CPU a task, in all and by part, and the cores
    kept busy."""
    result = {"tasks": count, "done": done, "seconds": round(seconds, 3), "tasks_per_s": round(count / seconds, 1)}
    if cpu is not None:
        sessions, rest = cpu
        result.update(task_cpu_ms=round(1000 * (sessions + rest) / count, 3),
                      cores_busy=round((sessions + rest) / seconds, 2),
                      sessions_cpu_ms=round(1000 * sessions / count, 3), scheduler_cpu_ms=round(1000 * rest / count, 3))
    return result


def least_worker_throughput(conn, launcher, groups: int, count: int = 500) -> dict:
    """`count` one-off tasks in `groups` groups run by the least a PL/Python worker can do
    (least_worker.py), a worker a group at once, as `serial` and `parallel` run theirs: tasks/s
    from the first start to the last stop, the CPU a task in the same two parts as throughput()'s,
    and the workers' own (`worker_cpu_ms`)."""
    conn.execute(least_worker.TABLE_SQL)
    conn.execute(least_worker.procedure_sql())
    conn.execute(f"TRUNCATE {least_worker.TABLE}")
    ids = [row[0] for row in conn.execute(
        f"INSERT INTO {least_worker.TABLE} (state) SELECT 'PLAN' FROM generate_series(1, %s) RETURNING id", [count])]
    table_oid = conn.execute(f"SELECT '{least_worker.TABLE}'::regclass::oid").fetchone()[0]
    workers = [psycopg.connect(conn.info.dsn, autocommit=True) for _ in range(groups)]
    worker_cpu = [0.0] * groups
    try:
        for worker in workers:  # PL/Python loaded before the clock starts, as in a warm worker
            worker.execute("DO LANGUAGE plpython3u 'pass'")

        def run(index: int) -> None:
            worker_cpu[index] = workers[index].execute(
                "CALL least_worker(%s, %s, NULL)", [ids[index::groups], table_oid]).fetchone()[0]

        cpu = server_cpu_parts(conn, launcher, scheduler_only=True)
        threads = [threading.Thread(target=run, args=(index,)) for index in range(groups)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        cpu = cpu_parts_since(conn, launcher, cpu)
    finally:
        for worker in workers:
            worker.close()
    first, last, done = conn.execute(f"SELECT min(start), max(stop), count(*) FILTER (WHERE state = 'DONE')"
                                     f" FROM {least_worker.TABLE}").fetchone()
    if done != count:
        raise TimedOut(f"the least worker ran {done} of {count} tasks")
    return {**pace(count, done, (last - first).total_seconds(), cpu),
            "worker_cpu_ms": round(1000 * sum(worker_cpu) / count, 3)}


def empty_task_table(conn) -> None:
    """Delete every task and vacuum: the throw-away cluster's autovacuum does not keep up with a
    scenario's rounds, and dead rows left by one round slow the next (42,000 after six chain
    rounds), which made rounds of one scenario incomparable."""
    conn.execute("DELETE FROM task")
    conn.execute("VACUUM")


FLOOR_SCRIPT = """\
BEGIN;
SELECT id FROM floor_task WHERE state = 'PLAN' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED \\gset
UPDATE floor_task SET state = 'TAKE' WHERE id = :id;
COMMIT;
SELECT 1;
UPDATE floor_task SET state = 'DONE' WHERE id = :id;
"""


def floor(cluster, conn, launcher) -> dict:
    """The machine's floor: the least work per task (claim a row with SKIP LOCKED, run SELECT 1,
    mark it done, each its own commit), by pgbench with one client on the same cluster; and
    how many new sessions a second the server can start (pgbench -C), with the server's CPU
    time per session (its start, SELECT 1, its end; pgbench's own CPU not counted).

    `settings_session_cpu_ms`: the same of a session that starts with a task's settings
    (pg_task.id, pg_task.group, the task table's, statement_timeout: TASK_SETTINGS), which
    every session of a task needs to show it what pg_task's show.  `least_task_cpu_ms`: the
    least CPU any scheduler that runs each task in such a session can spend a task: that
    session, its client's CPU (`session_client_cpu_ms`: pgbench here, a worker for a task) and
    the least bookkeeping, a claim and an end committed (`bookkeeping_cpu_ms`).
    `least_cpu_bound_of_new_sessions`: the most of `new_sessions_per_s` that this machine's
    cores allow at that cost, beside which a scenario's `cpu_bound_of_new_sessions` (the same at
    its own CPU cost a task) shows how much the scheduler adds."""
    conn.execute("CREATE TABLE floor_task (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'PLAN')")
    conn.execute("INSERT INTO floor_task (state) SELECT 'PLAN' FROM generate_series(1, 200000)")
    conn.execute("CREATE INDEX ON floor_task (id) WHERE state = 'PLAN'")
    with tempfile.TemporaryDirectory() as scripts:
        script = Path(scripts) / "floor.sql"
        script.write_text(FLOOR_SCRIPT)
        tasks = pgbench(cluster, script, 5)
        bookkeeping_ms = bookkeeping_cpu_ms(conn)
        conn.execute("DROP TABLE floor_task")
        # A task without count/live runs in a backend of its own, as in pg_task: the
        # rate at which this server starts backends bounds serial and parallel.
        sessions, session_ms, client_ms = new_sessions(cluster, conn, launcher, 3)
        _, settings_ms, _ = new_sessions(cluster, conn, launcher, 3, task_settings(conn))
    least_ms = settings_ms + client_ms + bookkeeping_ms
    return {"tasks_per_s": tasks, "new_sessions_per_s": sessions, "session_cpu_ms": round(session_ms, 3),
            "settings_session_cpu_ms": round(settings_ms, 3), "session_client_cpu_ms": round(client_ms, 3),
            "bookkeeping_cpu_ms": round(bookkeeping_ms, 3), "least_task_cpu_ms": round(least_ms, 3),
            "least_cpu_bound_of_new_sessions": round(os.cpu_count() * 1000 / least_ms / sessions, 3)}


def new_sessions(cluster, conn, launcher, seconds: int, options: str | None = None) -> tuple[float, float, float]:
    """pgbench -C with one client running SELECT 1 (with the startup `options`, if any): new
    sessions a second, and the CPU time a session costs the server and its client (ms)."""
    with tempfile.TemporaryDirectory() as scripts:
        script = Path(scripts) / "session.sql"
        script.write_text("SELECT 1;\n")
        cpu = server_cpu_seconds(conn, launcher)
        client_cpu = children_cpu_seconds()
        sessions = pgbench(cluster, script, seconds, "-C", env={"PGOPTIONS": options} if options else None)
        cpu = server_cpu_seconds(conn, launcher) - cpu
        client_cpu = children_cpu_seconds() - client_cpu
    return sessions, 1000 * cpu / (sessions * seconds), 1000 * client_cpu / (sessions * seconds)


def task_settings(conn) -> str:
    """A task's settings (sql/plpython/sessions.py, TASK_SETTINGS) as its session's startup options."""
    oid = conn.execute("SELECT 'task'::regclass::oid").fetchone()[0]
    return (f"-c pg_task.id=1 -c pg_task.group=default -c pg_task.schema=public -c pg_task.table=task"
            f" -c pg_task.oid={oid} -c statement_timeout=0ms")


def bookkeeping_cpu_ms(conn, count: int = 3000) -> float:
    """The server's CPU time a task's least bookkeeping costs: the floor's claim (SKIP LOCKED,
    then TAKE, one commit) and end (DONE, another), without the task's SELECT 1; run by this
    client on floor_task and timed by its backend's own CPU clock."""
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    before = cpu_seconds(backend)
    for _ in range(count):
        with conn.transaction():
            task = conn.execute("SELECT id FROM floor_task WHERE state = 'PLAN' ORDER BY id LIMIT 1"
                                " FOR UPDATE SKIP LOCKED").fetchone()[0]
            conn.execute("UPDATE floor_task SET state = 'TAKE' WHERE id = %s", [task])
        conn.execute("UPDATE floor_task SET state = 'DONE' WHERE id = %s", [task])
    return 1000 * (cpu_seconds(backend) - before) / count


def children_cpu_seconds() -> float:
    """CPU seconds of this process's ended children (pgbench)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pgbench(cluster, script: Path, seconds: int, *flags: str, env: dict[str, str] | None = None) -> float:
    """Transactions a second of one pgbench client running `script` (with `env` added to its
    environment)."""
    result = subprocess.run(
        [str(PG_BIN / "pgbench"), "-n", "-c", "1", "-T", str(seconds), *flags, "-f", str(script),
         "-h", str(cluster.socket_dir), "-p", str(cluster.port), "-U", "postgres", "bench"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    tps = [line for line in result.stdout.splitlines() if line.startswith("tps")]
    if not tps:
        raise TimedOut(f"pgbench failed: {result.stderr.strip()[:200]}")
    return round(float(tps[0].split()[2]), 1)


# The most an idle launcher's turn claims, in a burst of tasks that share workers (dispatch.py,
# claim_for_workers: NEW_WORKERS_A_TURN new workers, TASKS_A_WORKER tasks each), beside a claim of 1.
LAUNCHER_CLAIM_LIMIT = 400


def claim_ms(conn, repeat: int = 200, limit: int = 1) -> float:
    """Median time of one claim of up to `limit` tasks (rolled back), by the server's clock."""
    times = []
    for _ in range(repeat):
        conn.execute("BEGIN")
        times.append(conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - t0) * 1000 FROM (SELECT clock_timestamp() AS t0) AS s,"
            " LATERAL (SELECT count(*) FROM pgtaskpy.claim_due_tasks(%s, pg_backend_pid())) AS c",
            [limit]).fetchone()[0])
        conn.execute("ROLLBACK")
    return round(float(statistics.median(times)), 3)


def with_one_due_task(cluster, *names: str) -> None:
    """New databases `names`, each holding one due task: what a claim costs at the least."""
    for name in names:
        cluster.create_database(name)
        with cluster.connect(name) as conn:
            conn.execute("INSERT INTO task (input, \"group\") VALUES ('SELECT 1', 'due')")


def claims_in_turns(empty, held, turns: int, limit: int = 1) -> tuple[float, float]:
    """Median claim time (ms) in `empty` and in `held`, `turns` rounds of 40 claims each in
    turns, so that both see the same machine load."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(turns):
        times[0].append(claim_ms(empty, 40, limit))
        times[1].append(claim_ms(held, 40, limit))
    return statistics.median(times[0]), statistics.median(times[1])


def backlog(cluster) -> dict:
    """Claim cost of one due task with 1,000,000 finished rows and 100,000 waiting ones (planned
    ahead), with those 100,000 all due, in 100 groups and in 10,000, each against a table holding
    the one due task only, measured in turns with it (so that both see the same machine load); in
    databases of their own, with no launcher.  With the tasks planned ahead, also claims of up to
    LAUNCHER_CLAIM_LIMIT, as the launcher makes them.  Then a claim beside tasks held back (held_claim)."""
    with_one_due_task(cluster, "backlog_empty", "backlog")
    result = {}
    with cluster.connect("backlog_empty") as empty, cluster.connect("backlog") as conn:
        conn.execute("ALTER TABLE task DISABLE TRIGGER USER")
        conn.execute("INSERT INTO task (input, state, plan, start, stop, output)"
                     " SELECT 'SELECT 1', 'DONE', now() - interval '1 day', now() - interval '1 day',"
                     " now() - interval '1 day', '1' FROM generate_series(1, 1000000)")
        conn.execute("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'g' || (i % 100),"
                     " now() + interval '1 day' FROM generate_series(1, 100000) AS i")
        conn.execute("ALTER TABLE task ENABLE TRIGGER USER")
        for figure, change in (
                ("waiting_ahead", None),
                ("waiting_due", "UPDATE task SET plan = now() - interval '1 minute'"
                                " WHERE state = 'PLAN' AND \"group\" <> 'due'"),
                ("waiting_due_groups", "UPDATE task SET \"group\" = 'h' || (id % 10000)"
                                       " WHERE state = 'PLAN' AND \"group\" <> 'due'")):
            if change:
                conn.execute(change)
            settle(conn)
            empty_ms, held_ms = claims_in_turns(empty, conn, 5)
            result.update({f"{figure}_empty_ms": round(empty_ms, 3), f"{figure}_ms": round(held_ms, 3),
                           f"{figure}_ratio": round(held_ms / empty_ms, 2)})
            if change is None:  # (with every task due, a claim of 400 takes 400 where the empty table has 1)
                empty_ms, held_ms = claims_in_turns(empty, conn, 5, LAUNCHER_CLAIM_LIMIT)
                result[f"{figure}_ratio_at_{LAUNCHER_CLAIM_LIMIT}"] = round(held_ms / empty_ms, 2)
        result["groups_due"] = conn.execute(
            "SELECT count(DISTINCT \"group\") FROM task WHERE state = 'PLAN'").fetchone()[0]
        result.update(held_claim(cluster, empty))
        result.update(held_claim(cluster, empty, paused=True))
        result.update(paused_claim(cluster, empty))
    result.update(burst_claim(cluster))
    return result


def held_claim(cluster, empty, tasks: int = 20_000, paused: bool = False) -> dict:
    """Claim cost beside `tasks` due tasks of one group that their owner's running limit holds
    back (`pg_task_py.role_running_limit` 0), or with `paused` the owner's pause of the group,
    against `empty`'s, in turns; a database of its own.  The claim reads past them (another
    role's task may come after them)."""
    name, role = ("held_paused", "paused_owner") if paused else ("held", "held_owner")
    cluster.create_database(name)
    with cluster.connect(name) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE pgtaskpy_user")
        if not paused:
            conn.execute(f"ALTER ROLE {role} SET pg_task_py.role_running_limit = 0")
        with cluster.connect(name, user=role) as owner:
            if paused:
                owner.execute("SELECT task_pause('group')")
            owner.execute("INSERT INTO task (input) SELECT 'SELECT 1' FROM generate_series(1, %s)", [tasks])
        settle(conn)
        empty_ms, held_ms = claims_in_turns(empty, conn, 5)
    return {f"{name}_empty_ms": round(empty_ms, 3), f"{name}_ms": round(held_ms, 3),
            f"{name}_ratio": round(held_ms / empty_ms, 2)}


def paused_claim(cluster, empty, groups: int = 15_000) -> dict:
    """Claim cost beside one role's `groups` paused groups, each with a due task, against
    `empty`'s, in turns; a database of its own.  Such a claim looks at each group's pause: not a
    ratio near 1 (its cost grows with the groups), but milliseconds, not seconds."""
    cluster.create_database("paused")
    with cluster.connect("paused") as conn:
        conn.execute("INSERT INTO pgtaskpy.group_pause (owner, \"group\")"
                     " SELECT 'postgres', 'p' || i FROM generate_series(1, %s) AS i", [groups])
        conn.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT 1', 'p' || i FROM generate_series(1, %s) AS i",
                     [groups])
        conn.execute("INSERT INTO task (input, \"group\") VALUES ('SELECT 1', 'due')")
        settle(conn)
        conn.execute("ANALYZE pgtaskpy.group_pause")
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(3):
            times[0].append(claim_ms(empty, 5))
            times[1].append(claim_ms(conn, 5))
    empty_ms, paused_ms = statistics.median(times[0]), statistics.median(times[1])
    return {"paused_groups": groups, "paused_empty_ms": round(empty_ms, 3), "paused_ms": round(paused_ms, 3)}


def burst_claim(cluster, tasks: int = 1000) -> dict:
    """A claim of `tasks` tasks due in as many groups, inserted at once into a new table (no
    statistics yet, as in a burst into a new table, or one whose statistics saw few waiting
    tasks), beside the same claim once the table is analyzed: the claim's plan must not depend
    on them; and (`_beside_running`) with as many tasks of other groups running, as in a burst's
    later turns.  Each claim rolled back; each measured on a connection of its own (a backend
    makes the claim's plan once)."""
    result = {}
    for name, running in (("burst_claim", 0), ("burst_claim_beside_running", tasks)):
        cluster.create_database(name)
        with cluster.connect(name) as conn:
            conn.execute("ALTER TABLE task DISABLE TRIGGER USER")  # (rows as a burst's first turns leave them)
            conn.execute("INSERT INTO task (\"group\", input, state, start, worker, pid) SELECT 'running' || i,"
                         " 'SELECT 1', 'WORK', now(), 1, 1 FROM generate_series(1, %s) AS i", [running])
            conn.execute("ALTER TABLE task ENABLE TRIGGER USER")
            conn.execute("INSERT INTO task (\"group\", input) SELECT 'g' || i, 'SELECT 1'"
                         " FROM generate_series(1, %s) AS i", [tasks])
        with cluster.connect(name) as conn:
            result[f"{name}_ms"] = claim_ms(conn, 20, tasks)
            conn.execute("ANALYZE task")
        if not running:
            with cluster.connect(name) as conn:
                result[f"{name}_analyzed_ms"] = claim_ms(conn, 20, tasks)
    result["burst_claim_ratio"] = round(result["burst_claim_ms"] / result["burst_claim_analyzed_ms"], 2)
    return result


def settle(conn) -> None:
    """Vacuum and checkpoint a table just filled: not autovacuum nor the writing of the new rows
    while claims are timed."""
    conn.execute("VACUUM ANALYZE task")
    conn.execute("CHECKPOINT")


def chain(conn, launcher, rounds: int = 9) -> dict:
    """A chain of 1,000 tasks (task_chain: each after the one before) against 1,000 independent
    tasks of one group, the serial scenario's shape, in the same run, in turns (so that both see
    the same machine load): tasks a second, first start to last stop, the median of the rounds;
    and the CPU (server and launcher) a task, the median of the rounds, which the machine's load
    swings less."""
    count = 1000
    serial, chained, serial_cpu, chained_cpu = [], [], [], []
    for _ in range(rounds):
        for rates, cpus, insert in ((serial, serial_cpu, "INSERT INTO task (input, delete) SELECT 'SELECT 1', false"
                                                         " FROM generate_series(1, %s)"),
                                    (chained, chained_cpu, "SELECT task_chain(array_agg('SELECT 1'::text))"
                                                           " FROM generate_series(1, %s)")):
            empty_task_table(conn)
            cpu = server_cpu_seconds(conn, launcher)
            result = throughput(conn, insert, count, fresh=False)
            cpus.append(round(1000 * (server_cpu_seconds(conn, launcher) - cpu) / count, 3))  # ms a task
            if result["done"] != count:
                raise TimedOut(f"only {result['done']} of {count} tasks DONE")
            rates.append(result["tasks_per_s"])
    serial_rate, chain_rate = statistics.median(serial), statistics.median(chained)
    return {"serial_tasks_per_s": serial_rate, "chain_tasks_per_s": chain_rate,
            "ratio": round(chain_rate / serial_rate, 2),
            "serial_cpu_ms_per_task": statistics.median(serial_cpu),
            "chain_cpu_ms_per_task": statistics.median(chained_cpu),
            "cpu_ratio": round(statistics.median(chained_cpu) / statistics.median(serial_cpu), 2),
            "rounds": list(zip(serial, chained))}


def rate(cluster, conn, starts: int = 20, count: int = 100) -> dict:
    """A rate limit used: `count` tasks of a group under task_limit(group, `starts`, '1 second'),
    inserted at once, locally (workers go on with the group) and as remote tasks (to this
    database: only the launcher claims those).  The `starts`-th start after each start may come
    no sooner than a second later, so the last comes ceil(count / starts) - 1 seconds after the
    first at best; of_limit is that span over the measured one (1: the limit used in full; the
    group's `max` spreads the first second's starts, and each later one follows its own), busiest
    the most starts any second held (at most `starts`), and reopen the seconds from each start to
    the `starts`-th after it (1 at best), at p50 and at most."""
    result = {}
    for where, remote in (("local", None), ("remote", cluster.dsn("bench"))):
        empty_task_table(conn)
        group = f"rate_{where}"
        conn.execute("SELECT task_limit(%s, %s, '1 second')", [group, starts])
        conn.execute("INSERT INTO task (input, \"group\", max, remote, delete)"
                     " SELECT 'SELECT 1', %s, 9, %s, false FROM generate_series(1, %s)", [group, remote, count])
        wait_all_ended(conn)
        times = [row[0] for row in conn.execute("SELECT extract(epoch FROM start)::float8 FROM task"
                                                " WHERE state = 'DONE' ORDER BY start").fetchall()]
        conn.execute("SELECT task_limit(%s, 0)", [group])
        if len(times) != count:
            raise TimedOut(f"only {len(times)} of {count} tasks DONE")
        span = times[-1] - times[0]
        result[f"{where}_span_s"] = round(span, 2)
        result[f"{where}_of_limit"] = round((math.ceil(count / starts) - 1) / span, 3)
        result[f"{where}_busiest"] = max(sum(1 for other in times if start <= other < start + 0.999)
                                         for start in times)
        reopen = [later - earlier for earlier, later in zip(times, times[starts:])]
        result[f"{where}_reopen_p50_s"] = round(statistics.median(reopen), 3)
        result[f"{where}_reopen_max_s"] = round(max(reopen), 3)
    return result


def grown(cluster, samples: int = 20) -> dict:
    """start - plan of lone tasks on a launcher started on an empty table, before and after a bulk
    load (triggers off, as a restore might) of 300,000 finished tasks and 100,000 planned for
    tomorrow, with no ANALYZE since (autovacuum off for the table): the plans the scheduler's
    backends made on the small table must not read the grown one whole."""
    cluster.create_database("grown")
    with cluster.connect("grown") as conn:
        conn.execute("ALTER TABLE task SET (autovacuum_enabled = false)")
        launcher = Launcher(cluster.dsn("grown")).start()
        try:
            launcher.wait_active()
            before = latency(conn, 0.0, samples)
            conn.execute("SET session_replication_role = replica")
            conn.execute("INSERT INTO task (input, state, plan, start, stop, output)"
                         " SELECT 'SELECT 1', 'DONE', now() - interval '1 day', now() - interval '1 day',"
                         " now() - interval '1 day', '1' FROM generate_series(1, 300000)")
            conn.execute("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'g' || (i % 100),"
                         " now() + interval '1 day' FROM generate_series(1, 100000) AS i")
            conn.execute("RESET session_replication_role")
            after = latency(conn, 0.0, samples)
        finally:
            launcher.stop()
    return {"median_ms": before["median_ms"], "grown_median_ms": after["median_ms"],
            "grown_p95_ms": after["p95_ms"], "ratio": round(after["median_ms"] / before["median_ms"], 2)}


def crowded(cluster, ahead: int = 100_000, samples: int = 20, batch: int = 200) -> dict:
    """Lone tasks (start - plan) and a batch of `batch` one-off tasks (tasks/s, from the first
    start to the last stop) in the default group, on a launcher started on an empty table, then
    the same once `ahead` tasks of that group are planned for tomorrow (analyzed): the group's
    claims read its tasks in priority order, and those planned ahead come first (lower ids).
    Beside them, the same in another group of the crowded table: what the crowd costs only its
    own group."""
    cluster.create_database("crowded")
    with cluster.connect("crowded") as conn:
        launcher = Launcher(cluster.dsn("crowded")).start()
        try:
            launcher.wait_active()

            def figures(group: str) -> dict:
                delays = []
                for _ in range(samples):
                    task_id = conn.execute("INSERT INTO task (\"group\", input, delete) VALUES (%s, 'SELECT 1', false)"
                                           " RETURNING id", [group]).fetchone()[0]
                    delays.append(start_delay_ms(conn, task_id, "state = 'DONE'", DEADLINE, "did not run"))
                first_id = conn.execute("INSERT INTO task (\"group\", input, delete) SELECT %s, 'SELECT 1', false"
                                        " FROM generate_series(1, %s) RETURNING id", [group, batch]).fetchone()[0]
                where = f"id >= {int(first_id)}"  # (the batch: every task inserted since is its)
                wait_all_ended(conn, where=where, poll=0.1)
                return {"median_ms": round(statistics.median(delays), 2),
                        "tasks_per_s": round(batch / span_seconds(conn, where), 1)}

            alone = figures("group")
            conn.execute("INSERT INTO task (input, plan) SELECT 'SELECT 1', now() + interval '1 day'"
                         " FROM generate_series(1, %s)", [ahead])
            conn.execute("ANALYZE task")
            crowd, other = figures("group"), figures("other")
        finally:
            launcher.stop()
    return {"ahead": ahead, "median_ms": alone["median_ms"], "crowded_median_ms": crowd["median_ms"],
            "other_group_median_ms": other["median_ms"], "tasks_per_s": alone["tasks_per_s"],
            "crowded_tasks_per_s": crowd["tasks_per_s"], "other_group_tasks_per_s": other["tasks_per_s"]}


def waiting(cluster) -> dict:
    """Claim cost of one due task with 100,000 tasks waiting for a prerequisite (planned a day
    ahead), against a table holding the one due task only; each in a database of its own, no
    launcher, measured in turns (10 of 40 claims each), so that both see the same machine load."""
    with_one_due_task(cluster, "waiting_empty", "waiting")
    with cluster.connect("waiting") as conn:
        first = conn.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 day')"
                             " RETURNING id").fetchone()[0]
        conn.execute("INSERT INTO task (input, \"group\", after) SELECT 'SELECT 1', 'g' || (i %% 100),"
                     " ARRAY[%s]::bigint[] FROM generate_series(1, 100000) AS i", [first])
        conn.execute("VACUUM ANALYZE pgtaskpy.pending_prerequisite")  # (not autovacuum while timed)
        settle(conn)
        counted = conn.execute("SELECT count(*) FROM task WHERE waiting_for = 1").fetchone()[0]
    with cluster.connect("waiting_empty") as empty, cluster.connect("waiting") as held:
        empty_ms, held_ms = claims_in_turns(empty, held, 10)
    return {"empty_ms": round(empty_ms, 3), "waiting_ms": round(held_ms, 3), "ratio": round(held_ms / empty_ms, 2),
            "waiting_tasks": counted}


def worker_start(cluster, backends: int = 10) -> dict:
    """The CPU a new worker backend spends before its first task (median of `backends` new ones,
    in ms, by the kernel's clock of each backend, /proc/PID/schedstat): loading PL/Python, then
    the first call of run_task (the launcher's warm-up of a spare: compiling and defining the
    worker's code, its first plans).  A burst in groups that no warm worker serves pays it once a
    worker: what `parallel` pays that `parallel_warm` does not."""
    def cpu_ms(pid: int) -> float:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6
    loads, first_calls = [], []
    for _ in range(backends):
        with cluster.connect("bench") as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            started = cpu_ms(pid)
            conn.execute("DO LANGUAGE plpython3u 'pass'")
            loaded = cpu_ms(pid)
            conn.execute("CALL pgtaskpy.run_task(0, 0, NULL)")
            loads.append(loaded - started)
            first_calls.append(cpu_ms(pid) - loaded)
    return {"plpython_load_ms": round(statistics.median(loads), 1),
            "first_call_ms": round(statistics.median(first_calls), 1), "backends": backends}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def burst(count: int = 200, sleep: float = 3.0, max_connections: int | None = None) -> dict:
    """`count` tasks of pg_sleep(`sleep`), each in a group of its own, inserted at once with no
    worker yet: start - plan (median, p95, last), how many ran at once at the most; beside the
    time this server takes to open `count` plain sessions at once (threads, each connecting), the
    bound a burst of new sessions cannot beat.  At the moment the most ran: the scheduler's
    backends (workers and launcher), all backends per running task, and the server's memory
    (the sum of its processes' PSS) per running task.  On a cluster of its own with room for
    the tasks' backends (max_connections 4 count, unless given)."""
    settings = {"max_connections": str(max_connections or 4 * count)}
    with throwaway_cluster(settings) as cluster:
        cluster.create_database("burst")
        launcher = Launcher(cluster.dsn("burst")).start()
        try:
            launcher.wait_active()
            time.sleep(1.0)  # the spare worker warms up
            sessions_s = open_sessions_seconds(cluster, count)
            with cluster.connect("burst") as conn, cluster.connect("burst") as watcher:
                watcher.autocommit = True
                conn.execute("INSERT INTO task (\"group\", input, delete) SELECT 'g' || i, %s, false"
                             " FROM generate_series(1, %s) AS i", [f"SELECT pg_sleep({sleep})", count])
                conn.commit()
                peak = peak_of_running(cluster, watcher, count, sleep)
                wait_all_ended(conn)
                lags = [float(row[0]) for row in conn.execute(
                    "SELECT extract(epoch FROM start - plan) * 1000 FROM task WHERE state = 'DONE'")]
                most = most_at_once(conn.execute("SELECT start, stop FROM task WHERE state = 'DONE'").fetchall())
                # Every task of a burst ends DONE: what else happened is printed, not averaged away.
                not_done = conn.execute(
                    "SELECT state::text, count(*), min(id), left(min(error), 500) FROM task WHERE state <> 'DONE'"
                    " GROUP BY state").fetchall()
        finally:
            launcher.stop()
    if not_done:
        print(f"burst of {count}: tasks that did not end DONE (state, how many, first id, an error): {not_done}"
              f"\nthe launcher's log, its end:\n{launcher.output()[-4000:]}", flush=True)
    return {"tasks": count, "done": len(lags), "start_lag_median_ms": round(statistics.median(lags), 1),
            "start_lag_p95_ms": round(percentile(lags, 0.95), 1), "start_lag_last_ms": round(max(lags), 1),
            "most_at_once": most, "open_sessions_ms": round(1000 * sessions_s, 1),
            "p95_of_open_sessions": round(percentile(lags, 0.95) / (1000 * sessions_s), 2), **peak}


def peak_of_running(cluster, conn, count: int, sleep: float) -> dict:
    """Look every 50 ms while the burst starts; at the look with the most tasks running: the
    scheduler's backends, every backend of the server per running task, and its memory."""
    look = ("SELECT (SELECT count(*) FROM task WHERE state = 'WORK'),"
            " count(*) FILTER (WHERE application_name IN (pgtaskpy.name_of('worker'), pgtaskpy.name_of('launcher'))),"
            " count(*) FILTER (WHERE backend_type = 'client backend')"
            " FROM pg_stat_activity")
    best = (0, 0, 0)
    deadline = time.monotonic() + sleep
    while time.monotonic() < deadline:
        sample = conn.execute(look).fetchone()
        if sample[0] > best[0]:
            best = sample
            memory_mib = server_pss_kib(cluster) / 1024
        if best[0] == count:
            break
        time.sleep(0.05)
    running, scheduler, clients = best
    if not running:
        return {"most_running_seen": 0}
    return {"most_running_seen": running, "scheduler_backends": scheduler,
            "scheduler_of_running": round(scheduler / running, 3), "backends_per_running": round(clients / running, 2),
            "server_pss_mib": round(memory_mib), "pss_mib_per_running": round(memory_mib / running, 2)}


def server_pss_kib(cluster) -> int:
    """The proportional set size of the server: the postmaster and every process it started."""
    postmaster = int(Path(cluster.data, "postmaster.pid").read_text().split()[0])
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if int(proc.name) != postmaster and parent != postmaster:
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return total


def open_sessions_seconds(cluster, count: int) -> float:
    """Seconds from the first of `count` threads starting to connect to the last connected."""
    connected = []
    ready = threading.Barrier(count + 1)

    def session() -> None:
        ready.wait()
        connected.append(psycopg.connect(cluster.dsn("burst")))

    threads = [threading.Thread(target=session) for _ in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for conn in connected:
        conn.close()
    return seconds


def idle(conn, launcher, seconds: float = 10.0) -> dict:
    """CPU of the launcher and its backends, and their transactions, with no tasks at all."""
    conn.execute("DELETE FROM task")
    time.sleep(1.0)
    backends = [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pg_task_py%%'").fetchall()]
    pids = [launcher.process.pid, *backends]
    xacts = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    before_cpu = sum(cpu_seconds(p) for p in pids)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    before_xacts = conn.execute(xacts).fetchone()[0]
    time.sleep(seconds)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    after_xacts = conn.execute(xacts).fetchone()[0]
    used = sum(cpu_seconds(p) for p in pids) - before_cpu
    # (this connection's own two queries count among the transactions)
    return {"cpu_percent_of_a_core": round(100 * used / seconds, 2),
            "transactions_per_s": round((after_xacts - before_xacts - 2) / seconds, 2)}


def server_cpu_seconds(conn, launcher, scheduler_only: bool = False) -> float:
    """CPU seconds the cluster (the postmaster, its live children, and the children it has reaped,
    such as tasks' ended sessions) and the launcher have used so far; `scheduler_only`: not
    counting the backend of `conn`, the bench's own (its insert and its polls for the ends)."""
    return sum(server_cpu_parts(conn, launcher, scheduler_only))


def server_cpu_parts(conn, launcher, scheduler_only: bool = False) -> tuple[float, float]:
    """server_cpu_seconds in two parts: the backends that have ended and the postmaster that
    started them (in `serial` and `parallel`, the tasks' sessions: their fork, start, input and
    end), and the rest (the live backends, which are the workers, the launcher's session and the
    server's background processes, and the launcher)."""
    def stat(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    bench_backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    postmaster = int(stat(bench_backend)[1])
    fields = stat(postmaster)
    ended = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    live = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and not (scheduler_only and int(entry.name) == bench_backend):
            with contextlib.suppress(OSError):
                child = stat(int(entry.name))
                if int(child[1]) == postmaster:
                    live += int(child[11]) + int(child[12])
    ticks = os.sysconf("SC_CLK_TCK")
    return ended / ticks, live / ticks + cpu_seconds(launcher.process.pid)


def runs_cost(conn, launcher, insert: str, count: int, runs: int | None = None,
              measured: str = "parent IS NULL", params: tuple = (), fresh: bool = True) -> tuple[float, float]:
    """Milliseconds a run, of the wall clock and of CPU (server and launcher), of `count` tasks
    due at once, inserted by `insert` (its own cost counted), until the last of the `measured`
    rows stops (a series' runs: the first ones; `runs` of them, default `count`).  `insert`
    takes `params`, then `count`; `fresh`: on an empty table."""
    if fresh:
        empty_task_table(conn)
    cpu = server_cpu_seconds(conn, launcher)
    started = time.perf_counter()
    conn.execute(insert, [*params, count])
    inserted = time.perf_counter() - started
    wait_all_ended(conn, where=measured, poll=0.1)
    cpu = server_cpu_seconds(conn, launcher) - cpu
    return (1000 * (inserted + span_seconds(conn, measured)) / (runs or count),
            1000 * cpu / (runs or count))


def due_runs_cost(conn, launcher, measured: str, count: int) -> tuple[float, float]:
    """Milliseconds a run, of the wall clock and of CPU (server and launcher), of the `count`
    waiting `measured` rows, which the scheduler inserted planned for one time: nothing is done to
    them, they become due when that time comes, as a series' runs do.  CPU counts from just
    before that time (the idle wait before it is not counted)."""
    plan, waiting = conn.execute(f"SELECT min(plan), count(*) FROM task WHERE {measured} AND state = 'PLAN'"
                                 ).fetchone()
    assert waiting == count, f"{waiting} of {count} runs waiting"
    # What the runs before left, vacuumed as the one-off tasks' table is: else autovacuum may
    # pick the table up while these run, and its CPU counts against them.
    conn.execute("VACUUM")
    ahead = (plan - conn.execute("SELECT clock_timestamp()").fetchone()[0]).total_seconds()
    time.sleep(max(ahead - 0.3, 0))
    cpu = server_cpu_seconds(conn, launcher)
    wait_all_ended(conn, where=measured, poll=0.1)
    cpu = server_cpu_seconds(conn, launcher) - cpu
    return 1000 * span_seconds(conn, measured) / count, 1000 * cpu / count


def wait_for_second(conn, low: float, high: float) -> None:
    """Until the server's clock is between `low` and `high` seconds into a minute."""
    end = time.monotonic() + 70
    while not low <= float(conn.execute("SELECT extract(second FROM clock_timestamp())").fetchone()[0]) < high:
        if time.monotonic() > end:
            raise TimedOut(f"the clock did not reach second {low} of a minute")
        time.sleep(0.2)


def one_off_minute_cost(conn, launcher, count: int) -> tuple[float, float]:
    """The minute's one-off tasks: `count` of them inserted by one statement now, planned for half
    past the minute, as a user's job inserts a minute's tasks; due_runs_cost's figures of their
    runs plus the insert's own wall time and CPU, a run."""
    cpu = server_cpu_seconds(conn, launcher)
    started = time.perf_counter()
    low, high = conn.execute("WITH i AS (INSERT INTO task (input, delete, plan)"
                             " SELECT 'SELECT 1', false, date_trunc('minute', now()) + interval '30 s'"
                             " FROM generate_series(1, %s) RETURNING id) SELECT min(id), max(id) FROM i",
                             [count]).fetchone()
    inserted = (time.perf_counter() - started, server_cpu_seconds(conn, launcher) - cpu)
    wall, cpu_ms = due_runs_cost(conn, launcher, f"id BETWEEN {low} AND {high}", count)
    return wall + 1000 * inserted[0] / count, cpu_ms + 1000 * inserted[1] / count


def cron(conn, launcher, count: int = 1000, rounds: int = 4) -> dict:
    """1,000 series of '* * * * *' against 1,000 one-off tasks a minute, in one table, in turns
    within each minute: the series' runs come due at the minute (the run before inserted each,
    and each one's end computes the next match and inserts the next run), the one-off tasks at
    half past (a user inserts them at a quarter past, the insert counted).  Both find the same
    table and the same idle launcher, and both are measured by due_runs_cost: milliseconds a run
    of the wall clock and of CPU, the best of `rounds` minutes each.  Besides: the series' first
    runs (the user's insert counted) against one-off tasks inserted due at once, as
    first_run_ratio; and what computing one next match costs (parse and search, 10,000 calls in
    one query, each parsing the expression again).  About a minute a round."""
    empty_task_table(conn)
    wait_for_second(conn, 25, 40)  # the first runs end before the minute their next runs are due
    one_off_now = runs_cost(conn, launcher, "INSERT INTO task (input, delete) SELECT 'SELECT 1', false"
                                            " FROM generate_series(1, %s)", count, fresh=False)
    first = runs_cost(conn, launcher, "INSERT INTO task (cron, plan, input, delete)"
                                      " SELECT '* * * * *', now() - interval '1 s', 'SELECT 1', false"
                                      " FROM generate_series(1, %s)", count,
                      measured="cron IS NOT NULL AND parent IS NULL", fresh=False)
    one_off, series = [], []
    for _ in range(rounds):
        low, high, waiting = conn.execute("SELECT min(id), max(id), count(*) FROM task"
                                          " WHERE cron IS NOT NULL AND state = 'PLAN'").fetchone()
        assert waiting == count, "every run of a series has its next run"
        series.append(due_runs_cost(conn, launcher, f"id BETWEEN {low} AND {high}", count))
        assert conn.execute(f"SELECT count(*) FROM task WHERE id > {high} AND cron IS NOT NULL AND state = 'PLAN'"
                            ).fetchone()[0] == count, "every run of a series has its next run"
        wait_for_second(conn, 15, 25)
        one_off.append(one_off_minute_cost(conn, launcher, count))
    conn.execute("DELETE FROM task")
    match_us = {}
    for name, expression, tz in (("utc", "* * * * *", "UTC"), ("berlin", "*/5 9-17 * * mon-fri", "Europe/Berlin"),
                                 ("new_york_dst", "30 2 * * *", "America/New_York")):
        started = time.perf_counter()
        # (the expression as a column of a subquery that is not pulled up: a constant argument
        # would be parsed once, when the query is planned)
        conn.execute("SELECT count(pgtaskpy.cron_next(e.cron, e.tz, timestamptz '2024-01-01 00:00+00'"
                     " + i * interval '53 min')) FROM (SELECT %s::text AS cron, %s::text AS tz OFFSET 0) AS e,"
                     " generate_series(1, 10000) AS i", [expression, tz])
        match_us[f"next_match_us_{name}"] = round(1e6 * (time.perf_counter() - started) / 10000, 1)
    wall = (min(w for w, _ in one_off), min(w for w, _ in series))
    cpu = (min(c for _, c in one_off), min(c for _, c in series))
    return {"series": count, "one_off_cpu_ms_per_run": round(cpu[0], 3), "cron_cpu_ms_per_run": round(cpu[1], 3),
            "cpu_ratio": round(cpu[1] / cpu[0], 3), "one_off_ms_per_run": round(wall[0], 3),
            "cron_ms_per_run": round(wall[1], 3), "ratio": round(wall[1] / wall[0], 3),
            "first_run_ratio": round(first[0] / one_off_now[0], 3),
            "first_run_cpu_ratio": round(first[1] / one_off_now[1], 3), **match_us,
            # (each minute's wall ms a run, one-off against series: how far single rounds swing)
            "rounds": [(round(o[0], 3), round(c[0], 3)) for o, c in zip(one_off, series)]}


# Fails with a serialization failure while its attempt is at most N (it reads its own row).
FLAKY = ("DO $$ BEGIN IF (SELECT attempt FROM task WHERE id = current_setting('pg_task.id')::bigint) <= {}"
         " THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; END $$")


def retry(conn, launcher, count: int = 500) -> dict:
    """A retry against a new task: `count` tasks that fail once and are retried at once
    (retry_delay 0: the scheduler inserts each retry as the failure ends) against 2 * `count`
    tasks a user inserts, half failing and half not (the insert counted): the same runs, the same
    SQL, in milliseconds a run of the wall clock and of CPU, the best of three rounds each."""
    one_off, retried = [], []
    for _ in range(3):
        one_off.append(runs_cost(
            conn, launcher, "INSERT INTO task (input, delete) SELECT CASE WHEN i %% 2 = 0 THEN %s ELSE %s END,"
            " false FROM generate_series(1, %s) AS i", 2 * count, measured="true",
            params=(FLAKY.format(1), FLAKY.format(0))))
        retried.append(runs_cost(
            conn, launcher, "INSERT INTO task (input, retry, retry_delay, delete)"
            " SELECT %s, 1, '0 s', false FROM generate_series(1, %s)", count, runs=2 * count, measured="true",
            params=(FLAKY.format(1),)))
        assert conn.execute("SELECT count(*) FROM task WHERE attempt = 2 AND state = 'DONE'").fetchone()[0] \
            == count, "every task ran its retry"
    conn.execute("DELETE FROM task")
    wall = (min(w for w, _ in one_off), min(w for w, _ in retried))
    cpu = (min(c for _, c in one_off), min(c for _, c in retried))
    return {"tasks": count, "one_off_ms_per_run": round(wall[0], 3), "retry_ms_per_run": round(wall[1], 3),
            "ratio": round(wall[1] / wall[0], 3), "one_off_cpu_ms_per_run": round(cpu[0], 3),
            "retry_cpu_ms_per_run": round(cpu[1], 3), "cpu_ratio": round(cpu[1] / cpu[0], 3)}


def stats_view(cluster) -> dict:
    """The view task_stats with 1,000,000 finished rows in 1,000 groups (their stops spread over 30
    days, so about 1,400 ended in the last hour) and 1,000 waiting tasks: median time of one
    read of the whole view, by the server's clock, as a superuser and as a role that sees one
    group (row-level security); in a database of its own.  And (series_*) a read of the view
    task_series there, with 100 cron series of the superuser and 10 of the role.  Then (half_*)
    both views read by the role once it owns half the finished rows, as an application's role
    does: row-level security keeps the planner from the table's statistics."""
    cluster.create_database("stats")
    with cluster.connect("stats") as conn:
        conn.execute("SET session_replication_role = replica")  # rows and counters written in bulk below
        conn.execute("INSERT INTO task (input, \"group\", state, plan, start, stop, output)"
                     " SELECT 'SELECT 1', 'g' || (i % 1000), CASE WHEN i % 10 = 0 THEN 'FAIL' ELSE 'DONE' END::state,"
                     " now() - i * interval '2.6 s', now() - i * interval '2.6 s' + interval '3 ms',"
                     " now() - i * interval '2.6 s' + interval '5 ms', '1' FROM generate_series(1, 1000000) AS i")
        conn.execute("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'g' || i, now() + interval '1 day'"
                     " FROM generate_series(1, 1000) AS i")
        count_groups(conn)
        conn.execute("SET session_replication_role = origin")
        conn.execute("CREATE ROLE stats_reader LOGIN IN ROLE pgtaskpy_user")
        conn.execute("UPDATE task SET owner = 'stats_reader' WHERE \"group\" = 'g1' AND state = 'PLAN'")
        conn.execute("VACUUM ANALYZE task")
        conn.execute("CHECKPOINT")
        groups = conn.execute("SELECT count(*) FROM task_stats").fetchone()[0]
        superuser = view_ms(conn)
        conn.execute("SELECT task_schedule('s' || i, '0 3 * * *', 'SELECT 1') FROM generate_series(1, 100) AS i")
        series = read_ms(conn, "SELECT * FROM task_series")
    with cluster.connect("stats", "stats_reader") as reader:
        seen = reader.execute("SELECT count(*) FROM task_stats").fetchone()[0]
        one_role = view_ms(reader)
        reader.execute("SELECT task_schedule('s' || i, '0 3 * * *', 'SELECT 1') FROM generate_series(1, 10) AS i")
        one_role_series = read_ms(reader, "SELECT * FROM task_series")
    with cluster.connect("stats") as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE task SET owner = 'stats_reader' WHERE state IN ('DONE', 'FAIL') AND id % 2 = 0")
        conn.execute("DELETE FROM pgtaskpy.group_counts")
        count_groups(conn)
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE task")
    with cluster.connect("stats", "stats_reader") as reader:
        half_groups = reader.execute("SELECT count(*) FROM task_stats").fetchone()[0]
        half = read_ms(reader, "SELECT * FROM task_stats")
        half_series = read_ms(reader, "SELECT * FROM task_series")
    return {"finished_rows": 1000000, "groups": groups, **{f"view_{k}": v for k, v in superuser.items()},
            "one_role_groups": seen, **{f"one_role_{k}": v for k, v in one_role.items()},
            "series_median_ms": series, "one_role_series_median_ms": one_role_series,
            "half_groups": half_groups, "half_median_ms": half, "half_series_median_ms": half_series}


def count_groups(conn) -> None:
    """group_counts as the scheduler would have them for the finished rows (written in bulk)."""
    conn.execute("INSERT INTO pgtaskpy.group_counts (owner, \"group\", done, fail, last_success, last_failure)"
                 " SELECT owner, \"group\", count(*) FILTER (WHERE state = 'DONE'),"
                 " count(*) FILTER (WHERE state = 'FAIL'), max(stop) FILTER (WHERE state = 'DONE'),"
                 " max(stop) FILTER (WHERE state = 'FAIL') FROM task WHERE state IN ('DONE', 'FAIL')"
                 " GROUP BY owner, \"group\"")


def read_ms(conn, query: str, repeat: int = 50) -> float:
    """Median time (ms, by the client's clock) of `query` with every row fetched."""
    conn.execute(query).fetchall()  # the session's caches are filled
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        conn.execute(query).fetchall()
        times.append(1000 * (time.perf_counter() - started))
    return round(statistics.median(times), 3)


def view_ms(conn, repeat: int = 50) -> dict:
    """`SELECT * FROM task_stats`, every row fetched as a Python client does (psycopg, each value
    converted): the median and the least time a read by the client's clock, and the server
    backend's CPU time a read (a fair figure when other processes share the cores); the median
    answer as psql gets it (rows received as text); and the server's execution time."""
    conn.execute("SELECT * FROM task_stats").fetchall()  # the session's catalog caches are filled
    cpu = cpu_seconds(conn.info.backend_pid)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        conn.execute("SELECT * FROM task_stats").fetchall()
        times.append(1000 * (time.perf_counter() - started))
    cpu = cpu_seconds(conn.info.backend_pid) - cpu
    # The answer as psql gets it: the query sent, every row received as text, nothing converted
    # (psycopg's conversion of 22,000 values to Python objects is the client's own work).
    answers = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = conn.pgconn.exec_(b"SELECT * FROM task_stats")
        answers.append(1000 * (time.perf_counter() - started))
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK and result.ntuples > 0
    # The server's execution time alone (EXPLAIN ANALYZE: no output formatting, no transfer).
    executions = [float(next(line[0] for line in conn.execute(
        "EXPLAIN (ANALYZE, TIMING OFF) SELECT * FROM task_stats").fetchall()
        if line[0].startswith("Execution Time")).split()[2]) for _ in range(repeat)]
    return {"median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "cpu_ms": round(1000 * cpu / repeat, 3), "answer_median_ms": round(statistics.median(answers), 3),
            "execution_median_ms": round(statistics.median(executions), 3)}


REUSE = ("INSERT INTO task (max, count, input, delete)"
         " SELECT 3, 100, 'SELECT 1', false FROM generate_series(1, %s)")


def events(conn, launcher, rounds: int = 9) -> dict:
    """Reuse throughput without the end-of-task hook (pgtaskpy.task_ended replaced by a no-op for
    the measurement), with it (counters), and with pg_task_py.notify_done on (counters and a
    NOTIFY a task, with a listener), alternating, median of `rounds` each; and the CPU (server
    and launcher) a task of each, the median of the rounds, which other work on the machine
    swings less than the rate."""
    hook = conn.execute("SELECT pg_get_functiondef('pgtaskpy.task_ended(task)'::regprocedure)").fetchone()[0]
    listener = psycopg.connect(conn.info.dsn, autocommit=True)
    listener.execute("LISTEN pg_task_py_done")
    results: dict[str, list[float]] = {"without": [], "counters": [], "notify": []}
    cpu: dict[str, list[float]] = {variant: [] for variant in results}
    try:
        for _ in range(rounds):
            for variant in results:
                if variant == "without":
                    conn.execute("CREATE OR REPLACE FUNCTION pgtaskpy.task_ended(t task) RETURNS void"
                                 " LANGUAGE sql AS 'SELECT'")
                else:
                    conn.execute(hook)
                conn.execute(f"ALTER DATABASE bench {'SET' if variant == 'notify' else 'RESET'}"
                             " pg_task_py.notify_done" + (" = on" if variant == "notify" else ""))
                empty_task_table(conn)
                before = server_cpu_seconds(conn, launcher)
                results[variant].append(throughput(conn, REUSE, 500, fresh=False)["tasks_per_s"])
                cpu[variant].append(1000 * (server_cpu_seconds(conn, launcher) - before) / 500)  # ms a task
                for _ in listener.notifies(timeout=0):  # read what arrived, so the queue stays empty
                    pass
        hook_us = {variant: hook_cost_us(conn, listener, variant) for variant in ("counters", "notify")}
    finally:
        conn.execute(hook)
        conn.execute("ALTER DATABASE bench RESET pg_task_py.notify_done")
        listener.close()
    # Other processes on the machine make single rounds noisy: the median and the best round of each.
    medians = {variant: statistics.median(values) for variant, values in results.items()}
    best = {variant: max(values) for variant, values in results.items()}
    cpu_ms = {variant: statistics.median(values) for variant, values in cpu.items()}
    return {**{f"{variant}_tasks_per_s": round(value, 1) for variant, value in medians.items()},
            "counters_cost_percent": round(100 * (1 - medians["counters"] / medians["without"]), 1),
            "notify_cost_percent": round(100 * (1 - medians["notify"] / medians["counters"]), 1),
            **{f"{variant}_cpu_ms_per_task": round(value, 3) for variant, value in cpu_ms.items()},
            "counters_cpu_cost_percent": round(100 * (cpu_ms["counters"] / cpu_ms["without"] - 1), 1),
            "notify_cpu_cost_percent": round(100 * (cpu_ms["notify"] / cpu_ms["counters"] - 1), 1),
            **{f"{variant}_hook_us_per_task": round(value, 1) for variant, value in hook_us.items()},
            "counters_hook_percent_of_cpu": round(100 * hook_us["counters"] / (1000 * cpu_ms["counters"]), 1),
            "notify_hook_percent_of_cpu": round(100 * hook_us["notify"] / (1000 * cpu_ms["notify"]), 1),
            "best_counters_cost_percent": round(100 * (1 - best["counters"] / best["without"]), 1),
            "best_notify_cost_percent": round(100 * (1 - best["notify"] / best["counters"]), 1),
            "runs": {variant: values for variant, values in results.items()}}


def hook_cost_us(conn, listener, variant: str, count: int = 500) -> float:
    """Microseconds a task's end spends in pgtaskpy.task_ended (the counters, and the event when
    `variant` is notify), by the server's own function timing over one more round of reuse tasks:
    a figure the machine's noise does not swing, unlike the rounds' rates."""
    conn.execute(f"ALTER DATABASE bench {'SET' if variant == 'notify' else 'RESET'}"
                 " pg_task_py.notify_done" + (" = on" if variant == "notify" else ""))
    conn.execute("ALTER SYSTEM SET track_functions = 'pl'")
    try:
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)  # every backend has read the configuration again
        empty_task_table(conn)
        conn.execute("SELECT pg_stat_reset()")
        throughput(conn, REUSE, count, fresh=False)
        for _ in listener.notifies(timeout=0):
            pass
        deadline = time.monotonic() + 30  # (backends report their function times when idle, within 10 s)
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            calls, total_ms = conn.execute(
                "SELECT COALESCE(sum(calls), 0)::bigint, COALESCE(sum(total_time), 0)::float8"
                " FROM pg_stat_user_functions WHERE funcname = 'task_ended'").fetchone()
            if calls >= count or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if calls < count:
            raise TimedOut(f"task_ended's timing reported for {calls} of {count} ends")
        return 1000 * total_ms / calls
    finally:
        conn.execute("ALTER SYSTEM RESET track_functions")
        conn.execute("SELECT pg_reload_conf()")


# One-off tasks in eight groups, as many as the parameter says.
PARALLEL_INSERT = ("INSERT INTO task (\"group\", input, delete)"
                   " SELECT 'g' || (i %% 8), 'SELECT 1', false FROM generate_series(1, %s) AS i")


def parallel_on_warm_workers(conn, launcher) -> dict:
    """`parallel`'s 500 tasks on the eight workers of a round of 80 run just before (not counted),
    as a steady load of eight groups finds them; the least worker's backends are connected and
    have PL/Python loaded before its clock starts too."""
    throughput(conn, PARALLEL_INSERT, 80)
    return throughput(conn, PARALLEL_INSERT, 500, launcher=launcher)


SCENARIOS = {
    "latency": None,  # needs the cluster: see latency_with_floor()
    "timed": lambda conn, launcher: latency(conn, 0.3, 20),
    "serial": lambda conn, launcher: throughput(
        conn, "INSERT INTO task (input, delete) SELECT 'SELECT 1', false FROM generate_series(1, %s)", 500,
        launcher=launcher),
    "parallel": lambda conn, launcher: throughput(conn, PARALLEL_INSERT, 500, launcher=launcher),
    "parallel_warm": lambda conn, launcher: parallel_on_warm_workers(conn, launcher),
    # The least a PL/Python worker can do, one-off tasks as serial's and parallel's: their bound.
    "least_serial": lambda conn, launcher: least_worker_throughput(conn, launcher, 1),
    "least_parallel": lambda conn, launcher: least_worker_throughput(conn, launcher, 8),
    "reuse": lambda conn, launcher: throughput(
        conn, "INSERT INTO task (max, count, input, delete)"
        " SELECT 3, 100, 'SELECT 1', false FROM generate_series(1, %s)", 500),
    "chain": None,  # needs the launcher: see chain()
    "waiting": None,  # needs the cluster: see waiting()
    "cron": None,  # needs the launcher: see cron()
    "retry": None,  # needs the launcher: see retry()
    "backlog": None,  # needs the cluster: see backlog()
    "grown": None,  # needs the cluster: see grown()
    "crowded": None,  # needs the cluster: see crowded()
    "idle": None,  # needs the launcher: see idle()
    "burst": None,  # a cluster of its own: see burst()
    "thousand": None,  # a cluster of its own: see burst()
    "stats": None,  # needs the cluster: see stats_view()
    "events": None,  # needs the launcher: see events()
    "worker_start": None,  # needs the cluster: see worker_start()
    "rate": None,  # needs the cluster: see rate()
}


# A production server's settings: every commit waits for its WAL to reach the disk.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
# The scenarios of the start path, which a durable cluster changes most (each task commits).
DURABLE_SCENARIOS = ("latency", "timed", "serial", "parallel", "parallel_warm", "least_serial", "least_parallel",
                     "reuse")
# A new session a task, as in pg_task: measured beside pgbench -C (new_sessions_per_s), run
# just before and just after the scenario (new_sessions_beside_per_s, their mean): this
# machine's pace changes from minute to minute, and the floor's, a minute earlier, moved a
# scenario's ratio between 0.49 and 0.79 from one run to the next.
NEW_SESSION_SCENARIOS = ("serial", "parallel", "parallel_warm", "least_serial", "least_parallel")
NEW_SESSIONS_TARGET = 0.9  # of new_sessions_per_s (issue 20)


def run_scenarios(chosen: list[str], settings: dict[str, str] | None = None) -> list[dict]:
    """The floor, then the chosen scenarios, on a throw-away cluster of their own (SETTINGS, with
    `settings` over them) with one launcher; each result with its ratio to the floor."""
    results = []
    with throwaway_cluster(settings) as cluster:
        floor_result = None
        cluster.create_database("bench")
        launcher = Launcher(cluster.dsn("bench")).start()
        try:
            launcher.wait_active()
            with cluster.connect("bench") as conn:
                try:
                    floor_result = {"scenario": "floor", **floor(cluster, conn, launcher)}
                except (TimedOut, subprocess.TimeoutExpired) as exc:
                    floor_result = {"scenario": "floor", "timeout": str(exc)}
                results.append(floor_result)
                time.sleep(1.0)  # the spare worker warms up
                for name in chosen:
                    try:
                        results.append({"scenario": name, **run_scenario(name, cluster, conn, launcher)})
                    except TimedOut as exc:
                        results.append({"scenario": name, "timeout": str(exc)})
                    conn.execute("DELETE FROM task")
        finally:
            launcher.stop()
    floor_tps = (floor_result or {}).get("tasks_per_s")
    sessions = (floor_result or {}).get("new_sessions_per_s")
    for result in results:
        if floor_tps and "tasks_per_s" in result and result["scenario"] != "floor":
            result["of_floor"] = round(result["tasks_per_s"] / floor_tps, 3)
        if sessions and result["scenario"] in NEW_SESSION_SCENARIOS and "tasks_per_s" in result:
            beside = result.get("new_sessions_beside_per_s") or sessions
            result["of_new_sessions"] = round(result["tasks_per_s"] / beside, 3)
            if result.get("task_cpu_ms"):
                # The most tasks a second this machine's cores could run at this CPU cost a task,
                # beside new_sessions_per_s: how near to it this way of running them can come.
                most = os.cpu_count() * 1000 / result["task_cpu_ms"]
                result["cpu_bound_of_new_sessions"] = round(most / beside, 3)
                # The scheduler's CPU a task at which the cores would run NEW_SESSIONS_TARGET of
                # new_sessions_per_s, the tasks' sessions costing what they cost in this run.
                budget = os.cpu_count() * 1000 / (NEW_SESSIONS_TARGET * beside) - result["sessions_cpu_ms"]
                result["scheduler_budget_ms"] = round(budget, 3)
    by_name = {result["scenario"]: result for result in results}
    for name, least_name in (("serial", "least_serial"), ("parallel", "least_parallel"),
                             ("parallel_warm", "least_parallel")):
        ours, least = by_name.get(name, {}), by_name.get(least_name, {})
        if ours.get("of_new_sessions") and least.get("of_new_sessions"):
            # What pg_task_py's rules and the worker's code around them leave of the least worker's pace.
            ours["of_least_worker"] = round(ours["of_new_sessions"] / least["of_new_sessions"], 3)
    return results


def run_scenario(name: str, cluster, conn, launcher) -> dict:
    if name in NEW_SESSION_SCENARIOS:
        before, _, _ = new_sessions(cluster, conn, launcher, 2)
        result = SCENARIOS[name](conn, launcher)
        after, _, _ = new_sessions(cluster, conn, launcher, 2)
        return {**result, "new_sessions_beside_per_s": round((before + after) / 2, 1)}
    if name == "latency":
        return latency_with_floor(cluster, conn)
    if name == "idle":
        return idle(conn, launcher)
    if name == "backlog":
        return backlog(cluster)
    if name == "grown":
        return grown(cluster)
    if name == "crowded":
        return crowded(cluster)
    if name == "burst":
        return burst()
    if name == "thousand":  # issue 20's scenario: 1,000 tasks at once, max_connections 1100
        return burst(1000, 5.0, max_connections=1100)
    if name == "waiting":
        return waiting(cluster)
    if name == "stats":
        return stats_view(cluster)
    if name == "events":
        return events(conn, launcher)
    if name == "chain":
        return chain(conn, launcher)
    if name == "cron":
        return cron(conn, launcher)
    if name == "retry":
        return retry(conn, launcher)
    if name == "worker_start":
        return worker_start(cluster)
    if name == "rate":
        return rate(cluster, conn)
    return SCENARIOS[name](conn, launcher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-s", "--scenario", action="append", choices=list(SCENARIOS),
                        help="run only these (repeatable)")
    parser.add_argument("--durable", action="store_true",
                        help="also run the chosen start-path scenarios (" + ", ".join(DURABLE_SCENARIOS) + ") on a"
                        " cluster with fsync, synchronous_commit and full_page_writes on (the default when no"
                        " scenario is chosen)")
    args = parser.parse_args()
    chosen = args.scenario or list(SCENARIOS)
    runs = {"fsync off": run_scenarios(chosen)}
    durable = [name for name in chosen if name in DURABLE_SCENARIOS]
    if (args.durable or not args.scenario) and durable:
        runs["durable"] = run_scenarios(durable, DURABLE)
    for cluster_name, results in runs.items():
        print(f"{cluster_name}:")
        print(f"  {'scenario':<10} result")
        for result in results:
            figures = ", ".join(f"{k} {v}" for k, v in result.items() if k != "scenario")
            print(f"  {result['scenario']:<10} {figures}")
    for cluster_name, results in runs.items():
        for result in results:
            print(json.dumps({"cluster": cluster_name, **result}))


if __name__ == "__main__":
    main()
