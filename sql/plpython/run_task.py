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
the next task's session is ready, that transaction also marks it WORK: one
commit and two updates a task.

Which session a task runs in (the one kept for reuse under `count`/`live`,
one started ahead of need, or a new one) is sessions.py's to decide; the
changes of task rows are task_rows.py's.
"""

import time

TYPE_CHECKING = False  # (not typing's: importing it slows a worker's first call; bench/RESULTS.md)

if TYPE_CHECKING:  # assembled with the files before it by sql/build.py
    from libpq import (
        PG_DIAG_SEVERITY_NONLOCALIZED,
        PG_DIAG_SQLSTATE,
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
        MalformedConninfo,
        RemoteRefused,
        lost_sqlstate,
    )
    from output import (
        OutputTooLarge,
        OutputWriter,
        bounded_error,
        format_error,
        format_message,
        labelled,
        settled,
        with_tabs,
    )
    from plans import WARM_AHEAD, Context, replan_after_growth, to_json
    from sessions import SessionChoice, TaskSessions, reuses_sessions, send_prepare
    from task_rows import (
        HELD,
        claim_next_task,
        end_series,
        finish_task,
        move_task_to_session,
        owner_is_gone,
        owner_to_start_ahead,
        refused_for_its_role,
        retry_of,
        start_task,
        still_claimed,
        take_task,
        task_error,
        unclaim_task,
        upcoming_in_group,
        wake_launchers,
    )


INTERRUPT_EVERY = 0.05  # seconds between interrupt checks while a task runs
# Seconds a task's session may take to end its query once cancelled (task_cancel of a remote task,
# a launcher's stop): a remote server that stopped answering held the task WORK for good.
CANCEL_ANSWER_WAIT = 10.0
CHAIN_SECONDS = 1.0  # longest a worker goes on with its group before the launcher decides again
FRESH_AHEAD = 2  # most new sessions kept starting or ready for the due tasks of a worker's group
SETTING_FRESH = 1.0  # seconds a scheduler setting read from the catalog and files is used
OUTPUT_LIMIT_DEFAULT = 100 * 1024 * 1024  # pg_task_py.output_limit's, in characters
ERROR_LINE_MOST = 1000  # characters of an error's first line in the launcher's log of the task's end
WARM_UP = 0  # the "task id" of the launcher's call that loads PL/Python in a new spare worker
# The SQLSTATEs of the scheduler's own errors (a FAIL's sqlstate, which retry_on matches).
LOST_RUN = "08006"  # the session broke while the task ran: it may have done its work (pgtaskpy.lost_run_sqlstate)
NO_SESSION = "08001"  # the task's session could not be opened
BAD_SETTING = "22023"  # a setting, or a remote conninfo, that cannot be used
OUTPUT_TOO_LARGE = "54000"
NOT_SUPPORTED = "0A000"  # COPY FROM STDIN
UNTRANSLATABLE = "22P05"  # a remote task's text that the database's encoding cannot hold
CHARACTER_NOT_IN_REPERTOIRE = "22021"  # output that is not text in its session's encoding (COPY ... ENCODING)
# The server ended the session for being idle (idle_session_timeout) before it read the input:
# the task has not run there, and moves to a new session, up to SESSIONS_A_TASK in all.
IDLE_ENDED = "57P05"
SESSIONS_A_TASK = 3
# A server that cannot take the task's session now, but will: the task waits.  Its SQLSTATE
# (too_many_connections, cannot_connect_now) for a session of this server, whatever the language
# of its messages; the English messages for a remote one (connected by libpq's blocking call,
# whose errors carry no SQLSTATE).
# A database whose connections a DBA has turned off (ALTER DATABASE ... ALLOW_CONNECTIONS false,
# 55000) waits too: its tasks run once they are allowed again.
BUSY_SQLSTATES = ("53300", "57P03", "55000")
BUSY_SERVER = ("too many clients", "too many connections", "remaining connection slots are reserved",
               "is not currently accepting connections", "the database system is starting up",
               "the database system is shutting down", "the database system is not yet accepting connections",
               # (EAGAIN: the server's socket has more connections waiting to be accepted than its
               # listen queue holds, as in a burst of several launchers: the task has not started)
               "Resource temporarily unavailable")
# The words of BUSY_SERVER that say the server is starting up or going down, not full.
# (not "is not currently accepting connections": a database's ALLOW_CONNECTIONS false, 55000)
SERVER_DOWN = ("the database system is starting up", "the database system is shutting down",
               "the database system is not yet accepting connections")
# A local session the server ended while it was being opened, in a fast or immediate shutdown
# (57P01, 57P02, or a close without a word from a backend not yet started), which reaches this
# worker next: the task has not started, and waits.  It ended FAIL 08001 (pg_hba.conf's hint),
# and for good without a retry, when that FAIL was committed before the worker's own end.
SHUTDOWN_SQLSTATES = ("57P01", "57P02")
CLOSED_UNSAID = "server closed the connection unexpectedly"
# libpq's (English) words for a conninfo value it cannot use (port=abc, sslmode=sometimes), which it
# finds only as it connects: the conninfo's mistake, like one that does not parse, not the network's.
# (And a service that is not defined, a hostaddr that is no address: retried as network errors,
# 08001, three attempts of `definition of service "nosuch" not found`: a probe.)
BAD_CONNINFO_VALUE = ("invalid integer value", "invalid port number", "could not match", "definition of service",
                      "service file", "could not parse network address")


def main(plpy, GD, SD, task_id, claimer):
    """The entry point: sql/build.py passes PL/Python's globals of these names."""
    ctx = Context(plpy, GD, SD)
    ctx.make_constraints_immediate()
    replan_after_growth(ctx)
    report = WorkerCall(ctx, claimer).run(task_id)
    return (to_json(report),)


