"""Body of PROCEDURE pgtaskpy.run_task(task_id bigint, claimer integer, INOUT report jsonb).

Runs in a worker backend that the launcher's session opened with dblink and
sent `CALL pgtaskpy.run_task(...)` to (pg_background-style), so the
launcher never waits for a task.  The worker opens the task's own session
with libpq, logged in as the task's owner (or to `remote`), marks the task
WORK, commits, sends the input as one top-level query, writes output and
error, and commits the end state.

In the same transaction as that end, the worker claims its group's next due
task if the group has room (pgtaskpy.claim_next_task) and goes on with it,
for up to CHAIN_SECONDS: a busy group costs no launcher turn a task.  When
the next task's session is at hand, that transaction also marks it WORK: one
commit and two updates a task.  The
session is kept in GD for the next task of the same owner, remote and group
when `count`/`live` allow reuse; otherwise each task gets a new session,
started ahead of need (FRESH_AHEAD) so that a backend's start-up runs while
the task before it does.
"""

import json
import time

TYPE_CHECKING = False  # (not typing's: importing typing costs a worker's first call 4 ms)

if TYPE_CHECKING:  # assembled with libpq.py and output.py by sql/build.py
    from libpq import (
        PGRES_COMMAND_OK,
        PGRES_COPY_BOTH,
        PGRES_COPY_IN,
        PGRES_COPY_OUT,
        PGRES_FATAL_ERROR,
        PGRES_SINGLE_TUPLE,
        PGRES_TUPLES_OK,
        PQTRANS_INERROR,
        PQTRANS_INTRANS,
        ConnectError,
        Session,
        conninfo_options,
    )
    from output import OutputTooLarge, OutputWriter, format_error, format_message
    from plans import name_of, prepared


SESSION_KEY = "pgtaskpy.session"
FRESH_KEY = "pgtaskpy.fresh_sessions"
INTERRUPT_EVERY = 0.05  # seconds between interrupt checks while a task runs
CHAIN_SECONDS = 1.0  # longest a worker goes on with its group before the launcher decides again
FRESH_AHEAD = 2  # new sessions kept starting or ready for a worker going on with its group
LAUNCHER_LOOK_EVERY = 0.05  # seconds between looks whether the launcher still accepts work
SETTING_FRESH = 1.0  # seconds a scheduler setting read from the catalog and files is used
# A server that cannot take the task's session now, but will: the task waits.
BUSY_SERVER = ("too many clients", "remaining connection slots are reserved", "the database system is starting up",
               "the database system is shutting down", "the database system is not yet accepting connections")


# What a worker reads of the task it runs, from the row it took or claimed.
TASK_COLUMNS = (
    "id, state::text AS state, worker, input, owner, remote, hash, timeout, count, live, save,"
    " header, string, delimiter, quote, escape, \"null\","
    " extract(epoch FROM timeout)::float8 AS timeout_s,"
    " extract(epoch FROM live)::float8 AS live_s"
)


def take_task(task_id, claimer):
    """The task's row, locked, if it is still claimed by `claimer` (the launcher's session).

    Locked by id alone: the launcher's claim may not have committed yet, and a
    row lock waits for it, where a snapshot would show the row still in PLAN.
    """
    rows = plpy.execute(
        prepared("take", f"SELECT {TASK_COLUMNS} FROM {{ext}}.task WHERE id = $1 FOR UPDATE", ["bigint"]),
        [task_id],
    )
    if not rows or rows[0]["state"] != "TAKE" or rows[0]["worker"] != claimer:
        return None
    return rows[0]


def loopback_keywords(owner):
    """Connection keywords of a session in this database, logged in as `owner`."""
    if "pgtaskpy.loopback" not in GD:  # fixed for a backend's life: read once
        GD["pgtaskpy.loopback"] = plpy.execute(
            "SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
            "       current_setting('port') AS port, current_database() AS dbname"
        )[0]
    settings = GD["pgtaskpy.loopback"]
    return {
        "host": settings["host"].strip() or "localhost",
        "port": settings["port"],
        "dbname": settings["dbname"],
        "user": owner,
        "application_name": name_of("task"),
    }


