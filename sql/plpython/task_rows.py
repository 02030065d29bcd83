"""A worker's changes of task rows: each one call of the SQL function of that
transition (sql/replayed/40_scheduling.sql), through a plan prepared once per
backend.  None commits: the worker decides when (run_task.py).
"""

import time

LAUNCHER_LOOK_EVERY = 0.05  # seconds between looks whether the launcher still accepts work
DEADLOCK_ATTEMPTS = 5  # most tries of a task's start or end that the server fails to break a deadlock
CANCELLED_ATTEMPTS = 100  # most tries of a task's end that cancels meant for its ended query interrupt
# Seconds a worker waits before trying a task's end again, times the attempt: time for the other
# transaction's backend to take what the failed end let go of (see finish_task).
DEADLOCK_BACKOFF = 0.02
HELD = "held"  # what start_task and finish_task return, unless_held, when a client holds the row

# What a new session of a role would log in with here, `r` its pg_authid row and `d` this
# database's pg_database row: a session opened before any of it changed runs no task of the role.
# (After ALTER ROLE ... NOSUPERUSER a session keeps a superuser's powers, SET SESSION
# AUTHORIZATION among them; after REVOKE CONNECT or ALLOW_CONNECTIONS false a login is refused.)
LOGIN_RIGHTS = ("pg_catalog.concat_ws(':', r.oid, r.rolcanlogin, r.rolsuper, r.rolvaliduntil, d.datallowconn,"
                " pg_catalog.has_database_privilege(r.oid, d.oid, 'CONNECT'))"
                " FROM pg_catalog.pg_authid AS r, pg_catalog.pg_database AS d"
                " WHERE d.datname = pg_catalog.current_database() AND r.rolname")

# What a worker reads of the task it runs, from the row it took or claimed.
TASK_COLUMNS = (
    "id, state::text AS state, worker, input, owner, remote, \"group\", hash, timeout, count, live, save,"
    " header, string, delimiter, quote, escape, \"null\", target,"
    " extract(epoch FROM timeout)::float8 AS timeout_s,"
    " extract(epoch FROM live)::float8 AS live_s, retry, after IS NOT NULL AS after_others,"
    # The role a session of the owner would log in as now (a kept session runs the task only if
    # it is the one it logged in as: not after the role was dropped, or renamed and another made
    # with its name, nor once its login rights changed).
    f" (SELECT {LOGIN_RIGHTS} = owner) AS login,"
    # The table the task is a row of: its end is written there only (finish_task), not onto a task
    # of the same id of a table made since (the extension dropped and created again).
    " '{ext}.task'::pg_catalog.regclass::pg_catalog.oid AS table_oid"
)


def take_task(ctx, task_id, claimer):
    """The task's row, locked, if it is still claimed by `claimer` (the launcher's session).

    Locked by id alone: the launcher's claim may not have committed yet, and a
    row lock waits for it, where a snapshot would show the row still in PLAN.  FOR NO KEY
    UPDATE, as the claims lock (sql/replayed/40_scheduling.sql): not held back by an
    application's open insert that references the task by a foreign key.
    """
    rows = ctx.run("take", f"SELECT {TASK_COLUMNS} FROM {{ext}}.task WHERE id = $1 FOR NO KEY UPDATE", ["bigint"],
                   [task_id])
    if not rows or rows[0]["state"] != "TAKE" or rows[0]["worker"] != claimer:
        return None
    return rows[0]


def take_tasks(ctx, task_ids, claimer):
    """take_task for a burst's tasks, in one statement (one a task cost a burst's worker 5 ms
    before its first session's connect): those still claimed by `claimer`, in the order of
    `task_ids`; and the ids of those another transaction holds, not waited for (held_rows).

    The launcher's claim holds the scheduling lock until its turn commits: the shared take of it
    waits for that commit, after which the claimed rows are free unless a client holds one (a
    SELECT ... FOR UPDATE or an open UPDATE of its own task).  Waited for, such a row held back
    every task of the burst; and the rows, locked in any order, deadlocked with a client locking
    several, which failed the worker's call (chaos, a client locking tasks newest first)."""
    ctx.run("take_all_after_claim", "SELECT pgtaskpy.lock_scheduling_shared()")
    rows = ctx.run("take_all",
                   f"SELECT {TASK_COLUMNS} FROM {{ext}}.task WHERE id = ANY($1) FOR NO KEY UPDATE SKIP LOCKED",
                   ["bigint[]"], [task_ids])
    found = {row["id"]: row for row in rows}
    taken = [found[task_id] for task_id in task_ids
             if task_id in found and found[task_id]["state"] == "TAKE" and found[task_id]["worker"] == claimer]
    return taken, held_rows(ctx, [task_id for task_id in task_ids if task_id not in found])


