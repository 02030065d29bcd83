"""Body of FUNCTION pgtaskpy.dispatch(run_limit, cancel_running) RETURNS (events, wake_in, running).

One turn of the scheduler, run in the launcher's own session each time the
launcher wakes (NOTIFY, a planned time, or a second passing):

1. once a second: recover tasks of dead backends, expire tasks past `active`;
2. claim due tasks (pgtaskpy.claim_due_tasks) up to the free worker slots;
3. collect workers whose CALL has returned, and log what they report (a
   worker may have gone on with its group's next tasks);
4. start each claimed task on an idle worker backend (kept open, so a task
   pays no connection start-up) or on a new one, with dblink_send_query; a
   burst (more tasks than the idle workers and a turn's new ones) goes
   TASKS_A_WORKER tasks to a worker, which runs them side by side (run_batch.py);
5. close workers idle too long; say when to wake up next.

Worker backends are this session's dblink connections; their state lives in
GD, which lasts as long as the session (and across ALTER EXTENSION UPDATE:
see POOL_LAYOUT).
"""

import json
import time

TYPE_CHECKING = False  # (not typing's: importing it slows a worker's first call; bench/RESULTS.md)

if TYPE_CHECKING:  # assembled with plans.py by sql/build.py
    from plans import WARM_AHEAD, Context, replan_after_growth

HOUSEKEEPING_EVERY = 1.0  # seconds between orphan/expiry checks; also the longest sleep
# Most tasks pgtaskpy.expire_inactive_tasks ends a call: a full batch means more are waiting to,
# and the next turn, 10 ms later, ends the next batch (expire_inactive_tasks below).
EXPIRE_BATCH = 1000
# About how many counter changes pgtaskpy.fold_group_counts adds up a call, in whole groups
# (task_stats' counters): while more wait, the next turns go on with them, as with EXPIRE_BATCH.
# A task author's bulk of a million finished rows, folded in one call, held every role's claims 12 s.
FOLD_BATCH = 5000
RETENTION_WARN_EVERY = 60.0  # seconds between warnings that retention cannot delete (delete_finished_tasks)
KEEP_IDLE_WORKER = 10.0  # seconds an idle worker backend stays open for the next task
SPARE_LOOK_EVERY = 1.0  # seconds between looks whether the server still has room for a spare worker
KEEP_IDLE_SESSION = 1.0  # seconds a worker holding a reusable task session waits for its group
ANSWER_WAIT = 0.005  # seconds to wait for a worker that has no task left to return
WARM_UP = 0  # the "task id" of the call that loads PL/Python in a new spare worker
# Most new worker backends a turn connects (one after another: dblink_connect waits for each).
# A turn's claimed tasks start only once it commits, so a burst is claimed a few at a time:
# the first tasks start after a few connections, not after one for every task.
NEW_WORKERS_A_TURN = 8
# Most tasks of a burst one worker runs side by side (pgtaskpy.run_tasks): a burst of N tasks
# holds N task sessions and about N / TASKS_A_WORKER workers, and waits for as few connections.
TASKS_A_WORKER = 100
MOST_WARM = 1000  # most idle workers kept warm for tasks coming due
# Seconds a launcher opens no new worker after one could not be opened (its role refused by
# pg_hba.conf, say): turns that claimed a task, failed to connect and gave it back, 10 ms apart,
# logged 390 lines a second and loaded the server with failed logins.
CONNECT_RETRY_AFTER = 1.0
# Seconds a launcher claims nothing after it could not send a worker its task (dblink's functions
# moved under it, say; a dead connection's send does not fail, its worker's answer does): turns
# that claimed the task and gave it back, a few milliseconds apart, logged 400 lines a second.
START_RETRY_AFTER = 1.0
# Worker calls that may fail before a task they were given starts (it waits again each time, as
# if never claimed).  An error that comes back at every call (a task the worker cannot read)
# would claim and give back the task for ever: at this many, it ends FAIL with that error.
FAILED_STARTS = 3
# Seconds a task whose session the server refused (no free connection, a role's or database's
# CONNECTION LIMIT, connections not allowed) is left out of this launcher's claims: claimed again
# at once, a remote server's refusal was tried 380 times a second for as long as it lasted.
HOLD_POSTPONED = 1.0
WORKER_FILES_SPARED = 30  # of a third of the launcher session's files (most_workers)
STANDBY_LOOK_EVERY = 0.5  # seconds between a standby's turns: how soon a promotion is seen
SUBSCRIPTION_LOOK_EVERY = 1.0  # seconds between looks whether a subscription copies the task table here


# What a scheduler backend (the launcher's session, a worker) sets for itself, whatever the
# database's or role's defaults: no timeouts (the tasks' own are their sessions'; a worker's CALL
# is one long statement, and the launcher idles up to a second between turns); read-write
# transactions (a database's default_transaction_read_only failed every claim); READ COMMITTED,
# which the row locks assume (a worker that waits for the launcher's claim to commit then reads
# the row as claimed); and no JIT, whose compiling costs milliseconds a statement of queries that
# run in microseconds (with an analytics database's jit_above_cost = 0, a lone task started 3.3 s
# after its plan); and no parallel query, whose workers take milliseconds to start for the same
# queries (with parallel_setup_cost = 0, a lone task started 17 ms after its plan, not 3 ms).
SCHEDULER_SETTINGS = {
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "idle_session_timeout": "0",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "jit": "off",
    "max_parallel_workers_per_gather": "0",
    "pg_task_py.wake": "on",  # (a database's off would leave the launchers their once-a-second look)
    "standard_conforming_strings": "on",  # (the scheduler's SQL is written so)
    "role": "none",  # (the role it logged in as: not one a DBA's ALTER ROLE ... SET role gave it)
    "session_replication_role": "origin",  # (the table's triggers fire for its rows: REPLICA_DEFAULTS)
    # (its ends resolve their dependents themselves: task_prerequisite_stopped is for hand ends)
    "pgtaskpy.scheduler": "on",
    # (a task's tz may be an abbreviation, read by this list, as every plan is: cron_next and
    # next_plan in any session; a database's or role's own list planned a series by two offsets)
    "timezone_abbreviations": "Default",
}


def scheduler_options():
    """SCHEDULER_SETTINGS as a new worker's connection options (a space in a value escaped)."""
    return " ".join(f"-c {name}={value.replace(' ', chr(92) + ' ')}" for name, value in SCHEDULER_SETTINGS.items())