def session_key(task):
    return (task["owner"], task["remote"], task["hash"])


def reusable(kept, task):
    """Whether the kept session may run this task (`count`/`live`, same owner, remote and group)."""
    return (
        kept is not None
        and kept["key"] == session_key(task)
        and kept["session"].ok
        and (task["count"] <= 0 or kept["runs"] < task["count"])
        and (task["live_s"] <= 0 or time.monotonic() < kept["born"] + task["live_s"])
        and (task["count"] > 0 or task["live_s"] > 0)
    )


def reset_done(kept):
    """Wait for the reset sent when the session's last task ended; False if it failed."""
    if kept.pop("resetting", False):
        try:
            kept["session"].collect()
        except ConnectError:
            return False
    return True


def settle_reset():
    """Read the answer to the reset sent when the task ended (it ran while the end was written).

    Read before the claim: from the claim to the commit, the scheduling lock is
    held, and no wait for another process may lengthen that.
    """
    kept = GD.get(SESSION_KEY)
    if kept is not None and not reset_done(kept):
        close_session()


def ready_fresh_entry(task):
    """The first session opened ahead for the task's owner, if the task takes a new session
    and that one has connected (not failed, nor closed after a failure); else None."""
    if task["remote"] is not None or task["count"] > 0 or task["live_s"] > 0:
        return None
    fresh = [entry for entry in GD.get(FRESH_KEY) or [] if entry["owner"] == task["owner"]]
    if not fresh:
        return None
    try:
        ready = fresh[0]["session"].advance() and fresh[0]["session"].ok
    except ConnectError:
        return None
    return fresh[0] if ready else None


def session_at_hand(task):
    """Whether the task's session is ready now: kept for reuse, or opened ahead and connected."""
    return reusable(GD.get(SESSION_KEY), task) or ready_fresh_entry(task) is not None


def open_session(task):
    """The task's session: the kept one when it may be reused, else a new one."""
    kept = GD.get(SESSION_KEY)
    if reusable(kept, task) and reset_done(kept):
        return kept
    close_session()
    if task["remote"] is not None:
        session = open_remote_session(task)
    else:
        session = take_fresh_session(task["owner"]) or Session(loopback_keywords(task["owner"]))
    kept = {"key": session_key(task), "session": session, "runs": 0, "born": time.monotonic()}
    GD[SESSION_KEY] = kept
    return kept


def owner_is_superuser(task):
    rows = plpy.execute(
        prepared("superuser", "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1", ["name"]),
        [task["owner"]],
    )
    return bool(rows and rows[0]["rolsuper"])


def open_remote_session(task):
    """The session on `remote`, under dblink's rule for roles that are not superusers:
    `remote` must carry a password of its own, and the server must ask for it.

    Otherwise a role could reach servers, this one included, through trust or
    peer authentication or the server OS user's ~/.pgpass, as someone else.
    """
    checked = not owner_is_superuser(task)
    if checked and not conninfo_options(task["remote"]).get("password"):
        raise ConnectError("password is required: a remote task of a role that is not a superuser must give "
                           "password= in its conninfo")
    session = Session({"dbname": task["remote"], "fallback_application_name": name_of("task")})
    if checked and not session.used_password:
        session.close()
        raise ConnectError("password is required: the remote server did not ask for the password given")
    return session