def launcher_accepts(ctx, launcher):
    """Whether the launcher whose session's pid is `launcher` still gives out work
    (pgtaskpy.launcher_accepts)."""
    return ctx.run("accepts", "SELECT pgtaskpy.launcher_accepts($1) AS a", ["integer"], [launcher])[0]["a"]


def held_rows(ctx, task_ids):
    """Of tasks a SKIP LOCKED read did not return, those that exist: their rows are held."""
    if not task_ids:
        return []
    return ctx.run("held", "SELECT coalesce(array_agg(id), '{}') AS ids FROM {ext}.task WHERE id = ANY($1)",
                   ["bigint[]"], [task_ids])[0]["ids"]


def still_claimed(ctx, task):
    """Whether the taken task is still claimed by its claimer, so its worker's to start: not
    stopped (task_cancel), nor taken back (a launcher's recovery, its graceful stop)."""
    rows = ctx.run("claimed", "SELECT state = 'TAKE' AND worker = $2 AS c FROM {ext}.task WHERE id = $1",
                   ["bigint", "integer"], [task["id"], task["worker"]])
    return bool(rows and rows[0]["c"])


def start_task(ctx, task, session_pid, unless_held=False):
    """TAKE -> WORK in the session whose backend is `session_pid`; False if the task is no
    longer this worker's claim (stopped, or taken over by a launcher, while its session
    opened outside the claim's transaction).  unless_held: HELD, and nothing written, when
    another transaction holds the row (a burst's worker starts it later: take_tasks)."""
    if not unless_held:
        return run_change(
            ctx, "work", "SELECT id FROM pgtaskpy.start_task($1, $2, $3)", ["bigint", "integer", "integer"],
            [task["id"], task["worker"], session_pid],
        )[0]["id"] is not None
    rows = run_change(
        ctx, "work_unless_held",
        "SELECT (pgtaskpy.start_task(l.id, $2, $3)).id AS id"
        " FROM (SELECT id FROM {ext}.task WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED) AS l",
        ["bigint", "integer", "integer"], [task["id"], task["worker"], session_pid],
    )
    if not rows:
        return HELD if held_rows(ctx, [task["id"]]) else False
    return rows[0]["id"] is not None


def start_tasks(ctx, tasks, session_pids):
    """start_task, unless_held, of a burst's several tasks in one statement: {id: True, False or
    HELD} (one statement and one commit a task cost a burst's worker 0.5 ms of CPU a task, on
    cores its tasks' new sessions need; run_batch.py).  No row is waited for (SKIP LOCKED), so a
    client locking several tasks in any order cannot deadlock with it; note_start skips the rate
    limits' rows another start holds for the same reason."""
    rows = run_change(
        ctx, "work_all_unless_held",
        "SELECT l.id, (pgtaskpy.start_task(l.id, l.claimer, l.pid)).id IS NOT NULL AS started"
        " FROM (SELECT t.id, s.claimer, s.pid FROM {ext}.task AS t"
        "       JOIN unnest($1::bigint[], $2::integer[], $3::integer[]) AS s(id, claimer, pid) ON s.id = t.id"
        "       FOR NO KEY UPDATE OF t SKIP LOCKED) AS l",
        ["bigint[]", "integer[]", "integer[]"],
        [[task["id"] for task in tasks], [task["worker"] for task in tasks], session_pids],
    )
    outcomes = {row["id"]: row["started"] for row in rows}
    held = set(held_rows(ctx, [task["id"] for task in tasks if task["id"] not in outcomes]))
    return {task["id"]: outcomes.get(task["id"], HELD if task["id"] in held else False) for task in tasks}


def run_change(ctx, name, query, types, values):
    """ctx.run of a change of task rows, tried again (ready_to_retry) when the server fails it
    to break a deadlock."""
    deadlocks = 0
    while True:
        try:
            return ctx.run(name, query, types, values)
        except ctx.plpy.spiexceptions.DeadlockDetected:
            deadlocks += 1
            if not ready_to_retry(ctx, deadlocks):
                raise


def ready_to_retry(ctx, deadlocks):
    """Whether a change of a task row that the server failed to break a deadlock, the
    `deadlocks`-th time in a row, is tried again; if so, the worker's transaction has committed
    and the other backend has had time to go on.

    Committed first: the other side may wait for a lock that an earlier statement of the
    transaction took, which the failed statement's rollback does not let go of.  A plain
    `REINDEX TABLE task` holds each index it has rebuilt and waits for the next one, which the
    worker's read of its group's upcoming tasks (or the take of its task) holds, while the
    worker's UPDATE waits for REINDEX's lock on the table: tried in the same transaction, the
    change lost the same deadlock every time, and a task that had run ended FAIL as a lost run
    (08006), one that had not FAIL 40P01 (5 tasks in 640 beside 40 REINDEXes).  What the
    transaction did commits with it, as it would with the change: the end of the task before
    (the change then waits for the other side alone), the take's lock of the row (the change
    looks at the row's claim again)."""
    if deadlocks >= DEADLOCK_ATTEMPTS:
        return False
    ctx.commit()
    time.sleep(DEADLOCK_BACKOFF * deadlocks)
    return True