class TakenBack(Exception):
    """The task stopped being this worker's to start while its session connected."""


class SettingError(Exception):
    """A scheduler setting that cannot be used; the message names it and where it was set."""


class WorkerCall:
    """One CALL of run_task: the task the launcher gave, then the group's next ones.

    `report` goes back to the launcher: the tasks started and ended, those that
    wait again, those whose end could not be written (a burst's: run_batch.py), and
    the key of the session kept for reuse.
    """

    def __init__(self, ctx, claimer, sessions=None):
        self.ctx = ctx
        self.claimer = claimer  # the launcher's session, which claimed the first task
        self.sessions = sessions or TaskSessions.of_worker(ctx)
        self.limit = None  # pg_task_py.output_limit
        self.report = {"started": [], "ended": [], "postponed": [], "server_down": [], "key": None, "ahead": 0,
                       "claim_error": None, "unended": []}
        self.early = None  # the sessions ahead's login fingerprint, for the first task's choice only

    def run(self, task_id):
        if task_id != WARM_UP:
            # While take_task waits for the launcher's claim to commit, not after it: the
            # sessions ahead's last steps of connecting, and their owner's login fingerprint.
            self.sessions.advance_ahead()
            self.early = self.sessions.fingerprint_ahead()
        task = take_task(self.ctx, task_id, self.claimer)
        if task is None and task_id == WARM_UP:  # a new spare worker: have a session ready for the next task
            self.sessions.start_ahead(owner_to_start_ahead(self.ctx, WARM_AHEAD), [None])
            # Sent as this call ends (not committed here): the launcher collects this worker now,
            # not in the turn of the next task, which would wait for that.
            wake_launchers(self.ctx)
        # Read before any WORK is committed: from then on a cancel of this worker (task_cancel
        # of a remote task) is meant for the task's query, which serve_interrupts passes on.
        if task is not None and not self.read_output_limit([task]):
            task = None
        chain_ends = time.monotonic() + CHAIN_SECONDS
        kept = None  # the session a claimed task is WORK in already
        while task is not None:  # else stopped, or taken over after this worker's launcher died
            task, kept = self.run_one(task, kept, go_on=time.monotonic() < chain_ends)
            if task is not None:
                self.report["started"].append(task["id"])
        self.sessions.worker_returns()
        self.report["standby_fallbacks"] = self.sessions.take_standby_fallbacks()
        kept = self.sessions.kept
        self.report["key"] = list(kept.key) if kept is not None else None
        self.report["ahead"] = len(self.sessions.ahead)
        return self.report

    def read_output_limit(self, tasks):
        """pg_task_py.output_limit, for the tasks to come; False when it cannot be used, and then
        the tasks have failed with the reason (committed)."""
        try:
            self.limit = output_limit(self.ctx)
        except SettingError as exc:
            for task in tasks:
                self.fail_unstarted(task, str(exc), "It must be a whole number of characters; fix it with ALTER "
                                    "DATABASE ... SET or in postgresql.conf.", sqlstate=BAD_SETTING)
            return False
        return True

    def run_one(self, task, kept, go_on):
        """Run a taken task to its end; return the group's next task, claimed, when going on with
        it, and its session when the claim made it WORK in that session already.

        The transaction that took the task (and ended the one before) is still open:
        it commits with WORK, unless the session has to be waited for first.
        """
        if kept is None:
            kept = self.start_in_session(task)
            if kept is None:
                return None, None
        try:
            send_prepare(self.ctx, kept.session, task, kept.settings)
        except ConnectError as exc:
            if exc.sqlstate != IDLE_ENDED:
                self.session_failed(task, exc)
                return None, None
            # (ended idle before the task's first statement: run_input moves the task to a new session)
        self.ctx.commit()  # WORK, start and pid are visible while the input runs
        started = time.monotonic()
        if go_on and task["remote"] is None and not reuses_sessions(task):
            # The new sessions of the group's due tasks, and of those due once this one ends (a
            # chain's next steps), start while this one runs (none for tasks not due: the launcher
            # keeps a spare worker with one ahead, warm_workers).  With their tasks' settings when
            # this worker is the one to run them: in a group that runs one task at a time, the
            # next is claimed where the one before ends.
            upcoming = upcoming_in_group(self.ctx, task, FRESH_AHEAD)
            self.sessions.start_ahead(task["owner"], [row if row["max"] <= 0 else None for row in upcoming])
        output, error, sqlstate, notices = self.run_input(kept, task)
        ended = self.end_task(task, started, output, error, sqlstate, notices)
        # The next task takes this one's slot in its group, if this one still held it.
        next_task, next_kept = self.claim_next(task) if go_on and ended is not None else (None, None)
        if next_task is None:
            wake_launchers(self.ctx)  # a slot and this worker are free
            self.ctx.commit()
        return next_task, next_kept

    def end_task(self, task, started, output, error, sqlstate, notices):
        """Write the task's end, not committed yet (the claim of the group's next task joins
        the transaction); return its end state, or None if it had ended already.  Its stop,
        and its seconds in the report, are now: not after a wait for a client's lock on the row."""
        stop = time.time()
        self.sessions.release(task)  # a kept session's reset runs while the end is written
        self.sessions.advance_ahead()
        ended = self.write_end(task, started, output, error, sqlstate, notices, wake=False, stop=stop)
        self.sessions.settle_reset()
        return ended

    def write_end(self, task, started, output, error, sqlstate, notices, wake, stop=None, unless_held=False):
        """finish_task, not committed, and the end in the report; the end state, or None if
        the task had ended already (HELD, unless_held: see finish_task).  `stop`: when it ended
        (time.time()), if not now: its seconds in the report end then too."""
        error = bounded_error(error, self.limit or OUTPUT_LIMIT_DEFAULT)
        try:
            ended = finish_task(self.ctx, task["id"], "FAIL" if error else "DONE", output, error, notices, wake=wake,
                                sqlstate=sqlstate, stop=stop, unless_held=unless_held, table_oid=task.get("table_oid"),
                                ran=True)
        except self.ctx.plpy.spiexceptions.UntranslatableCharacter as exc:
            # A remote task's text with a character this database's encoding lacks (U+20AC into a
            # LATIN1 database): the end could not be written, the worker's call failed, and the
            # task ended later as a lost run (08006, retried as a network error).  It fails saying so.
            output = notices = None
            error, sqlstate = format_message(
                "the task's output, error or notices hold a character this database's encoding cannot hold",
                task["input"], detail=str(exc).split("\n", 1)[0]), UNTRANSLATABLE
            ended = finish_task(self.ctx, task["id"], "FAIL", None, error, None, wake=wake, sqlstate=sqlstate,
                                stop=stop, unless_held=unless_held, table_oid=task.get("table_oid"), ran=True)
        if ended is not None and ended != HELD:
            if ended == "FAIL" and not error:
                error = task_error(self.ctx, task["id"])
            late = time.time() - stop if stop is not None else 0.0
            self.record_end(task, ended, round(time.monotonic() - late - started, 6), error, sqlstate)
        return ended

    def start_in_session(self, task):
        """The task's session, with the task WORK in it (not committed yet); None when the
        task did not start (its end, or its wait for a connection, is recorded)."""
        choice = self.sessions.choose(task, self.early)
        self.early = None
        if not choice.ready:
            self.ctx.commit()  # hold neither the scheduling lock nor rows while a backend starts
        try:
            kept = self.sessions.take(task, choice, on_wait=lambda: self.wait_for_session(task))
        except ConnectError as exc:
            self.session_failed(task, exc, opening=True)
            return None
        except TakenBack:
            wake_launchers(self.ctx)
            self.ctx.commit()
            return None  # not this worker's to run any more: it never started
        try:
            started = start_task(self.ctx, task, kept.session.pid)
        except self.ctx.plpy.spiexceptions.QueryCanceled:
            raise
        except self.ctx.plpy.SPIError as exc:
            # The start's UPDATE failed (a trigger of a DBA's on task that raises, say): this task
            # fails with the error, alone, and the end of the one before it, not committed yet,
            # commits with it.  Raised on, it failed the call, and that task, which ran, ended FAIL.
            self.sessions.close_kept()
            self.fail_unstarted(task, f"could not start the task: {str(exc).splitlines()[0]}", None,
                                sqlstate=getattr(exc, "sqlstate", None))
            return None
        if not started:
            wake_launchers(self.ctx)
            self.ctx.commit()
            return None  # not this worker's to run any more; its session stays clean for the next
        return kept

    def wait_for_session(self, task):
        """While a remote session connects: act on interrupts (a cancel of this worker fails the
        attempt), and give the attempt up (TakenBack) once the task is no longer this worker's
        to start.  The look at the row is the SPI call that acts on interrupts, and the commit
        holds no snapshot over the wait, as serve_interrupts' do."""
        try:
            claimed = still_claimed(self.ctx, task)
        except self.ctx.plpy.spiexceptions.QueryCanceled as exc:
            raise ConnectError("canceling the connection attempt due to user request", "57014") from exc
        self.ctx.commit()
        if not claimed:
            raise TakenBack

    def claim_next(self, task):
        """The group's next task, claimed by this worker (not yet committed), or None; and the
        session it is WORK in already, when the session a task like `task` would take is ready
        and suits it (one started with a task's settings suits that task only)."""
        offer = self.sessions.choose(task, next_of=True)
        try:
            next_task = claim_next_task(self.ctx, task, self.claimer, offer.session.pid if offer.ready else None,
                                        offer.prepared_for)
        except (self.ctx.plpy.spiexceptions.DeadlockDetected, self.ctx.plpy.spiexceptions.QueryCanceled):
            # (QueryCanceled: a cancel meant for the task that has just ended, as in finish_task.)
            # The claim, waiting for the scheduling lock while the end holds a prerequisite key
            # that another worker's end waits for (behind a launcher's turn), lost the cycle: its
            # statement alone is rolled back.  The end commits without it; a launcher claims the
            # next task.  Failing the call ended FAIL the task that had just run (test_chaos.py).
            return None, None
        except self.ctx.plpy.SPIError as exc:
            # Any other failure of the claim (a value it cannot compute with, a trigger of the
            # table's that raises): the same, and the launcher logs it.  It failed the call,
            # which ended the task that had just run FAIL as a lost run, with a traceback.
            self.report["claim_error"] = str(exc).split("\n", 1)[0]
            return None, None
        if next_task is None:
            return None, None
        if next_task["state"] != "WORK":
            return next_task, None
        # WORK in the offered session already: one commit for this task's end and the next's start.
        return next_task, self.sessions.take(next_task, offer)

    def run_input(self, kept, task):
        """Run the input in the task's session (`kept`); return (output, error, sqlstate, notices).

        A session the server ended for being idle before it read the input (its FATAL
        idle_session_timeout, 57P05: a task's own RAISE is an ERROR, and leaves the session
        open) has not run the task, whatever the instant it ended in: the look for its end
        before it is given a task (open_while_idle) cannot see one that comes after.  The
        task moves to a new session, up to SESSIONS_A_TASK in all: a role's timeout shorter
        than a session's start then fails it with the server's error rather than loop.  So does
        a task whose session, kept on a standby, finds that standby promoted (run_input_in).
        """
        for _ in range(SESSIONS_A_TASK - 1):
            ended, moves = self.run_input_in(kept.session, task)
            if not moves:
                return ended
            try:
                kept = self.move_to_new_session(task)
            except ConnectError as exc:
                return None, moved_session_failed(task, exc), exc.sqlstate or NO_SESSION, None
            if kept is None:
                return ended
        return self.run_input_in(kept.session, task)[0]

    def move_to_new_session(self, task):
        """A new session for the WORK task whose session ended before it read the input, the
        task's settings sent and the move committed; None when the task is no longer this worker's
        to run (task_cancel ended it meanwhile); ConnectError when none can be opened."""
        self.sessions.close_kept()
        try:
            kept = self.sessions.take(task, SessionChoice())
            if not move_task_to_session(self.ctx, task, kept.session.pid):
                return None
            try:
                send_prepare(self.ctx, kept.session, task, kept.settings)
            except ConnectError as exc:
                if exc.sqlstate != IDLE_ENDED:
                    raise
                # (this one too ended idle before the task's first statement, on a busy machine:
                # run_input's next turn moves the task again, within SESSIONS_A_TASK)
        except ConnectError:
            self.sessions.close_kept()
            raise
        self.ctx.commit()
        return kept

    def run_input_in(self, session, task):
        """Run the input in `session`: run_input's one attempt; (output, error, sqlstate, notices),
        and whether the input did not run, and the task moves to a new session: the server ended
        the session idle before it, or the standby the session is on has been promoted."""
        reader = None
        try:
            session.collect()  # the answer to send_prepare, if it was sent
            if session.on_standby and session.in_hot_standby == "off":
                # A session kept (count, live) on a standby since promoted: the task's input,
                # read-only on a standby, wrote there (a probe).  Its next session is a standby's
                # again, or the primary's, read-only.
                error = format_message("the standby the task's session was kept on has been promoted", task["input"])
                return (None, error, NO_SESSION, None), True
            reader = self.send_query(session, task)
            ended = self.read_input(session, reader)
            return ended, reader.idle_ended and not session.ok
        except ConnectError as exc:  # the session broke, or a cancel came before the input
            error = format_message(str(exc), task["input"], severity=exc.severity)
            ran = reader is not None and reader.taken > 0
            return (None, error, exc.sqlstate or LOST_RUN, None), exc.sqlstate == IDLE_ENDED and not ran \
                and not session.ok

    def read_input(self, session, reader):
        """Read what the input returns; (output, error, sqlstate, notices)."""
        waiting = {"on_wait": lambda: self.serve_task_interrupts(session), "wait_step": INTERRUPT_EVERY}
        try:
            try:
                for result in session.results(**waiting):
                    reader.take(session, result)
            except OutputTooLarge as exc:
                reader.too_large(session, exc)
            return reader.end(session, **waiting)  # (the COMMIT added may run deferred triggers for long)
        except self.ctx.plpy.SPIError:
            # This worker was cancelled or terminated: stop the task's query too.
            session.cancel()
            self.sessions.close_kept()
            raise

    def send_query(self, session, task):
        """Send the task's input to its session; the InputResults that reads what it returns."""
        writer = OutputWriter(task, self.limit, keep_values=may_change_encoding(task, session))
        reader = InputResults(self.ctx, task, writer, session.codec, session.encoding)
        session.limit_notices(self.limit)
        session.send(task["input"])
        return reader

    def serve_interrupts(self, *sessions):
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
            self.ctx.run("interrupts", "SELECT")
        except self.ctx.plpy.spiexceptions.QueryCanceled:
            for session in sessions:
                session.cancel()
        self.ctx.commit()

    def serve_task_interrupts(self, session):
        """serve_interrupts for a task's session, which is given up (closed: ConnectError, the
        task's end) when it has not ended its query CANCEL_ANSWER_WAIT after its cancel.  A remote
        server that stops answering (a frozen host, a network cut with no reset) answers neither
        the query nor its cancel, and the task stayed WORK, its group held, for as long."""
        self.serve_interrupts(session)
        if session.cancelled_at is not None and time.monotonic() - session.cancelled_at > CANCEL_ANSWER_WAIT:
            session.close()
            raise ConnectError(f"the task's session did not end its query within {CANCEL_ANSWER_WAIT:g} s of its"
                               " cancel: its server does not answer; the worker closed the session, and the"
                               " query may go on there until that server sees it closed", "57014")

    def session_failed(self, task, exc, opening=False):
        """The task's session could not be opened (`opening`) or used: the task waits for a
        connection slot when the server is full or going down, else it fails with the reason
        (committed; no next task)."""
        self.sessions.close_kept()
        if (exc.sqlstate in BUSY_SQLSTATES or any(reason in str(exc) for reason in BUSY_SERVER)
                or opening and task["remote"] is None and ended_by_shutdown(exc)):
            # It never started: it waits for a connection slot, not FAIL.  One its launcher claimed
            # stays claimed until the launcher collects this call, gives it back and holds it for a
            # second (dispatch.py, HOLD_POSTPONED): given back here, it was claimed again at once by
            # the launcher's next turn, which claims before it collects.
            if task["worker"] != self.claimer:
                unclaim_task(self.ctx, task["id"])
            wake_launchers(self.ctx)
            self.ctx.commit()
            self.report["postponed"].append(task["id"])
            if (task["remote"] is None and task["target"] is None
                    and not refused_for_its_role(self.ctx, task, str(exc))):
                # This server's or this database's limit: the launcher runs no more at once.
                # (Not a remote server's, nor a standby's: a task to a full server held every
                # other task of the database back, 5 at once of 30: a review.)
                self.report["short_of_connections"] = True
            if is_server_going_down(exc):  # (the launcher's log line says so, not "no free connection")
                self.report["server_down"].append(task["id"])
        elif isinstance(exc, MalformedConninfo):  # pg_task's words
            # (the word is not shown, a password's piece perhaps: a review found one that the
            # word's place, left of "=", showed, of a password written unquoted)
            unknown_word = "invalid connection option" in str(exc) or "invalid URI query parameter" in str(exc)
            hint = ("Each word left of \"=\" must be a libpq keyword (host, port, dbname, user, password, ...):"
                    " check its spelling, and quote a value that holds spaces ('...')." if unknown_word else None)
            self.fail_unstarted(task, "PQconninfoParse failed", hint, detail=str(exc), sqlstate=BAD_SETTING)
        elif task["remote"] is not None and is_bad_conninfo_value(str(exc)):
            self.fail_unstarted(task, f"could not open the task's session: {exc}", None, sqlstate=BAD_SETTING)
        elif isinstance(exc, RemoteRefused):
            # (no retry passes them, and each retry of "did not ask" logged in as someone else again)
            self.fail_unstarted(task, f"could not open the task's session: {exc}", None, sqlstate=exc.sqlstate)
        elif not opening and exc.sqlstate in SHUTDOWN_SQLSTATES and task["remote"] is None:
            # A session kept or started ahead that the server ended (a DBA's pg_terminate_backend)
            # as the task was sent: the server's error, as for a terminate while the task runs (it
            # may be meant for the task).  It failed "could not open the task's session", 08001,
            # with pg_hba.conf's hint, retried as a network error (a probe).
            self.fail_unstarted(task, str(exc), None, sqlstate=exc.sqlstate, severity=exc.severity)
        elif not opening and exc.sqlstate in SHUTDOWN_SQLSTATES:
            # A remote one: its server restarting (a fast shutdown ends every session so), a network
            # error, retried as class 08 is (it failed 57P01, never retried, though its input had
            # not been sent: a review).
            self.fail_unstarted(task, "the task's session ended before its input was sent: {}:  {}".format(
                *labelled(str(exc), exc.severity)), None, sqlstate=NO_SESSION)
        elif task["remote"] is None and owner_is_gone(self.ctx, task):
            # Its owner was dropped or renamed: its series failed at every run, for ever, and a
            # role created later with the old name would have run them.
            end_series(self.ctx, task["id"])
            self.fail_unstarted(task, f"could not open the task's session: {exc}", owner_gone_hint(task),
                                sqlstate=NO_SESSION)
        else:
            self.fail_unstarted(task, f"could not open the task's session: {exc}", connect_failure_hint(task),
                                sqlstate=NO_SESSION)

    def fail_unstarted(self, task, message, hint, detail=None, sqlstate=None, severity="ERROR"):
        """End a task that never started FAIL with an error of the scheduler's own (or the server's)."""
        error = bounded_error(format_message(message, task["input"], hint, detail, severity),
                              self.limit or OUTPUT_LIMIT_DEFAULT)
        state = finish_task(self.ctx, task["id"], "FAIL", None, error, sqlstate=sqlstate,
                            table_oid=task.get("table_oid"))
        self.record_end(task, state or "FAIL", None, error, sqlstate)
        self.ctx.commit()

    def record_end(self, task, state, seconds, error, sqlstate):
        """A task's end, as the launcher logs it: with the first line of its error, its SQLSTATE,
        and whether and when it is tried again (a task with retries)."""
        entry = {"id": task["id"], "state": state, "seconds": seconds}
        if error:
            # (its first line, and at most ERROR_LINE_MOST characters of it: an error of 200 MB
            # went whole to the launcher, whose turn, every role's, took 6-27 s to log it)
            first = error.split("\n", 1)[0]
            entry["error"] = first if len(first) <= ERROR_LINE_MOST else first[:ERROR_LINE_MOST] + "..."
        if state == "FAIL" and sqlstate:
            entry["sqlstate"] = sqlstate
        if state == "FAIL" and task["retry"] > 0:
            entry.update(retry_of(self.ctx, task["id"]))
        self.report["ended"].append(entry)


