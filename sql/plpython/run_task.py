"""Body of PROCEDURE pgtaskpy.run_task(task_id bigint, claimer integer).

Runs in a worker backend that the launcher's session opened with dblink and
sent `CALL pgtaskpy.run_task(...)` to (pg_background-style), so the
launcher never waits for a task.  The worker opens the task's own session
with libpq, logged in as the task's owner (or to `remote`), marks the task
WORK, commits, sends the input as one top-level query, writes output and
error, and commits the end state.  The session is kept in GD for the next
task of the same owner, remote and group when `count`/`live` allow reuse.
"""

import time
from typing import TYPE_CHECKING

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
    from plans import prepared


SESSION_KEY = "pgtaskpy.session"
FRESH_KEY = "pgtaskpy.fresh_session"
INTERRUPT_EVERY = 0.05  # seconds between interrupt checks while a task runs
# A server that cannot take the task's session now, but will: the task waits.
BUSY_SERVER = ("too many clients", "remaining connection slots are reserved", "the database system is starting up",
               "the database system is shutting down", "the database system is not yet accepting connections")


def take_task():
    """The task's row, locked, if it is still claimed by this worker's launcher session.

    Locked by id alone: the launcher's claim may not have committed yet, and a
    row lock waits for it, where a snapshot would show the row still in PLAN.
    """
    rows = plpy.execute(
        prepared(
            "take",
            "SELECT id, state::text AS state, worker, input, owner, remote, hash, timeout, count, live, save,"
            "       header, string, delimiter, quote, escape, \"null\","
            "       extract(epoch FROM timeout)::float8 AS timeout_s,"
            "       extract(epoch FROM live)::float8 AS live_s"
            " FROM {ext}.task WHERE id = $1 FOR UPDATE",
            ["bigint"],
        ),
        [task_id],
    )
    if not rows or rows[0]["state"] != "TAKE" or rows[0]["worker"] != claimer:
        return None
    return rows[0]


def loopback_keywords(owner):
    """Connection keywords of a session in this database, logged in as `owner`."""
    settings = plpy.execute(
        prepared(
            "loopback",
            "SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
            "       current_setting('port') AS port, current_database() AS dbname",
            [],
        )
    )[0]
    return {
        "host": settings["host"].strip() or "localhost",
        "port": settings["port"],
        "dbname": settings["dbname"],
        "user": owner,
        "application_name": "pg_task_py task",
    }


def session_key(task):
    return (task["owner"], task["remote"], task["hash"])


def open_session(task):
    """The task's session: the kept one when it may be reused, else a new one."""
    kept = GD.get(SESSION_KEY)
    if kept is not None:
        reusable = (
            kept["key"] == session_key(task)
            and kept["session"].ok
            and (task["count"] <= 0 or kept["runs"] < task["count"])
            and (task["live_s"] <= 0 or time.monotonic() < kept["born"] + task["live_s"])
            and (task["count"] > 0 or task["live_s"] > 0)
        )
        if reusable:
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
    session = Session({"dbname": task["remote"], "fallback_application_name": "pg_task_py task"})
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
    """The unused session opened ahead for this owner, if a new one would be the same."""
    fresh = GD.pop(FRESH_KEY, None)
    if fresh is None:
        return None
    if fresh["owner"] == owner and fresh["session"].ok and fresh["fingerprint"] == login_fingerprint(owner):
        return fresh["session"]
    fresh["session"].close()
    return None


def open_fresh_session(owner):
    """Open the next task's session now, after this one's end is committed, so that
    the next task on this worker does not wait for a backend to start (about 5 ms)."""
    if GD.get(FRESH_KEY) is not None or GD.get(SESSION_KEY) is not None:
        return
    try:
        GD[FRESH_KEY] = {"owner": owner, "fingerprint": login_fingerprint(owner),
                         "session": Session(loopback_keywords(owner))}
    except ConnectError:
        pass  # the next task opens its own, and reports what goes wrong


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