def login_fingerprint(owner):
    """What a new session of `owner` would start with: the role's and database's
    settings (ALTER ROLE/DATABASE ... SET) and the role's login rights."""
    return plpy.execute(
        prepared(
            "fingerprint",
            "SELECT md5(concat_ws('|',"
            " (SELECT string_agg(s.setdatabase || ':' || s.setrole || ':' || s.setconfig::text, ','"
            "   ORDER BY s.setdatabase, s.setrole)"
            "  FROM pg_catalog.pg_db_role_setting AS s"
            "  WHERE s.setdatabase IN (0, (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()))"
            "    AND s.setrole IN (0, (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $1))),"
            " (SELECT r.oid || ':' || r.rolcanlogin || ':' || coalesce(r.rolvaliduntil::text, '')"
            "  FROM pg_catalog.pg_roles AS r WHERE r.rolname = $1))) AS f",
            ["name"],
        ),
        [owner],
    )[0]["f"]


def take_fresh_session(owner):
    """A session opened ahead for this owner, if a new one would be the same; else None."""
    fresh = GD.get(FRESH_KEY) or []
    fingerprint = login_fingerprint(owner) if fresh else None
    while fresh:
        entry = fresh.pop(0)
        if entry["owner"] == owner and entry["fingerprint"] == fingerprint and entry["session"].ok:
            try:
                entry["session"].wait_connected()
                return entry["session"]
            except ConnectError:
                continue  # a failed attempt ahead of need is no task's failure: open one now
        entry["session"].close()
    return None


def start_fresh_sessions(owner, ahead):
    """Start new sessions for `owner` until `ahead` are starting or ready: the next
    tasks on this worker then find a backend that has started while this one ran."""
    fresh = GD.setdefault(FRESH_KEY, [])
    if any(entry["owner"] != owner for entry in fresh):
        return  # those of another owner are taken or dropped first
    fingerprint = None
    while len(fresh) < ahead:
        fingerprint = fingerprint or login_fingerprint(owner)
        try:
            session = Session(loopback_keywords(owner), wait=False)
            session.advance()  # sends the startup packet: the server starts the backend now
        except ConnectError:
            return  # the next task opens its own, and reports what goes wrong
        fresh.append({"owner": owner, "fingerprint": fingerprint, "session": session})


def advance_fresh_sessions():
    """Take the sessions being opened ahead a step on, without waiting."""
    for entry in GD.get(FRESH_KEY) or []:
        try:
            entry["session"].advance()
        except ConnectError:
            entry["session"].close()  # not ok any more: take_fresh_session drops it


def close_session():
    kept = GD.pop(SESSION_KEY, None)
    if kept is not None:
        kept["session"].close()


def is_string_type(oid):
    """Whether values of this type are strings (category S), for the `string` flag."""
    known = GD.setdefault("pgtaskpy.string_types", {})
    if oid not in known:
        rows = plpy.execute(
            prepared("typcategory",
                     "SELECT typcategory = 'S' AS s FROM pg_catalog.pg_type WHERE oid = $1", ["oid"]),
            [oid],
        )
        known[oid] = bool(rows and rows[0]["s"])
    return known[oid]


class SettingError(Exception):
    """A scheduler setting that cannot be used; the message names it and where it was set."""


def output_limit():
    """pg_task_py.output_limit (database or server level; a task cannot raise it), else 100 MB.

    Read again after SETTING_FRESH seconds (reading the configuration files
    costs more than a short task).  A value that is not a whole number raises
    SettingError: the tasks of this database fail with it, nothing else does.
    """
    cached = GD.get("pgtaskpy.output_limit")
    if cached is None or time.monotonic() >= cached[2]:
        row = plpy.execute(prepared(
            "limit",
            "SELECT pgtaskpy.scheduler_setting('pg_task_py.output_limit') AS v,"
            " pgtaskpy.scheduler_setting_source('pg_task_py.output_limit') AS source", []))[0]
        cached = GD["pgtaskpy.output_limit"] = (row["v"], row["source"], time.monotonic() + SETTING_FRESH)
    value, source, _ = cached
    if not value:
        return 100 * 1024 * 1024
    if not value.strip().isdigit():
        raise SettingError(f'invalid value for setting "pg_task_py.output_limit" of {source}: "{value}"')
    return int(value)