def settle_scheduler_session(ctx):
    """SCHEDULER_SETTINGS in the launcher's own session, once: a function's set_config(..., false)
    lasts for the session, as the launcher's application_name does (set_session_name)."""
    if not ctx.GD.get("pgtaskpy.scheduler_settings"):
        ctx.run("scheduler_settings",
                "SELECT pg_catalog.set_config(s.name, s.value, false)"
                " FROM unnest($1::text[], $2::text[]) AS s(name, value)",
                ["text[]", "text[]"], [list(SCHEDULER_SETTINGS), list(SCHEDULER_SETTINGS.values())])
        ctx.GD["pgtaskpy.scheduler_settings"] = True


def quote_conninfo(value):
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def worker_conninfo(ctx):
    """A loopback connection to this database as the launcher's own role."""
    row = ctx.run(
        "conninfo",
        "SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
        " current_setting('port') AS port, current_database() AS dbname, current_user AS usr",
    )[0]
    parts = {
        "host": row["host"].strip() or "localhost",
        "port": row["port"],
        "dbname": row["dbname"],
        "user": row["usr"],
        "application_name": ctx.name_of("worker"),
        # The worker is a superuser session: it resolves nothing through a
        # schema that others could create objects in.  And the database's and
        # role's timeouts, isolation level and JIT are not its (SCHEDULER_SETTINGS).
        "options": "-c search_path=pg_catalog,pg_temp " + scheduler_options(),
    }
    return " ".join(f"{key}={quote_conninfo(value)}" for key, value in parts.items())


# The layout of the pool below and of what its workers keep in GD (sessions.py).  A
# pool of another layout was left by the code before an update, and so were its workers'
# sessions: the new code starts afresh.  (3: workers keep a TaskSessions object;
# 4: a worker's "tasks", all it was given, and "ahead", the sessions it has started ahead.)
POOL_LAYOUT = 4


def state(ctx, events):
    pool = ctx.GD.get("pgtaskpy.pool")
    if pool is not None and pool.get("layout") != POOL_LAYOUT:
        # ALTER EXTENSION ... UPDATE under a running launcher: close the old
        # code's workers (a busy one still records its task's end) and start afresh.
        for name in list(pool["workers"]):
            disconnect(ctx, pool, name)
        pool = None
    if pool is not None and "pgtaskpy.table_seen" not in ctx.SD:
        # This code's first turn in the session (CREATE EXTENSION or ALTER EXTENSION UPDATE made
        # it).  A table other than the pool's: the extension was dropped and created again under
        # the launcher.  Its workers ran tasks of the dropped table, whose ids the new one gives
        # again: closed, not collected (their calls' failures named the new table's tasks:
        # 'task 1: cache lookup failed').
        table = task_table_oid(ctx)
        if pool.setdefault("table", table) != table:  # (a pool of 1.2's code has none)
            events.append({"event": "extension_recreated", "workers": len(pool["workers"])})
            for name in list(pool["workers"]):
                disconnect(ctx, pool, name)
            pool = None
    if pool is None:
        pool = ctx.GD["pgtaskpy.pool"] = {"layout": POOL_LAYOUT, "workers": {}, "serial": 0, "housekeeping_at": 0.0,
                                          "name": None, "pid": ctx.run("pid", "SELECT pg_backend_pid() AS p")[0]["p"],
                                          "table": task_table_oid(ctx)}
    ctx.SD["pgtaskpy.table_seen"] = True
    return pool


def task_table_oid(ctx):
    return ctx.run("table_oid", "SELECT '{ext}.task'::pg_catalog.regclass::pg_catalog.oid AS o")[0]["o"]


def set_session_name(ctx, pool, name):
    if pool["name"] != name:
        ctx.run("name", "SELECT set_config('application_name', $1, false)", ["text"], [name])
        pool["name"] = name


def disconnect(ctx, pool, name):
    pool["workers"].pop(name, None)
    try:
        ctx.run("disconnect", "SELECT dblink.dblink_disconnect($1)", ["text"], [name])
    except ctx.plpy.SPIError:
        pass  # already gone


def collect(ctx, pool, name, worker, events):
    """Read the returned CALL's report; if the worker failed, end what it was running."""
    report, error = None, None
    try:
        rows = ctx.run("get_result", "SELECT * FROM dblink.dblink_get_result($1, false) AS r(report jsonb)",
                       ["text"], [name])
        report = json.loads(rows[0]["report"]) if rows and rows[0]["report"] else None
        ctx.run("get_end", "SELECT * FROM dblink.dblink_get_result($1, false) AS r(report jsonb)", ["text"],
                [name])
        message = ctx.run("error", "SELECT dblink.dblink_error_message($1) AS m", ["text"], [name])[0]["m"]
        if message and message != "OK":
            error = without_traceback(message.strip())
    except ctx.plpy.SPIError as exc:
        error = without_traceback(str(exc))
    first_task, given = worker["task"], worker["tasks"]
    worker["task"], worker["tasks"] = None, []
    if error and first_task != WARM_UP:
        give_up_failing_starts(ctx, pool, given, error, events)
    worker["idle_since"] = time.monotonic()
    worker["key"] = report.get("key") if report else None
    worker["ahead"] = (report.get("ahead") if report else None) or 0  # sessions it has started ahead
    if first_task != WARM_UP:
        # A task it was given but found not claimed (stopped or deleted meanwhile,
        # or an error before it took the row) is left to be claimed again.
        ctx.run("unclaim_given", "SELECT pgtaskpy.unclaim_tasks($1, pg_backend_pid())", ["bigint[]"], [given])
    if report:
        for task_id in report["started"]:
            events.append({"event": "start", "id": task_id, "worker": name})
        for ended in report["ended"]:
            events.append({"event": "end", **ended})
        if report.get("claim_error"):  # (the task before it ended as it ended; a launcher claims the next)
            events.append({"event": "claim_error", "message": report["claim_error"], "worker": name})
        down = report.get("server_down", ())
        for task_id in report["postponed"]:  # its session found no free connection, or its server going down
            pool.setdefault("held", {})[task_id] = time.monotonic() + HOLD_POSTPONED
            events.append({"event": "postponed", "id": task_id, "server_down": task_id in down})
        if report["postponed"]:  # (once for the call: a burst's worker may report a hundred)
            limit_concurrency(ctx, pool, known_short=report.get("short_of_connections", False))
        for unended in report.get("unended", ()):
            events.append({"event": "unended", **unended})
        for fallback in report.get("standby_fallbacks", ()):  # a task of target 'standby' run here
            events.append({"event": "standby_fallback", **fallback})
    if error and first_task == WARM_UP:
        # (a spare that a DBA's reaper of idle sessions terminated, say: another is opened)
        disconnect(ctx, pool, name)
        events.append({"event": "spare_lost", "message": error})
    elif error:
        disconnect(ctx, pool, name)
        worker_failed(ctx, worker, first_task, error, events)
    elif report and report.get("unended"):
        # Runs whose end it could not write are WORK with its pid: recovery ends them FAIL (a lost
        # run) once its backend is gone.  Kept as the spare, it held them WORK for good.
        disconnect(ctx, pool, name)