def move_task_to_session(ctx, task, session_pid):
    """The WORK task runs in the session of `session_pid` instead (pgtaskpy.move_task_to_session);
    False if it is not this worker's running task any more."""
    return ctx.run("move", "SELECT pgtaskpy.move_task_to_session($1, $2) AS m", ["bigint", "integer"],
                   [task["id"], session_pid])[0]["m"]


def finish_task(ctx, task_id, state, output, error, notices=None, wake=True, sqlstate=None, stop=None,
                unless_held=False, table_oid=None, ran=False):
    """Record the task's end (its retry or next run follows in the same transaction); its end
    state (FAIL when what follows it failed), or None if it had ended already (recovered by a
    launcher), or if its table is no longer the task table (`table_oid`, the task's TASK_COLUMNS':
    the extension was dropped and created again while it ran, and a task of the new table had its
    id and got its end), or if the row of its id is not its run: `ran`, the end of a run, is
    written on a row running in this worker only, else on a row not running in another.  `stop`:
    when it ended (time.time()), if not now.  unless_held: HELD, and nothing written, when another
    transaction holds the row (a burst's worker writes it later).

    Tried again when the server breaks a deadlock by failing it: an end locks the task's row,
    then the rows of its dependents (and, for a named series, the series' lock), and a client's
    transaction may hold one of those (the commit of an INSERT of a task `after` another, which
    locks that row FOR SHARE; task_schedule, which takes the series' lock) and wait for the row.
    The failed statement's subtransaction (PL/Python's, around each statement) is rolled back
    with what it locked, and the transaction commits (ready_to_retry): the other goes on, and
    the end waits for it.  Failing the worker's call
    instead ended FAIL every task it ran, which had run.  Not at once: the other backend, woken
    when the row was let go, must run to take it, and on busy cores an end tried again at once
    took the row back first, and lost the same deadlock three times in a row (three runs in six
    under a CPU load)."""
    call = ("pgtaskpy.finish_task({id}, $2::{{ext}}.state, $3, $4, task_notice => $5, wake => $6,"
            " task_sqlstate => $7, task_stop => pg_catalog.to_timestamp($8))::text AS s")
    # (After TRUNCATE task RESTART IDENTITY a new task, another role's too, had the id of a run that
    # went on, and got its end and output: running in another worker, or claimed, not started yet.)
    mine = "state = 'WORK' AND worker = pg_catalog.pg_backend_pid()" if ran else \
        "(state <> 'WORK' OR worker = pg_catalog.pg_backend_pid())"
    row = f"SELECT id FROM {{ext}}.task WHERE id = $1 AND ($9::pg_catalog.oid IS NULL OR tableoid = $9) AND {mine}"
    kind = "finish_run" if ran else "finish"
    if unless_held:
        name, query = (f"{kind}_unless_held",
                       f"SELECT {call.format(id='l.id')} FROM ({row} FOR NO KEY UPDATE SKIP LOCKED) AS l")
    else:
        name, query = kind, f"SELECT {call.format(id='l.id')} FROM ({row}) AS l"
    types = ["bigint", "text", "text", "text", "text", "boolean", "text", "float8", "oid"]
    values = [task_id, state, output, error, notices, wake, sqlstate, stop, table_oid]
    deadlocks = cancels = 0
    while True:
        try:
            rows = ctx.run(name, query, types, values)
        except ctx.plpy.spiexceptions.DeadlockDetected:
            deadlocks += 1
            if not ready_to_retry(ctx, deadlocks):
                raise
            continue
        except ctx.plpy.spiexceptions.QueryCanceled:
            # A cancel of this worker meant for the task's query that came as the query ended:
            # task_cancel of a remote task (or one of a target) signals the worker, after it has
            # the task's row, for which this end then waits; each call again (a role's several
            # calls in one open transaction) signals it again.  Failing the call ended a run
            # that had ended (its work committed) as a lost one, 08006, and retried it under
            # retry_unsafe.  The query is over: its end is written again (the statement alone
            # was rolled back).
            cancels += 1
            if cancels == CANCELLED_ATTEMPTS:
                raise
            continue
        if rows:
            return rows[0]["s"]
        # Held: the row is this task's still (not one of another worker, which a burst's worker
        # took for held and waited for, as long as that task ran), and the read skipped it.
        return HELD if unless_held and ctx.run(f"{kind}_held", f"SELECT count(*) AS n FROM ({row}) AS l",
                                               types, values)[0]["n"] else None