def serve_interrupts(session):
    """Let this backend act on interrupts while it waits for the task's session.

    A backend blocked in a C call acts on no signal: not on a cancel or a
    terminate, and not on the ProcSignalBarrier that DROP DATABASE waits for
    from every backend (a task dropping a database would wait forever).  Any
    SPI call checks for interrupts.  A cancel of this backend (task_cancel of
    a remote task) is passed on to the task's query, which then ends with the
    server's cancel error.  The commit drops the snapshot that SPI calls leave
    to this procedure's transaction, so that this backend holds back neither
    VACUUM nor CREATE INDEX CONCURRENTLY (which waits for older snapshots:
    the task's own) while the task runs.
    """
    try:
        plpy.execute(prepared("interrupts", "SELECT", []))
    except plpy.spiexceptions.QueryCanceled:
        session.cancel()
    plpy.commit()


def send_prepare(session, task):
    """What the task sees of itself: pg_task.id, and its timeout as statement_timeout.
    Only sent: the answer is read (session.collect) after the WORK commit it overlaps."""
    session.send(
        "SELECT pg_catalog.set_config('pg_task.id', $1, false),"
        "       pg_catalog.set_config('statement_timeout', $2, false)",
        [task["id"], f"{int(task['timeout_s'] * 1000)}ms"],
    )


def run_input(session, task, limit):
    """Send the input as one top-level query; return (output, error, notices)."""
    writer = OutputWriter(task, is_string_type, limit)
    error = None
    session.notices.clear()
    session.send(task["input"])
    try:
        for result in session.results(on_wait=lambda: serve_interrupts(session), wait_step=INTERRUPT_EVERY):
            with result:
                status = result.status
                if error is not None:
                    continue  # drain what is left after an error of ours
                if status in (PGRES_SINGLE_TUPLE, PGRES_TUPLES_OK):
                    writer.rows(result.columns(), result.rows())
                    if status == PGRES_TUPLES_OK:
                        writer.end_rows()
                elif status == PGRES_COMMAND_OK:
                    writer.command(result.command_tag())
                elif status in (PGRES_COPY_OUT, PGRES_COPY_IN, PGRES_COPY_BOTH):
                    direction = "FROM STDIN" if status == PGRES_COPY_IN else "TO STDOUT"
                    error = format_message(
                        f"COPY {direction} is not supported", task["input"],
                        hint="COPY to or from a server file works; a task has no client to stream to.")
                    session.finish_copy(status)
                elif status == PGRES_FATAL_ERROR:
                    error = format_error(result, task["input"], session.error_message())
    except OutputTooLarge as exc:
        session.cancel()
        for result in session.results():
            result.__exit__()
        error = format_message(str(exc), task["input"],
                               hint="Raise pg_task_py.output_limit or make the task return less.")
    except plpy.SPIError:
        # This worker was cancelled or terminated: stop the task's query too.
        session.cancel()
        close_session()
        raise
    if session.transaction_status == PQTRANS_INTRANS:
        # pg_task ends a transaction the input left open, and says so.
        session.execute("COMMIT")
        writer.command("COMMIT")
    elif session.transaction_status == PQTRANS_INERROR:
        session.execute("ROLLBACK")
    return writer.text(), error, "\n".join(session.notices) or None


def release_or_reset(kept, task, reused_next):
    """Keep the session for the next task (reset unless `save`) or close it.
    The reset runs in the session while this worker ends the task and claims the next."""
    kept["runs"] += 1
    if not reused_next or not kept["session"].ok:
        close_session()
        return
    try:  # only sent: the answer is read (reset_done) when the session is taken again
        kept["session"].send("RESET statement_timeout; RESET pg_task.id" if task["save"] else "DISCARD ALL")
        kept["resetting"] = True
    except ConnectError:
        close_session()