def give_up_failing_starts(ctx, pool, given, error, events):
    """Count a failed call against the given tasks that had not started (still TAKE: they wait
    again); those it fails for the FAILED_STARTS-th time end FAIL with its error instead."""
    failures = pool.setdefault("failed_starts", {})
    if len(failures) > 1000:  # (counts of tasks that started since: forgotten)
        failures.clear()
    unstarted = ctx.run("unstarted", "SELECT id FROM {ext}.task WHERE id = ANY($1) AND state = 'TAKE'",
                        ["bigint[]"], [given])
    for task_id in [row["id"] for row in unstarted]:
        failures[task_id] = failures.get(task_id, 0) + 1
        if failures[task_id] < FAILED_STARTS:
            continue
        del failures[task_id]
        message = f"ERROR:  pg_task_py worker failed {FAILED_STARTS} times before the task started: {error}"
        # (not a row a client holds: the launcher's turn would wait for it, and every task with it)
        ended = ctx.run("give_up", "SELECT pgtaskpy.end_task_safely(l.id, 'FAIL', $2, '{TAKE}') AS ended"
                        " FROM (SELECT id FROM {ext}.task WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED) AS l",
                        ["bigint", "text"], [task_id, message])
        if ended and ended[0]["ended"]:
            events.append({"event": "end", "id": task_id, "state": "FAIL", "seconds": None,
                           "error": message.split("\n", 1)[0]})


def without_traceback(error):
    """A failed worker's error as a task's error and the launcher's log give it: without the
    PL/Python traceback of its CONTEXT, and the server's message without PL/Python's name of
    its class (a DBA's pg_cancel_backend of a worker: `spiexceptions.QueryCanceled: canceling
    statement due to user request`)."""
    error = error.split("\nCONTEXT:  Traceback", 1)[0]
    head, found, rest = error.partition("spiexceptions.")
    if found and ": " in rest:
        error = head + rest.split(": ", 1)[1]
    return error


def worker_failed(ctx, worker, first_task, error, events):
    """The worker's CALL failed (its backend was terminated, say): the task it was
    running ends FAIL (it may have run in part) once its session has ended (else
    recover_orphaned_tasks ends it later), tasks it had only claimed wait again.
    A row a client holds is left to recover_orphaned_tasks too: waited for here, in the
    launcher's turn, no task of any role started until the client let go."""
    ctx.run("unclaim_failed", "SELECT pgtaskpy.unclaim_tasks(NULL, $1)", ["integer"], [worker["pid"]])
    failed = ctx.run(
        "worker_failed",
        "SELECT t.id FROM {ext}.task AS t"
        " WHERE t.id = ANY (ARRAY(SELECT l.id FROM {ext}.task AS l WHERE l.state = 'WORK' AND l.worker = $1"
        "                         FOR NO KEY UPDATE SKIP LOCKED))"
        " AND pgtaskpy.lost_session_ended(t)"
        " AND pgtaskpy.end_task_safely(t.id, 'FAIL', $2, '{WORK}', pgtaskpy.lost_run_sqlstate())",
        ["integer", "text"],
        [worker["pid"], f"ERROR:  pg_task_py worker failed: {error}"],
    )
    for task_id in [row["id"] for row in failed] or [first_task]:
        events.append({"event": "worker_error", "id": task_id, "message": error, "failed": bool(failed)})


def is_busy(ctx, name):
    try:
        return ctx.run("is_busy", "SELECT dblink.dblink_is_busy($1) AS b", ["text"], [name])[0]["b"] == 1
    except ctx.plpy.SPIError:
        return False  # a broken connection: collect() records the failure


def reap(ctx, pool, events):
    """Collect every worker whose CALL has returned.

    Returns True when a worker has no task left but has not answered yet (it
    returns just after its last commit): look again very soon.
    """
    busy = {name: w for name, w in pool["workers"].items() if w["task"] is not None}
    if not busy:
        return False
    working = ctx.run(
        "working",
        "SELECT array_agg(worker) AS pids, array_agg(id) AS ids FROM {ext}.task"
        " WHERE state IN ('TAKE', 'WORK') AND (worker = ANY($1) OR id = ANY($2))",
        ["integer[]", "bigint[]"],
        [[w["pid"] for w in busy.values()], [t for w in busy.values() for t in w["tasks"]]],
    )[0]
    pids, ids = set(working["pids"] or ()), set(working["ids"] or ())
    for worker in busy.values():
        if len(worker["tasks"]) > 1:
            # A burst's worker (run_tasks) returns with its last task only: those that have
            # ended count no more against --run (running_tasks), nor are they its to unclaim.
            worker["tasks"] = [task_id for task_id in worker["tasks"] if task_id in ids]
    answering = False
    for name, worker in busy.items():
        # A worker returns right after committing its last task's end: wait that
        # moment, so that the next task of a reusable session finds it idle.
        finishing = worker["task"] != WARM_UP and worker["pid"] not in pids and ids.isdisjoint(worker["tasks"])
        patience = time.monotonic() + (ANSWER_WAIT if finishing else 0)
        while is_busy(ctx, name) and time.monotonic() < patience:
            time.sleep(0.0002)
        if is_busy(ctx, name):
            answering = answering or finishing
            continue
        collect(ctx, pool, name, worker, events)
    return answering