def output_limit():
    """pg_task_py.output_limit (database or server level; a task cannot raise it), else 100 MB."""
    value = plpy.execute(
        prepared("limit", "SELECT pgtaskpy.scheduler_setting('pg_task_py.output_limit') AS v", [])
    )[0]["v"]
    return int(value) if value else 100 * 1024 * 1024


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


def prepare_session(session, task):
    """What the task sees of itself: pg_task.id, and its timeout as statement_timeout."""
    session.execute(
        "SELECT pg_catalog.set_config('pg_task.id', $1, false),"
        "       pg_catalog.set_config('statement_timeout', $2, false)",
        [task["id"], f"{int(task['timeout_s'] * 1000)}ms"],
    )


def run_input(session, task):
    """Send the input as one top-level query; return (output, error, notices)."""
    writer = OutputWriter(task, is_string_type, output_limit())
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
    """Keep the session for the next task (reset unless `save`) or close it."""
    kept["runs"] += 1
    if not reused_next or not kept["session"].ok:
        close_session()
        return
    try:
        if task["save"]:
            kept["session"].execute("RESET statement_timeout; RESET pg_task.id")
        else:
            kept["session"].execute("DISCARD ALL")
    except ConnectError:
        close_session()


def mark_working(session):
    plpy.execute(
        prepared(
            "work",
            "UPDATE {ext}.task SET state = 'WORK', start = clock_timestamp(),"
            " pid = $2, worker = pg_backend_pid() WHERE id = $1",
            ["bigint", "integer"],
        ),
        [task_id, session.pid],
    )


def finish(state, output, error, notices=None):
    plpy.execute(
        prepared(
            "finish",
            "SELECT pgtaskpy.finish_task($1, $2::{ext}.state, $3, $4, task_notice => $5)",
            ["bigint", "text", "text", "text", "text"],
        ),
        [task_id, state, output, error, notices],
    )


def postpone():
    plpy.execute(
        prepared("postpone", "UPDATE {ext}.task SET state = 'PLAN', worker = NULL WHERE id = $1 AND state = 'TAKE'",
                 ["bigint"]),
        [task_id],
    )


def connect_failure_hint(task):
    if task["remote"] is not None:
        return "Check the task's remote conninfo and that the server accepts it."
    return (
        f'The task runs in a session logged in as its owner "{task["owner"]}" over the local socket: '
        "allow it in pg_hba.conf (see README, Security model), and check the role exists with LOGIN."
    )


def main():
    task = take_task()
    if task is None:
        if task_id == 0:  # the launcher's warm-up call for a spare worker
            open_fresh_session(plpy.execute("SELECT current_user AS u")[0]["u"])
        return  # stopped, or taken over after this worker's launcher died
    try:
        kept = open_session(task)
        prepare_session(kept["session"], task)
    except ConnectError as exc:
        close_session()
        if any(reason in str(exc) for reason in BUSY_SERVER):
            postpone()  # it never started: it waits for a connection slot, not FAIL
            plpy.commit()
            return
        finish("FAIL", None, format_message(
            f"could not open the task's session: {exc}", task["input"], connect_failure_hint(task)))
        plpy.commit()
        return
    session = kept["session"]
    mark_working(session)
    plpy.commit()  # WORK, start and pid are visible while the input runs

    try:
        output, error, notices = run_input(session, task)
    except ConnectError as exc:  # the session broke outside the input itself
        output, error, notices = None, format_message(str(exc), task["input"]), None
    reuse = task["count"] > 0 or task["live_s"] > 0
    release_or_reset(kept, task, reuse)
    finish("FAIL" if error else "DONE", output, error, notices)
    plpy.commit()
    if task["remote"] is None and not reuse:
        open_fresh_session(task["owner"])
        # The launcher saw this task end before the session was open: wake it
        # again now that this worker is about to be idle.
        plpy.execute(prepared("idle", "SELECT pg_catalog.pg_notify('pg_task_py', '')", []))
        plpy.commit()