def mark_working(task, session):
    """TAKE -> WORK; False if the task is no longer this worker's claim (stopped, or taken
    over by a launcher, while its session opened outside the claim's transaction)."""
    return plpy.execute(
        prepared("work", "SELECT id FROM pgtaskpy.start_task($1, $2, $3)", ["bigint", "integer", "integer"]),
        [task["id"], task["worker"], session.pid],
    )[0]["id"] is not None


def finish(task_id, state, output, error, notices=None, wake=True):
    """Record the task's end; its end state (FAIL when what follows it failed), or
    None if it had ended already (recovered by a launcher)."""
    return plpy.execute(
        prepared(
            "finish",
            "SELECT pgtaskpy.finish_task($1, $2::{ext}.state, $3, $4, task_notice => $5, wake => $6)::text AS s",
            ["bigint", "text", "text", "text", "text", "boolean"],
        ),
        [task_id, state, output, error, notices, wake],
    )[0]["s"]


def session_offer(task):
    """The session a next task like `task` (same owner, remote, count and live) would run in, if it
    is ready now: the kept one, or one opened ahead and connected.  (kept entry, fresh entry)."""
    kept = GD.get(SESSION_KEY)
    if reusable(kept, task):
        return kept, None
    entry = ready_fresh_entry(task)
    if entry is None or entry["fingerprint"] != login_fingerprint(task["owner"]):
        return None, None
    return {"key": session_key(task), "session": entry["session"], "runs": 0, "born": time.monotonic()}, entry


def claim_next(task):
    """The group's next task, claimed by this worker (not yet committed), or None; and the
    session it is already WORK in, when the session this worker offered suits it."""
    offered, fresh_entry = session_offer(task)
    look = time.monotonic() >= GD.get("pgtaskpy.launcher_look_at", 0.0)
    if look:
        GD["pgtaskpy.launcher_look_at"] = time.monotonic() + LAUNCHER_LOOK_EVERY
    rows = plpy.execute(
        prepared(
            "next",
            f"SELECT {TASK_COLUMNS} FROM pgtaskpy.claim_next_task($1, $2, $3, $4, $5, $6, $7) WHERE id IS NOT NULL",
            ["integer", "integer", "integer", "name", "text", "integer", "interval"],
        ),
        [task["hash"], claimer if look else None, offered["session"].pid if offered else None, task["owner"],
         task["remote"], task["count"], task["live"]],
    )
    if not rows:
        return None, None
    if rows[0]["state"] != "WORK":
        return rows[0], None
    if fresh_entry is not None:  # it becomes the worker's session
        GD[FRESH_KEY].remove(fresh_entry)
        close_session()
        GD[SESSION_KEY] = offered
    return rows[0], offered


def wake_launchers():
    plpy.execute(prepared("wake", "SELECT pgtaskpy.wake_launchers()", []))


def postpone(task_id):
    plpy.execute(
        prepared("postpone", "SELECT pgtaskpy.unclaim_tasks(ARRAY[$1], NULL)", ["bigint"]),
        [task_id],
    )


def connect_failure_hint(task):
    if task["remote"] is not None:
        return "Check the task's remote conninfo and that the server accepts it."
    return (
        f'The task runs in a session logged in as its owner "{task["owner"]}" over the local socket: '
        "allow it in pg_hba.conf (see README, Security model), and check the role exists with LOGIN."
    )


def session_failed(task, exc, report):
    """The task's session could not be opened or used: the task waits for a connection
    slot when the server is full, else it fails with the reason.  (No next task.)"""
    close_session()
    if any(reason in str(exc) for reason in BUSY_SERVER):
        postpone(task["id"])  # it never started: it waits for a connection slot, not FAIL
        wake_launchers()
        plpy.commit()
        report["postponed"].append(task["id"])
        return None, None
    fail_unstarted(task, f"could not open the task's session: {exc}", connect_failure_hint(task), report)
    return None, None