class InputResults:
    """What a task's input returns, result by result: the output, written as it comes, and
    the error and SQLSTATE it ended with."""

    def __init__(self, ctx, task, writer, read_as, sent_in):
        self.ctx = ctx
        self.task = task
        self.writer = writer
        self.read_as = read_as  # the codec the input's results are read in: the session's as it was sent
        self.sent_in = sent_in  # (that encoding's name: EUC_TW, which Python has no codec of, is read as UTF-8)
        # What the input returned before the COMMIT added (close_transaction), whose results are
        # read in the session's encoding as the input left it: lines, notices, and its error.
        self.input_returned = None
        self.error = self.sqlstate = None
        self.copy_undecodable = False  # a COPY ... TO STDOUT wrote rows that are not text in the session's codec
        self.closing = False  # the input has returned everything: its transaction is being ended
        self.taken = 0  # results read before the error
        # The session's FATAL idle_session_timeout came before any result: the input never ran.
        # Not a 57P05 of the task's own (a RAISE ... USING ERRCODE, an ERROR) after it had run
        # and committed work: with its session terminated at that moment, the task moved to a new
        # session and ran again (a probe).
        self.idle_ended = False

    def take(self, session, result):
        """One result of the input (freed here); OutputTooLarge when the output grows past the limit."""
        with result:
            status = result.status
            if self.error is not None:
                return  # drain what is left after an error of ours
            self.taken += 1
            if status in (PGRES_SINGLE_TUPLE, PGRES_TUPLES_OK):
                self.writer.rows(result.columns(escaped=True), result.rows(escaped=True))
                if status == PGRES_TUPLES_OK:
                    self.writer.end_rows()
            elif status == PGRES_COMMAND_OK:
                self.writer.command(result.command_tag())
            elif status == PGRES_COPY_OUT:
                self.copy_out(session, result.binary)
            elif status in (PGRES_COPY_IN, PGRES_COPY_BOTH):
                self.error = format_message(
                    "COPY FROM STDIN is not supported", self.task["input"],
                    hint="COPY from a server file works; a task has no client to stream from.")
                self.sqlstate = NOT_SUPPORTED
                if status == PGRES_COPY_IN:
                    session.refuse_copy_in()  # the server fails the COPY: the input's work is rolled back
                else:  # (a replication session's: a task's session is none)
                    session.cancel()
                    for _ in session.copy_data():
                        pass
            elif status == PGRES_FATAL_ERROR:
                words, verbose_sqlstate = session.error()
                self.error = format_error(result, self.task["input"], words)
                # (none: libpq's own error, the connection broke; ended idle, if its words say so)
                self.sqlstate = result.field(PG_DIAG_SQLSTATE) or lost_sqlstate(words, verbose_sqlstate) or LOST_RUN
                self.idle_ended = (self.sqlstate == IDLE_ENDED and self.taken == 1
                                   and result.field(PG_DIAG_SEVERITY_NONLOCALIZED) in (None, "FATAL"))

    def copy_out(self, session, binary):
        """The rows of a COPY ... TO STDOUT into the output.  Past the output's limit, the COPY
        is cancelled and the rest of its rows dropped before OutputTooLarge goes on: the
        session is then out of its COPY, with the cancel's error as its next result."""
        codec = session.codec
        rows = session.copy_data()
        try:
            for data in rows:
                if not (binary or self.copy_undecodable):
                    self.copy_undecodable = not decodes(data, codec)
                self.writer.copy_row(data, codec, binary)
        except OutputTooLarge:
            session.cancel()
            for _ in rows:
                pass
            raise

    def too_large(self, session, exc):
        """The output passed pg_task_py.output_limit: cancel the input, drop what is left."""
        session.cancel()
        for result in session.results():
            result.__exit__()
        self.error = format_message(str(exc), self.task["input"],
                                    hint="Raise pg_task_py.output_limit or make the task return less.")
        self.sqlstate = OUTPUT_TOO_LARGE

    def end(self, session, on_wait=None, wait_step=1.0):
        """The input has no result left: (output, error, sqlstate, notices), once the transaction
        it left open has ended (close_transaction), waited for with `on_wait` as the input was."""
        try:
            if self.close_transaction(session):
                for result in session.results(on_wait=on_wait, wait_step=wait_step):
                    self.take(session, result)
        except OutputTooLarge as exc:  # (the COMMIT's tag past the limit: committed, and FAIL 54000)
            self.too_large(session, exc)
        except ConnectError as exc:
            self.broke(exc)
        return self.settled(session)

    def close_transaction(self, session):
        """End a transaction the input left open: a failed one is rolled back; an open one is
        committed (pg_task does, and says so: its tag), and True says that the COMMIT's answer is
        to be read as the input's were: when it fails (a deferred constraint), the task keeps its
        output and the error its DETAIL, as with a COMMIT of its own."""
        self.closing = True
        self.input_returned = (len(self.writer.lines), len(session.notices), self.error is not None)
        if session.transaction_status == PQTRANS_INTRANS and self.error is None:
            session.send("COMMIT")
            return True
        if session.transaction_status in (PQTRANS_INTRANS, PQTRANS_INERROR):
            # (failed, or failed by the worker: an output past its limit is not committed)
            session.execute("ROLLBACK")
        return False

    def broke(self, exc):
        """The session broke, or the server ended it, after the input had returned everything
        (idle_in_transaction_session_timeout before the COMMIT added): the task fails with that,
        its transaction rolled back, and keeps the output and notices it returned."""
        if self.error is None:
            self.error = format_message(str(exc), self.task["input"], severity=exc.severity)
            self.sqlstate = exc.sqlstate or LOST_RUN

    def settled(self, session):
        """(output, error, sqlstate, notices) of an input that has ended, in the session's encoding."""
        undecodable = []
        decode = self.decoder(session, undecodable)  # (its encoding known now: see output.settled)
        lines, notices_before, error_before = self.input_returned or (len(self.writer.lines), len(session.notices),
                                                                      self.error is not None)
        changed = self.sent_in != session.encoding  # (its codec follows from it)

        writer = self.writer

        def settle(parts, before):
            """The parts of a text (notices) as one, those the input returned read again."""
            texts = [settled("\n".join(part), decode, *codec)
                     for part, codec in ((parts[:before], (self.read_as, changed)), (parts[before:], (session.codec,)))
                     if part]
            return "\n".join(texts) if texts else None

        output = writer.settled(decode, lines, self.read_as, changed, session.codec)
        notices = settle(session.notices, notices_before)
        error = self.error
        # (its STATEMENT line is the task's input, text of the worker's: kept as it is)
        statement = "\nSTATEMENT:  " + with_tabs(self.task["input"] or "")
        head, tail = (error[:-len(statement)], statement) if error and error.endswith(statement) else (error, "")
        error = settled(head, decode, *((self.read_as, changed) if error_before else (session.codec,)))
        error = error + tail if error is not None else None
        if undecodable and not holds_replacement_character(self.ctx):
            # (U+FFFD, this code's for bytes that are not text, in a LATIN1 database: the end could
            # not be written, and the task failed 22P05 without its own error, SQLSTATE and output.
            # A remote's own U+FFFD fails so still, as any character the database lacks.)
            output, error, notices = (text and text.replace("\ufffd", "?") for text in (output, error, notices))
        if (undecodable and error is None and self.copy_undecodable
                and not (session.encoding == session.server_encoding == "SQL_ASCII")):
            # The server sends text in the session's encoding, except a COPY's ENCODING option:
            # its rows were stored with U+FFFD for each character, and the task ended DONE.
            # (Not a task that set client_encoding and then set it back, whose first encoding's
            # text is read in the second, unless a COPY's rows were that text: its statements ran,
            # and it failed with this hint.)
            error = format_message(  # (pgtaskpy.retry_plan reads these words: see OutputTooLarge's)
                f"the task's output holds bytes that are not text in its session's encoding ({session.encoding})",
                self.task["input"], hint="A COPY ... TO STDOUT with an ENCODING option writes in that encoding, which "
                "a task's output cannot hold: leave the option out, and the server converts to the session's.")
            return output, error, CHARACTER_NOT_IN_REPERTOIRE, notices
        return output, error, self.sqlstate, notices

    def decoder(self, session, undecodable):
        """How text in the session's client_encoding is read: by Python's codec, or, for the
        encoding Python has none of (EUC_TW: its text was stored as U+FFFD, DONE), by the server's
        conversion into the database's encoding.  Bytes that are not text in it are replaced, and
        noted in `undecodable`."""
        if session.has_codec:
            codec = session.codec

            def by_the_codec(raw):
                try:
                    return raw.decode(codec)
                except UnicodeDecodeError:
                    undecodable.append(raw)
                    return raw.decode(codec, "replace")
            return by_the_codec
        encoding = session.encoding

        def by_the_server(raw):
            try:
                return self.ctx.run("convert_from", "SELECT pg_catalog.convert_from($1, $2) AS t",
                                    ["bytea", "name"], [raw, encoding])[0]["t"]
            except self.ctx.plpy.SPIError:
                undecodable.append(raw)
                return raw.decode("utf-8", "replace")
        return by_the_server