def most_workers(ctx, pool):
    """The most worker backends this launcher's session holds: its dblink connections may use a
    third of its files (max_files_per_process; dblink refuses more), and the server needs a few
    of those for its own waits (epoll), or every wait of this backend fails."""
    if "most_workers" not in pool:
        files = ctx.run("files", "SELECT current_setting('max_files_per_process')::integer AS n")[0]["n"]
        pool["most_workers"] = max(1, files // 3 - WORKER_FILES_SPARED)
    return pool["most_workers"]


def new_worker_room(ctx, pool):
    """How many new workers a turn may connect: none for CONNECT_RETRY_AFTER after a failure."""
    if time.monotonic() < pool.get("connect_retry_at", 0.0):
        return 0
    return max(0, min(NEW_WORKERS_A_TURN, most_workers(ctx, pool) - len(pool["workers"])))


def spi_message(exc):
    """An SPIError's message with its DETAIL (PL/Python's `spidata`: sqlstate, detail, ...):
    dblink_connect's says why the server refused."""
    spidata = getattr(exc, "spidata", None) or ()
    detail = spidata[1] if len(spidata) > 1 else None
    return f"{exc}: {detail}" if detail else str(exc)


def running_tasks(pool):
    """The tasks this launcher's workers were given and have not returned, less those of a burst's
    worker seen ended (reap); a warming spare counts one."""
    return sum(len(w["tasks"]) for w in pool["workers"].values() if w["task"] is not None)


def given_tasks(pool):
    """The tasks this launcher's workers were given and have not returned, without the warming
    spares (running_tasks counts them): what the launcher says it waits for as it stops ('waiting
    for 2 running task(s)' with one task and a spare loading PL/Python), reports and cancels."""
    return [t for w in pool["workers"].values() if w["task"] not in (None, WARM_UP) for t in w["tasks"]]


def limit_concurrency(ctx, pool, known_short=False):
    """The server or this database has no connection to spare: run no more tasks at once than now.

    Every running task holds two backends (its worker and its session), and
    max_connections (or the database's CONNECTION LIMIT) is shared with everyone
    else, so the limit is learnt rather than configured; housekeeping relaxes it
    by one a second.  `known_short`: a worker's session was refused for the server's or the
    database's limit, not its role's; by the time the launcher collects the worker, the refused
    sessions are gone and the count may look short of full (a burst of 40 in a database of
    CONNECTION LIMIT 10 was handed out whole turn after turn, 3 tasks started every 2 s: a probe).
    """
    if not known_short and not connections_are_full(ctx):
        return  # a role's CONNECTION LIMIT: that task waits, the others run on
    busy = running_tasks(pool)
    pool["cap"] = max(1, min(pool.get("cap") or busy, busy))
    for name, worker in list(pool["workers"].items()):
        if worker["task"] is None:
            disconnect(ctx, pool, name)  # an idle worker holds a backend a task's session could use


def connections_are_full(ctx):
    """Whether the server, or this launcher's database, has (about) no connection left for a role
    that is not a superuser.  The database's CONNECTION LIMIT counts the launcher's own backends
    (superusers', which it never refuses): idle workers and their sessions ahead filled it, and
    every other role's task waited until it was GONE.  A refused session of a role at its own
    CONNECTION LIMIT has the same SQLSTATE, and holding every task back for it stalled the roles
    that had room."""
    return ctx.run("full", """
        SELECT count(*) + 2 >= current_setting('max_connections')::integer
                               - current_setting('superuser_reserved_connections')::integer
               OR count(*) FILTER (WHERE a.datid = d.oid) + 1 >= d.datconnlimit AND d.datconnlimit >= 0 AS full
          FROM pg_catalog.pg_stat_activity AS a,
               (SELECT oid, datconnlimit FROM pg_catalog.pg_database WHERE datname = current_database()) AS d
         WHERE a.backend_type = 'client backend'
         GROUP BY d.oid, d.datconnlimit""")[0]["full"]


def connections_to_spare(ctx, own_spare=0):
    """How many backends the server and this database have to spare for workers and sessions
    started ahead of need: those that leave a fifth of the connections a role that is not a
    superuser may use free, of the server's and of the database's CONNECTION LIMIT, once every
    scheduler of the server (of any database, any launcher) has opened a spare worker and its
    session ahead.  An idle launcher of 30 databases held a spare and its session ahead in each,
    every connection of a server of max_connections 100, the superusers' reserved ones too (its
    own are a superuser's): nobody could log in (a probe).  Its schedulers, starting together,
    each found room before any had opened its spare: they are counted as if all had (a probe).
    A database's limit does not hold back a superuser's backends: 40 groups due in 2.5 s warmed
    40 workers and their sessions, 84 backends in a database of CONNECTION LIMIT 10 (a probe).
    `own_spare`: the backends of this scheduler's spare, open already, which that counts twice
    (kept while the count without them fits: where they were not, the spare closed when idle and
    opened again, every 10 s, a review).  A task's own worker and session are opened when it is
    due, as without a spare.  Schedulers are counted by their sessions that are a superuser's: any
    role may give its sessions the name, and each counted three times (a probe)."""
    return ctx.run("spare_room", """
        SELECT ceil(least(
                   0.8 * (current_setting('max_connections')::integer
                          - current_setting('superuser_reserved_connections')::integer)
                   - (count(*) - $1 + 2 * count(*) FILTER (WHERE a.application_name = pgtaskpy.name_of('launcher')
                                                               AND r.rolsuper)),
                   CASE WHEN d.datconnlimit >= 0
                        THEN 0.8 * d.datconnlimit - (count(*) FILTER (WHERE a.datid = d.oid) - $1) END))::integer
               AS room
          FROM pg_catalog.pg_stat_activity AS a LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.usesysid,
               (SELECT oid, datconnlimit FROM pg_catalog.pg_database WHERE datname = current_database()) AS d
         WHERE a.backend_type = 'client backend'
         GROUP BY d.oid, d.datconnlimit""", ["integer"], [own_spare])[0]["room"]


def housekeeping(ctx, pool, events, run_limit):
    pool["housekeeping_at"] = time.monotonic() + HOUSEKEEPING_EVERY
    if pool.get("cap") is not None:
        pool["cap"] += 1
        if pool["cap"] >= run_limit:
            pool["cap"] = None
    recovered = ctx.run("recover", "SELECT pgtaskpy.recover_orphaned_tasks() AS n")[0]["n"]
    strays = unclaim_strays(ctx, pool)
    expire_inactive_tasks(ctx, pool, events)
    misconfigured = ctx.run("misconfigured", "SELECT pgtaskpy.fail_misconfigured_tasks() AS n")[0]["n"]
    deleted = delete_finished_tasks(ctx, pool, events)
    fold_group_counts(ctx, pool)
    ctx.run("proofs", "SELECT pgtaskpy.delete_stale_steering_proofs()")  # (60_api.sql)
    if misconfigured:
        events.append({"event": "misconfigured", "count": misconfigured})
    if deleted:
        events.append({"event": "deleted_old", "count": deleted})
    if recovered:
        events.append({"event": "recovered", "count": recovered})
    if strays:  # (no backend died: a row a client held when its claim was given back, say)
        events.append({"event": "unclaimed", "count": strays})


def fold_group_counts(ctx, pool):
    """Add a batch of changes to task_stats' counters (70_operating.sql); while more wait, the
    next turns go on, 10 ms apart, each holding the scheduling lock for one batch only."""
    pool["folding"] = ctx.run("counts", "SELECT f.more FROM pgtaskpy.fold_group_counts($1) AS f", ["integer"],
                              [FOLD_BATCH])[0]["more"]


def expire_inactive_tasks(ctx, pool, events):
    """End GONE the waiting tasks past their `active`, a batch a call.  While batches come full
    (100,000 tasks expired while the launcher was down), the next turns go on with them rather
    than wait a second each: until they are gone, each claim of their groups reads them."""
    expired = ctx.run("expire", "SELECT pgtaskpy.expire_inactive_tasks() AS n")[0]["n"]
    pool["expiring"] = expired >= EXPIRE_BATCH
    if expired:
        events.append({"event": "expired", "count": expired})


def delete_finished_tasks(ctx, pool, events):
    """Retention and keep_runs (pgtaskpy.delete_old_tasks): how many finished tasks it deleted.

    A finished task that another table references by a foreign key without ON DELETE CASCADE
    or SET NULL cannot be deleted: delete_old_tasks keeps it and deletes the others, and the
    launcher says how many it kept, once a minute.  Should the deletion fail all the same (the
    failed statement alone is rolled back), the launcher says so and goes on: such a failure
    used to fail its turn, every turn, and no task of the database started any more."""
    try:
        row = ctx.run("retention", "SELECT pgtaskpy.delete_old_tasks() AS n")[0]
        kept = ctx.run("retention_kept", "SELECT current_setting('pgtaskpy.retention_kept', true) AS k")[0]["k"]
    except ctx.plpy.spiexceptions.ForeignKeyViolation as exc:
        warn_retention(pool, events, {"event": "retention_blocked", "message": str(exc)})
        return 0
    if kept and int(kept) > 0:
        warn_retention(pool, events, {"event": "retention_kept", "count": int(kept)})
    return row["n"]


def warn_retention(pool, events, event):
    """Say why finished tasks past retention are kept, once in RETENTION_WARN_EVERY seconds."""
    if time.monotonic() >= pool.get("retention_warned_at", 0.0):
        pool["retention_warned_at"] = time.monotonic() + RETENTION_WARN_EVERY
        events.append(event)


def unclaim_strays(ctx, pool):
    """Claims that carry this launcher's or an idle worker's pid but are not theirs (after a
    failover: pgtaskpy.unclaim_strays) wait again."""
    workers = pool["workers"].values()
    return ctx.run("strays", "SELECT pgtaskpy.unclaim_strays($1, $2, $3) AS n", ["integer", "bigint[]", "integer[]"],
                   [pool["pid"], [t for w in workers for t in w["tasks"]],
                    [w["pid"] for w in workers if w["task"] is None]])[0]["n"]


def pick_worker(ctx, pool, task):
    """An idle worker for the task: the one holding its reusable session, else any."""
    idle = [(name, w) for name, w in pool["workers"].items() if w["task"] is None]
    key = [task["owner"], task["remote"], task["hash"]]
    for name, worker in idle:
        if task["reuse"] and worker["key"] == key:
            return name
    if idle:  # prefer one without a kept session (it would have to close it), then one with a session ahead
        return min(idle, key=lambda item: (item[1]["key"] is not None, not item[1]["ahead"]))[0]
    return new_worker(ctx, pool)


def launcher_standby(ctx):
    """The launcher's --standby conninfo ('' when none): a setting of its session (launcher.py)."""
    return ctx.run("launcher_standby", "SELECT coalesce(current_setting('pgtaskpy.standby', true), '') AS s")[0]["s"]


def new_worker(ctx, pool):
    pool["serial"] += 1
    name = f"pg_task_py_w{pool['serial']}"
    try:
        ctx.run("connect", "SELECT dblink.dblink_connect($1, $2)", ["text", "text"], [name, worker_conninfo(ctx)])
    except ctx.plpy.SPIError:
        pool["connect_retry_at"] = time.monotonic() + CONNECT_RETRY_AFTER
        raise
    # The worker learns the launcher's standby (--standby) with its pid: it opens the sessions
    # of tasks of target 'standby' there (sessions.py, open_standby).
    pid = ctx.run("worker_pid", "SELECT p FROM dblink.dblink($1, pg_catalog.format("
                  "'SELECT pg_backend_pid(), pg_catalog.set_config(''pgtaskpy.standby'', %L, false)', $2))"
                  " AS r(p integer, s text)", ["text", "text"], [name, launcher_standby(ctx)])[0]["p"]
    pool["workers"][name] = {"task": None, "tasks": [], "key": None, "ahead": 0, "idle_since": time.monotonic(),
                             "pid": pid}
    return name


def start(ctx, pool, tasks, claimer, events):
    """Send a worker its tasks: one to run_task (which goes on with its group), or a burst's
    several to run_tasks (side by side)."""
    task = tasks[0]
    call = (f"CALL pgtaskpy.run_task({int(task['id'])}, {int(claimer)}, NULL)" if len(tasks) == 1 else
            f"CALL pgtaskpy.run_tasks(ARRAY[{', '.join(str(int(t['id'])) for t in tasks)}]::bigint[],"
            f" {int(claimer)}, NULL)")
    name = None
    try:
        name = pick_worker(ctx, pool, task)
        ctx.run("send", "SELECT dblink.dblink_send_query($1, $2)", ["text", "text"], [name, call])
    except ctx.plpy.SPIError as exc:
        # No backend for them now (max_connections?): the tasks wait for the next turn.
        ctx.run("unclaim", "SELECT pgtaskpy.unclaim_tasks($1, $2)", ["bigint[]", "integer"],
                [[t["id"] for t in tasks], claimer])
        limit_concurrency(ctx, pool)
        if name is not None:  # a worker that was there, and the send itself failed
            pool["start_retry_at"] = time.monotonic() + START_RETRY_AFTER
        for t in tasks:
            events.append({"event": "start_failed", "id": t["id"], "message": spi_message(exc)})
        return False
    worker = pool["workers"][name]
    worker["task"], worker["tasks"] = task["id"], [t["id"] for t in tasks]
    worker["key"] = [task["owner"], task["remote"], task["hash"]] if task["reuse"] and len(tasks) == 1 else None
    for t in tasks:
        events.append({"event": "start", "id": t["id"], "worker": name})
    return True


def may_share_a_worker(task):
    """Whether a claimed task may run in a burst's worker (run_tasks) beside others: a local
    task that starts a new session (no `remote`, `count` or `live`).  Those of a `target` may
    not either; the claim does not say, start_claimed looks them up."""
    return task["remote"] is None and not task["reuse"]


def held_tasks(pool):
    """The tasks this launcher leaves out of its claims for now (HOLD_POSTPONED)."""
    held = pool.setdefault("held", {})
    now = time.monotonic()
    for task_id in [task_id for task_id, until in held.items() if until <= now]:
        del held[task_id]
    return list(held)


def claim_for_workers(ctx, pool, room, workers, claimer):
    """Claim up to `room` due tasks for the `workers` this turn may use (idle and new ones).

    First as many as those workers take one each.  When they are all claimed and some of them
    can share a worker (local tasks that start a new session each: run_tasks, TASKS_A_WORKER to
    a worker), then as many more as the workers left and the room in those shared ones take.
    Claiming at once what the workers could take if every task shared one (idle + 400) took
    tasks of `remote` or `count`/`live`, which take a worker each, by the hundred a turn, only
    to unclaim all but the few the workers could take: 3 to 8 row updates a task where 2 or 3
    do (bench/RESULTS.md).
    """
    held = held_tasks(pool)

    def claim(limit):
        return list(ctx.run("claim", "SELECT * FROM pgtaskpy.claim_due_tasks($1, $2, $3)",
                            ["integer", "integer", "bigint[]"], [limit, claimer, held])) if limit > 0 else []

    first = min(room, workers)
    claimed = claim(first)
    if len(claimed) < first:
        return claimed  # all that is due now (or all the room)
    shared = sum(1 for task in claimed if may_share_a_worker(task))
    alone = len(claimed) - shared  # (start_claimed unclaims what the workers cannot take)
    if shared == 0:
        return claimed
    spare_workers = workers - alone - -(-shared // TASKS_A_WORKER)  # (-(-a // b): a / b rounded up)
    more = spare_workers * TASKS_A_WORKER + (-shared) % TASKS_A_WORKER  # (and the last shared one's room)
    return claimed + claim(min(room - len(claimed), more))


def start_claimed(ctx, pool, claimed, claimer, events):
    """Start the claimed tasks: each on a worker of its own while the idle workers and this
    turn's new ones are enough (a worker of one task goes on with its group), else (a burst)
    those that start a new local session TASKS_A_WORKER to a worker.  At most
    NEW_WORKERS_A_TURN new workers: the tasks left wait again for the next turn."""
    idle = sum(1 for w in pool["workers"].values() if w["task"] is None)
    most_new = new_worker_room(ctx, pool)
    jobs = [[task] for task in claimed]
    if len(claimed) > idle + most_new:
        local = [t for t in claimed if may_share_a_worker(t)]
        alone = {row["id"] for row in ctx.run(
            "alone", "SELECT id FROM {ext}.task WHERE id = ANY($1) AND target IS NOT NULL", ["bigint[]"],
            [[t["id"] for t in local]])}
        shared = [t for t in local if t["id"] not in alone]
        shared_ids = {t["id"] for t in shared}
        jobs = ([[t] for t in claimed if t["id"] not in shared_ids]
                + [shared[i:i + TASKS_A_WORKER] for i in range(0, len(shared), TASKS_A_WORKER)])
    new_workers = 0
    for number, job in enumerate(jobs):
        if idle == 0 and new_workers >= most_new:
            unclaim_jobs(ctx, jobs[number:], claimer)
            return
        if idle > 0:
            idle -= 1
        else:
            new_workers += 1
        if not start(ctx, pool, job, claimer, events):
            # No backend to be had: the rest wait for the next turn too (left claimed, they waited
            # for recovery's second and were logged as tasks of dead backends).
            unclaim_jobs(ctx, jobs[number + 1:], claimer)
            return


def unclaim_jobs(ctx, jobs, claimer):
    left = [t["id"] for job in jobs for t in job]
    if left:
        ctx.run("unclaim_left", "SELECT pgtaskpy.unclaim_tasks($1, $2)", ["bigint[]", "integer"], [left, claimer])


def spare_still_fits(ctx, pool):
    """connections_to_spare, looked at once a second: a spare opened where others' filled the
    server meanwhile is not kept past its idle time (schedulers of many databases started together
    each opened one, as each found room)."""
    now = time.monotonic()
    if now >= pool.get("spare_look_at", 0.0):
        pool["spare_look_at"] = now + SPARE_LOOK_EVERY
        pool["spare_fits"] = connections_to_spare(ctx, own_spare=2) > 0  # (a worker and its session ahead)
    return pool["spare_fits"]


def close_idle_workers(ctx, pool, keep_spare):
    """Close idle workers past their keep time, but one spare worker without a
    session when `keep_spare`; return seconds until the next one is due."""
    now = time.monotonic()
    next_due = None
    spare = None
    for name, worker in list(pool["workers"].items()):
        if worker["task"] is not None:
            continue
        if keep_spare and spare is None and worker["key"] is None:
            spare = name
            continue
        keep = KEEP_IDLE_SESSION if worker["key"] is not None else KEEP_IDLE_WORKER
        due = worker["idle_since"] + keep
        if due <= now:
            disconnect(ctx, pool, name)
        elif next_due is None or due - now < next_due:
            next_due = due - now
    return next_due


def warm_workers(ctx, pool, events, run_limit):
    """Keep idle workers with PL/Python loaded and a session started ahead: one spare, or as
    many as groups have tasks coming due within WARM_AHEAD, so that those tasks pay neither a
    backend start nor PL/Python's start before they run (bench/RESULTS.md).  Idle workers
    without a session ahead (a worker starts sessions ahead only for its group's due tasks)
    are warmed first; then at most NEW_WORKERS_A_TURN new ones a turn; True when more are wanted."""
    if pool.get("cap") is not None:
        return False  # none ahead of need while the server is short of connections
    # (a worker keeping a task's session for its group closes it within a second: not counted)
    idle = [(name, w) for name, w in pool["workers"].items() if w["task"] is None and w["key"] is None]
    ready = (sum(1 for w in pool["workers"].values() if w["task"] == WARM_UP)
             + sum(1 for _, w in idle if w["ahead"]))
    room = max(0, min(run_limit, most_workers(ctx, pool)) - len(pool["workers"]))
    wanted = max(1, ctx.run("due_soon", "SELECT pgtaskpy.groups_due_soon($1, $2) AS n", ["float8", "integer"],
                            [WARM_AHEAD, min(len(idle) + room, MOST_WARM)])[0]["n"]) - ready
    cold = [name for name, w in idle if not w["ahead"]][:max(0, wanted)]
    new = min(wanted - len(cold), new_worker_room(ctx, pool), room)
    if cold or new > 0:
        # A worker and its session ahead each, half of the backends to spare, less the sessions of
        # warm-ups under way, not open yet: looked at once a turn, the room let a turn open 8 and
        # the next 8 more (40 in a database of CONNECTION LIMIT 10, 39 of a server's 40: a probe).
        warming = sum(1 for w in pool["workers"].values() if w["task"] == WARM_UP)
        pairs = -(-(connections_to_spare(ctx) - warming) // 2)
        if pairs <= 0:
            return False
        cold = cold[:pairs]
        new = min(new, pairs - len(cold))
    for name in cold:
        if not warm_up(ctx, pool, name, events):
            return False
    for _ in range(new):
        try:
            name = new_worker(ctx, pool)
        except ctx.plpy.SPIError as exc:
            events.append({"event": "spare_failed", "message": spi_message(exc)})
            return False
        if not warm_up(ctx, pool, name, events):
            return False
    return wanted - len(cold) > new and new < room


def warm_up(ctx, pool, name, events):
    """Send an idle worker the call that loads PL/Python and starts a session ahead."""
    try:
        ctx.run("send", "SELECT dblink.dblink_send_query($1, $2)", ["text", "text"],
                [name, f"CALL pgtaskpy.run_task({WARM_UP}, 0, NULL)"])
    except ctx.plpy.SPIError as exc:
        disconnect(ctx, pool, name)
        events.append({"event": "spare_failed", "message": str(exc)})
        return False
    pool["workers"][name]["task"] = WARM_UP
    pool["workers"][name]["tasks"] = [WARM_UP]
    return True


def cancel_running_tasks(ctx, pool, events):
    """Cancel the tasks this launcher's workers run (graceful stop past its grace period), and
    take back those they were given and have not started (a remote session still connecting:
    its worker gives the attempt up), which wait again.

    Called on each turn past the grace period, not once: a task its worker was starting as the
    first of them ran (its row locked by the start, still TAKE to everyone else) was neither
    cancelled nor taken back, and ran on after the launcher had stopped (a probe).  Each task is
    cancelled once; one that could not be (its row held) is tried again on the next turns, and
    said once."""
    pids = [w["pid"] for w in pool["workers"].values() if w["task"] is not None]
    tried = pool.setdefault("cancel_tried", {})  # task id: cancelled
    given = given_tasks(pool)
    taken_back = ctx.run("unclaim_unstarted", "SELECT pgtaskpy.unclaim_tasks($1, $2) AS n", ["bigint[]", "integer"],
                         [given, pool["pid"]])[0]["n"]
    if taken_back:  # (their "started" lines said they were given to a worker: this says they did not run)
        events.append({"event": "unclaimed", "count": taken_back})
    # Not a row a client holds (a SELECT ... FOR SHARE of its task): task_cancel waited for it in
    # this turn, which holds the scheduling lock, and the stop took as long as the client's
    # transaction.  Such a task is not cancelled; it ends on its own.  One its own session holds
    # (its progress in `data`) is: task_cancel does not wait for that.  task_cancel with both of its
    # arguments: a role that can create in the extension's schema made a one-argument call ambiguous
    # with a task_cancel(bigint) of its own, and every graceful stop failed.
    # The cancels are a stop's, not a user's: retried as errors (retry_plan); not one a user made
    # too (pgtaskpy.mark_cancelled).  Read by their ends, which wait for this turn's locks on their rows.
    ctx.run("stop_cancels", "SELECT pg_catalog.set_config('pgtaskpy.stop_cancels', 'on', true)")
    for row in ctx.run(
        "cancel",
        "SELECT t.id, CASE WHEN t.id = ANY (l.ids) OR pgtaskpy.held_by_its_session(t, t.xmax)"
        "                  THEN {ext}.task_cancel(t.id, false) ELSE false END AS cancelled"
        " FROM {ext}.task AS t,"
        "      (SELECT ARRAY(SELECT id FROM {ext}.task WHERE worker = ANY($1) AND state = 'WORK'"
        "                      AND id <> ALL ($2) FOR NO KEY UPDATE SKIP LOCKED) AS ids) AS l"
        " WHERE t.worker = ANY($1) AND t.state = 'WORK' AND t.id <> ALL ($2)",
        ["integer[]", "bigint[]"],
        [pids, [task_id for task_id, cancelled in tried.items() if cancelled]],
    ):
        if row["cancelled"] or row["id"] not in tried:
            events.append({"event": "cancel", "id": row["id"], "cancelled": row["cancelled"]})
        tried[row["id"]] = row["cancelled"]
    ctx.run("stop_cancels_done", "SELECT pg_catalog.set_config('pgtaskpy.stop_cancels', 'off', true)")


def in_recovery(ctx):
    """Whether this server is a standby.  A promotion is for good (a primary becomes a
    standby only through a restart, which ends this session): once not, never asked again."""
    if ctx.GD.get("pgtaskpy.primary"):
        return False
    standby = ctx.run("in_recovery", "SELECT pg_catalog.pg_is_in_recovery() AS r")[0]["r"]
    ctx.GD["pgtaskpy.primary"] = not standby
    return standby


def subscribed(ctx, pool, events):
    """Whether an enabled subscription copies the task table into this database (looked at once
    a second: pgtaskpy.subscription_of_tasks).  Said when that changes; and where this launcher
    starts to schedule the table (its first look, or the subscription's end), task_id_seq is moved
    past the ids the copy received (pgtaskpy.advance_task_ids)."""
    now = time.monotonic()
    if now >= pool.get("subscription_look_at", 0.0):
        pool["subscription_look_at"] = now + SUBSCRIPTION_LOOK_EVERY
        name = ctx.run("subscription", "SELECT pgtaskpy.subscription_of_tasks() AS s")[0]["s"]
        if name is not None and name != pool.get("subscription"):
            events.append({"event": "subscribed", "subscription": name})
        elif name is None and pool.get("subscription", "") is not None:  # (first look, or the end of one)
            if pool.get("subscription"):
                events.append({"event": "unsubscribed", "subscription": pool["subscription"]})
            advanced = ctx.run("advance_ids", "SELECT pgtaskpy.advance_task_ids() AS i")[0]["i"]
            if advanced is not None:
                events.append({"event": "ids_advanced", "id": advanced})
        pool["subscription"] = name
    return pool["subscription"] is not None


def events_json(events):
    """The turn's events as the jsonb dispatch returns.  Text as it is, not as \\u escapes: jsonb
    reads an escape of a character past ASCII into the database's encoding, which SQL_ASCII
    cannot (`conversion between UTF8 and SQL_ASCII is not supported`), and every turn that had a
    task's error in another script to report failed, its log lines lost.  The events' text came
    from this database, in its encoding."""
    return json.dumps(events, ensure_ascii=False)


def main(plpy, GD, SD, run_limit, cancel_running):
    """The entry point: sql/build.py passes PL/Python's globals of these names."""
    ctx = Context(plpy, GD, SD)
    settle_scheduler_session(ctx)
    if in_recovery(ctx):
        # A standby is read-only and its rows are the primary's, whose launcher runs them:
        # claim, recover and start nothing here; look again soon for a promotion.
        return events_json([{"event": "standby"}]), STANDBY_LOOK_EVERY, 0
    ctx.make_constraints_immediate()
    replan_after_growth(ctx)
    events = []
    pool = state(ctx, events)
    if subscribed(ctx, pool, events):
        # A copy of a publisher's tasks (logical replication), whose launcher runs them: claim,
        # recover and start nothing here, as on a standby; workers going on with their group
        # stop, as for a stopping launcher.
        set_session_name(ctx, pool, ctx.name_of("stopping launcher"))
        return events_json(events), SUBSCRIPTION_LOOK_EVERY, len(given_tasks(pool))
    # Workers go on with their group's tasks only while their launcher's session
    # has the accepting name (pgtaskpy.claim_next_task): a stopping launcher drops it.
    set_session_name(ctx, pool, ctx.name_of("launcher" if run_limit > 0 else "stopping launcher"))
    housekeeping_due = time.monotonic() >= pool["housekeeping_at"]
    expiring = pool.get("expiring", False) and not housekeeping_due
    folding = pool.get("folding", False) and not housekeeping_due
    if cancel_running or housekeeping_due or expiring or folding:
        # Before any row (see lock_scheduling).  Other turns leave it to
        # claim_due_tasks, which takes it only when it may claim something:
        # while it is held, no worker can go on with its group.
        ctx.run("lock", "SELECT pgtaskpy.lock_scheduling()")
    if cancel_running:
        cancel_running_tasks(ctx, pool, events)
    if housekeeping_due:
        housekeeping(ctx, pool, events, run_limit)
    else:  # (a backlog left by the last housekeeping: its next batch)
        if expiring:
            expire_inactive_tasks(ctx, pool, events)
        if folding:
            fold_group_counts(ctx, pool)
    busy = running_tasks(pool)
    idle = sum(1 for w in pool["workers"].values() if w["task"] is None)
    claimer = pool["pid"]
    limit = run_limit if pool.get("cap") is None else min(run_limit, pool["cap"])
    room = max(0, limit - busy)
    start_retry_in = pool.get("start_retry_at", 0.0) - time.monotonic()
    claimed = [] if start_retry_in > 0 else claim_for_workers(ctx, pool, room, idle + new_worker_room(ctx, pool),
                                                              claimer)
    # Collect after claiming: a task whose end freed its group's slot for this
    # claim has its worker collected now, so that the group's next task finds
    # the worker holding its reusable session idle.
    answering = reap(ctx, pool, events)
    waits = [pool["housekeeping_at"] - time.monotonic()]
    if pool.get("expiring") or pool.get("folding"):
        waits.append(0.01)
    if len(claimed) >= room:
        if running_tasks(pool) < busy:
            # A task's end woke this turn, whose claim came before its worker was collected and
            # had no room for more (--run reached): claim again now.  Else due tasks waited for
            # the next look, up to a second: with --run 1, a task a second.
            waits.append(0.0)
        elif any(w["task"] == WARM_UP for w in pool["workers"].values()):
            # A spare loading PL/Python counts against --run (running_tasks) until it is
            # collected: look again soon, as for a worker about to answer (its wake may come
            # before its call returns).
            waits.append(0.05)
    if start_retry_in > 0:
        waits.append(start_retry_in)
    elif not claimed:  # else the next turn, in 10 ms, looks
        next_plan = ctx.run("next_plan", "SELECT pgtaskpy.seconds_to_next_plan() AS s")[0]["s"]
        if next_plan is not None:
            waits.append(next_plan)
    if answering:
        waits.append(0.05)  # its worker notifies when it is idle; this is the fallback
    idle_due = close_idle_workers(ctx, pool, keep_spare=run_limit > 0 and spare_still_fits(ctx, pool))
    if idle_due is not None:
        waits.append(idle_due)
    if claimed:
        # Started last: each worker waits for this transaction's commit to take
        # its task, so nothing slow (a new spare's connection) may follow.
        start_claimed(ctx, pool, claimed, claimer, events)
        waits.append(0.01)  # the next turn replaces the spare these may have used
    elif run_limit > 0 and not answering and warm_workers(ctx, pool, events, run_limit):
        waits.append(0.1)  # more to warm: the next few, soon
    return events_json(events), max(0.0, min(waits)), len(given_tasks(pool))