def owner_is_gone(ctx, task):
    """Whether no role has the task's owner's name any more (dropped, or renamed)."""
    return ctx.run("owner_gone", "SELECT pg_catalog.to_regrole(pg_catalog.quote_ident($1)) IS NULL AS gone",
                   ["name"], [task["owner"]])[0]["gone"]


def refused_for_its_role(ctx, task, message):
    """Whether a session of the task's owner was refused for the role's own CONNECTION LIMIT (the
    other roles' tasks run on), not the server's or the database's, which share the SQLSTATE: by
    the server's words when they are English, else by the role's backends at its limit as they
    are now (the refused one is gone, and one of theirs may have ended since: one less counts)."""
    if "too many connections for role" in message:
        return True
    rows = ctx.run("refused_for_role", """
        SELECT count(a.pid) + 1 >= r.rolconnlimit AS at_limit
          FROM pg_catalog.pg_roles AS r LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.usesysid = r.oid
         WHERE r.rolname = $1 AND r.rolconnlimit >= 0 AND NOT r.rolsuper
         GROUP BY r.rolconnlimit""", ["name"], [task["owner"]])
    return bool(rows) and rows[0]["at_limit"]


def end_series(ctx, task_id):
    """No next run nor retry follows the task's end (its series ends with it)."""
    ctx.run("end_series", "SELECT pgtaskpy.end_series($1)", ["bigint"], [task_id])


def retry_of(ctx, task_id):
    """Whether the failed task is tried again, for the launcher's log: the retry's number,
    of how many, and when ({"retry": None} when it is not tried again)."""
    rows = ctx.run(
        "retry_of",
        "SELECT attempt - 1 AS retry, retry AS retries,"
        " to_char(plan AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"') AS retry_at"
        " FROM {ext}.task WHERE parent = $1 AND attempt > 1 AND state = 'PLAN'",
        ["bigint"], [task_id])
    return rows[0] if rows else {"retry": None}


def task_error(ctx, task_id):
    """The error a task ended with (finish_task's own, when what follows the task failed)."""
    return ctx.run("error", "SELECT error FROM {ext}.task WHERE id = $1", ["bigint"], [task_id])[0]["error"]


def claim_next_task(ctx, task, launcher, session_pid, session_task=None):
    """The group's next task after `task`, claimed by this worker (not yet committed), or None.
    WORK already in the session of `session_pid` (ready for a task like `task`; started with
    the settings of `session_task`, if not None) when it suits the claimed task, else TAKE.

    Whether the launcher (`launcher`, its session's pid) still accepts work is looked at
    every LAUNCHER_LOOK_EVERY seconds only: that look costs more than the rest of the claim.
    """
    look = time.monotonic() >= ctx.GD.get("pgtaskpy.launcher_look_at", 0.0)
    if look:
        ctx.GD["pgtaskpy.launcher_look_at"] = time.monotonic() + LAUNCHER_LOOK_EVERY
    rows = ctx.run(
        "next",
        f"SELECT {TASK_COLUMNS} FROM pgtaskpy.claim_next_task($1, $2, $3, $4, $5, $6, $7, $8) WHERE id IS NOT NULL",
        ["integer", "integer", "integer", "name", "text", "integer", "interval", "bigint"],
        # (A session of a target is offered to no other task: claim_next_task does not compare targets.)
        [task["hash"], launcher if look else None, session_pid if task["target"] is None else None, task["owner"],
         task["remote"], task["count"], task["live"], session_task],
    )
    return rows[0] if rows else None


def upcoming_in_group(ctx, task, most):
    """The tasks of the running task's group whose sessions are worth starting ahead for a worker
    going on with the group, up to `most` (pgtaskpy.upcoming_in_group), with what their sessions
    start with (id, group, timeout_s) and their max."""
    return ctx.run("upcoming_in_group", "SELECT * FROM pgtaskpy.upcoming_in_group($1, $2, $3, $4, $5)",
                   ["integer", "integer", "bigint", "name", "text"],
                   [task["hash"], most, task["id"], task["owner"], task["group"]])


def unclaim_task(ctx, task_id):
    """TAKE -> PLAN: the task was not started (its session found no free connection)."""
    ctx.run("postpone", "SELECT pgtaskpy.unclaim_tasks(ARRAY[$1], NULL)", ["bigint"], [task_id])


def wake_launchers(ctx):
    ctx.run("wake", "SELECT pgtaskpy.wake_launchers()")


def owner_to_start_ahead(ctx, seconds):
    """The role a spare worker starts a session ahead for: the owner of the next task due within
    `seconds`, else of the latest task (pgtaskpy.owner_to_start_ahead)."""
    return ctx.run("owner_ahead", "SELECT pgtaskpy.owner_to_start_ahead($1) AS o", ["float8"], [seconds])[0]["o"]