def may_change_encoding(task, session):
    """Whether the task's input may leave its session in a client_encoding other than the one it
    is sent in: its input names the setting (or says `names`, as SET NAMES does: a review), or the
    session is in another than UTF8 already (a kept one's, or a role's: a RESET ALL or DISCARD ALL
    changes it back).  (OutputWriter's keep_values, which the other tasks' output need not pay
    for; a word that only looks like it costs that output no more than its values' memory.)"""
    words = task["input"].lower()
    return session.encoding != "UTF8" or "client_encoding" in words or "names" in words


def decodes(data, codec):
    """Whether the bytes are text in `codec`."""
    try:
        data.decode(codec)
    except UnicodeDecodeError:
        return False
    return True


def holds_replacement_character(ctx):
    """Whether this database's encoding holds U+FFFD (UTF8 does, and SQL_ASCII keeps its bytes;
    LATIN1 does not): read once a backend."""
    if "holds_replacement_character" not in ctx.SD:
        ctx.SD["holds_replacement_character"] = ctx.run(
            "encoding", "SELECT pg_catalog.current_setting('server_encoding') AS e")[0]["e"] in ("UTF8", "SQL_ASCII")
    return ctx.SD["holds_replacement_character"]


def is_bad_conninfo_value(message):
    """Whether libpq refused a connection for a value of its conninfo (BAD_CONNINFO_VALUE, or its
    'invalid sslmode value: "..."' and the like)."""
    return any(words in message for words in BAD_CONNINFO_VALUE) or (
        message.startswith("invalid ") and ' value: "' in message)