def fail_unstarted(task, message, hint, report):
    """End a task that never started FAIL with an error of the scheduler's own."""
    error = format_message(message, task["input"], hint)
    state = finish(task["id"], "FAIL", None, error)
    plpy.commit()
    report["ended"].append(ended_entry(task["id"], state or "FAIL", None, error))


def ended_entry(task_id, state, seconds, error):
    """A task's end, as the launcher logs it: with the first line of its error."""
    entry = {"id": task_id, "state": state, "seconds": seconds}
    if error:
        entry["error"] = error.split("\n", 1)[0]
    return entry


def run_one(task, kept, go_on, limit, report):
    """Run a taken task to its end; return the group's next task, claimed, when going on with
    it, and its session when the claim made it WORK in that session already.

    The transaction that took the task (and ended the one before) is still open:
    it commits with WORK, unless the session has to be waited for first.
    """
    reuse = task["count"] > 0 or task["live_s"] > 0
    if kept is None:
        if not session_at_hand(task):
            plpy.commit()  # hold neither the scheduling lock nor rows while a backend starts
        try:
            kept = open_session(task)
        except ConnectError as exc:
            return session_failed(task, exc, report)
        if not mark_working(task, kept["session"]):
            wake_launchers()
            plpy.commit()
            return None, None  # not this worker's to run any more; its session stays clean for the next
    session = kept["session"]
    try:
        send_prepare(session, task)
    except ConnectError as exc:
        return session_failed(task, exc, report)
    plpy.commit()  # WORK, start and pid are visible while the input runs
    started = time.monotonic()
    if task["remote"] is None and not reuse:
        start_fresh_sessions(task["owner"], FRESH_AHEAD if go_on else 1)

    try:
        session.collect()
        output, error, notices = run_input(session, task, limit)
    except ConnectError as exc:  # the session broke outside the input itself
        output, error, notices = None, format_message(str(exc), task["input"]), None
    release_or_reset(kept, task, reuse)
    advance_fresh_sessions()
    ended = finish(task["id"], "FAIL" if error else "DONE", output, error, notices, wake=False)
    settle_reset()
    if ended is not None:
        if ended == "FAIL" and not error:
            error = plpy.execute(prepared("error", "SELECT error FROM {ext}.task WHERE id = $1", ["bigint"]),
                                 [task["id"]])[0]["error"]
        report["ended"].append(ended_entry(task["id"], ended, round(time.monotonic() - started, 6), error))
    # The next task takes this one's slot in its group, if this one still held it.
    next_task, next_kept = claim_next(task) if go_on and ended is not None else (None, None)
    if next_task is None:
        wake_launchers()  # a slot and this worker are free
        plpy.commit()
    return next_task, next_kept


def main():
    report = {"started": [], "ended": [], "postponed": [], "key": None}
    task = take_task(task_id, claimer)
    if task is None and task_id == 0:  # the launcher's warm-up call for a spare worker
        start_fresh_sessions(plpy.execute("SELECT current_user AS u")[0]["u"], 1)
    # Read before any WORK is committed: from then on a cancel of this worker (task_cancel
    # of a remote task) is meant for the task's query, which serve_interrupts passes on.
    try:
        limit = output_limit() if task is not None else None
    except SettingError as exc:
        fail_unstarted(task, str(exc), "It must be a whole number of characters; fix it with ALTER DATABASE ... SET "
                       "or in postgresql.conf.", report)
        task = None
    chain_ends = time.monotonic() + CHAIN_SECONDS
    kept = None  # the session a claimed task is WORK in already
    while task is not None:  # else stopped, or taken over after this worker's launcher died
        task, kept = run_one(task, kept, time.monotonic() < chain_ends, limit, report)
        if task is not None:
            report["started"].append(task["id"])
    kept = GD.get(SESSION_KEY)
    report["key"] = list(kept["key"]) if kept is not None else None
    return (json.dumps(report),)