def is_server_going_down(exc):
    """Whether a session's connect failed because its server is starting up or shutting down
    (the task waits, as for a free connection, but there is no connection to free)."""
    return (exc.sqlstate == "57P03" or ended_by_shutdown(exc)
            or any(words in str(exc) for words in SERVER_DOWN))


def ended_by_shutdown(exc):
    """Whether a session's connect failed as a shutdown ends it (SHUTDOWN_SQLSTATES)."""
    return exc.sqlstate in SHUTDOWN_SQLSTATES or exc.sqlstate is None and CLOSED_UNSAID in str(exc)


def connect_failure_hint(task):
    if task["remote"] is not None:
        return "Check the task's remote conninfo and that the server accepts it."
    return (
        f'The task runs in a session logged in as its owner "{task["owner"]}" over the local socket: '
        "allow it in pg_hba.conf (see README, Security model), and check the role exists with LOGIN and may CONNECT "
        "to the database."
    )


def owner_gone_hint(task):
    return (f'No role is named "{task["owner"]}" any more (dropped, or renamed): the task ends, and no next run '
            "nor retry follows it. Insert it again as the role that should run it.")


def moved_session_failed(task, exc):
    """The error of a task whose session ended idle before its input, and no new one opened: it
    ends FAIL (it is WORK: not a wait for a connection slot, as before a start)."""
    return format_message(f"could not open the task's session: {exc}", task["input"], connect_failure_hint(task),
                          detail="The session it was given had ended for being idle (idle_session_timeout)"
                                 " before it read the input.")


def output_limit(ctx):
    """pg_task_py.output_limit (database or server level; a task cannot raise it), else 100 MB.

    Read again after SETTING_FRESH seconds (reading the configuration files
    costs more than a short task).  A value that is not a whole number raises
    SettingError: the tasks of this database fail with it, nothing else does.
    """
    cached = ctx.GD.get("pgtaskpy.output_limit")
    if cached is None or time.monotonic() >= cached[2]:
        row = ctx.run(
            "limit",
            "SELECT pgtaskpy.scheduler_setting('pg_task_py.output_limit') AS v,"
            " pgtaskpy.scheduler_setting_source('pg_task_py.output_limit') AS source")[0]
        cached = ctx.GD["pgtaskpy.output_limit"] = (row["v"], row["source"], time.monotonic() + SETTING_FRESH)
    value, source, _ = cached
    if not value:
        return OUTPUT_LIMIT_DEFAULT
    if not (value.strip().isascii() and value.strip().isdigit()):  # (str.isdigit: U+00B2 too, which int() refuses)
        raise SettingError(f'invalid value for setting "pg_task_py.output_limit" of {source}: "{value}"')
    return int(value)
