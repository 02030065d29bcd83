"""Body of PROCEDURE pgtaskpy.run_tasks(task_ids bigint[], claimer integer, INOUT report jsonb).

A burst's tasks, run side by side by one worker backend.  When a launcher turn
claims more tasks than it has idle workers, it gives the local tasks that
start a new session each (no `remote`, `target`, `count` or `live`) to a few
workers, up to TASKS_A_WORKER each (dispatch.py), rather than a worker each:
N running tasks then hold N task sessions and N / TASKS_A_WORKER workers, not
2N backends, and the burst waits for a few worker connections, not N.

The worker opens every task's session at once (libpq's asynchronous connect),
each with its task's settings (sessions.settings_at_start) and without the owner's
idle_session_timeout (IDLE_TIMEOUT_OFF), and waits on all their sockets
together.  Each task goes the way a task of run_task goes: WORK committed with
its session's pid before its input is sent, the input sent as one top-level
query, its end committed as soon as its last result is read, in a transaction
of its own.  It does not go on with its group's next task: its end wakes the
launchers, which claim it.

A task whose row another transaction holds (a client's SELECT ... FOR UPDATE or
open UPDATE of its own task) is not waited for: its take, start or end is
written once the row is free, and the others go on meanwhile.  Waited for, one
client's lock held back the starts and ends of up to a hundred tasks of any
role, for as long as its transaction lasted.
"""

import select
import time

# Seconds a connected session waits for others to connect before their WORK is written together
# (start_connected), unless none is still connecting.  A burst's sessions connect one after
# another, a few milliseconds apart on busy cores: started each alone, one statement and one
# commit a task took 0.5 ms of CPU a task from the cores the burst's new sessions need.
START_GATHER = 0.01
# A burst's session runs one task and closes: it is idle only while its worker starts its task,
# which takes that worker longer the more sessions connect at once.  The owner's idle_session_timeout
# (ALTER ROLE, ALTER DATABASE, postgresql.conf: a client's startup option comes before them all)
# ended such sessions before their input: with 50 ms, 95 tasks of a burst of 150 ended FAIL 57P05
# on a busy machine, each after three sessions whose starts kept its cores busier still.
IDLE_TIMEOUT_OFF = "-c idle_session_timeout=0"

TYPE_CHECKING = False  # (not typing's: importing it slows a worker's first call; bench/RESULTS.md)

if TYPE_CHECKING:  # assembled with run_task.py and the files before it by sql/build.py
    from libpq import (
        PG_DIAG_MESSAGE_PRIMARY,
        PG_DIAG_SEVERITY,
        PG_DIAG_SQLSTATE,
        PGRES_FATAL_ERROR,
        ConnectError,
        Session,
        lost_sqlstate,
    )
    from output import OutputTooLarge, format_message
    from plans import Context, replan_after_growth, to_json
    from run_task import INTERRUPT_EVERY, LOST_RUN, WorkerCall
    from sessions import PLAIN_SESSION_OPTIONS, TaskSessions, send_prepare, settings_at_start
    from task_rows import HELD, launcher_accepts, start_task, start_tasks, take_tasks, wake_launchers


class Running:
    """One task of the batch and its session, on its way: connecting, then (unless it started
    with its task's settings) preparing, the answer to send_prepare, then running its input."""

    __slots__ = ("task", "session", "settings", "preparing", "reader", "started", "error", "sqlstate", "severity",
                 "held", "gathered")

    def __init__(self, task, session, settings):
        self.task = task
        self.session = session
        self.settings = settings  # the task settings it started with, if any
        self.preparing = False  # the answer to send_prepare is still to read
        self.reader = None  # InputResults, once the input is sent
        self.started = None  # monotonic time of its WORK
        self.error = self.sqlstate = self.severity = None  # the session's failure before the input ran
        self.held = False  # connected, its start waits for its row (another transaction holds it)
        self.gathered = False  # connected, its start waits for others' (START_GATHER)


class BatchCall:
    """One CALL of run_tasks: every task given, at once; no next task of a group.

    Each task starts, fails and ends as in a single task's call: `call` (a WorkerCall) keeps the
    report, and writes the failures and ends.
    """

    def __init__(self, ctx, claimer):
        self.ctx = ctx
        self.claimer = claimer
        # Sessions of its own, not the worker's in GD: a batch keeps no session, and leaves those
        # of run_task's code (another procedure's) alone.
        self.call = WorkerCall(ctx, claimer, TaskSessions(ctx))
        self.untaken = []  # ids of given tasks whose rows were held when taken: taken once free
        self.unwritten = []  # ends whose rows were held when written: (entry, end_args), written once free

    def run(self, task_ids):
        tasks, self.untaken = take_tasks(self.ctx, task_ids, self.claimer)
        if not tasks:
            return self.call.report  # (any held: the launcher gives them back as the call returns)
        if not self.call.read_output_limit(tasks):
            return self.call.report
        self.ctx.commit()  # hold neither rows nor the scheduling lock while the backends start
        running = []
        self.open_sessions(tasks, running)
        try:
            self.run_side_by_side(running)
        except self.ctx.plpy.SPIError:
            # This worker was cancelled or terminated: stop the tasks' queries too.
            for entry in running:
                entry.session.cancel()
            raise
        finally:
            for entry in running:
                entry.session.close()
        wake_launchers(self.ctx)  # this worker is free
        self.ctx.commit()
        return self.call.report

    def open_sessions(self, tasks, running):
        """Start the tasks' sessions; they join `running` (a refused one waits or fails)."""
        for task in tasks:
            try:
                running.append(Running(task, *self.new_session(task)))
            except ConnectError as exc:
                self.call.session_failed(task, exc, opening=True)

    def take_untaken(self, running):
        """Take the given tasks whose rows were held, those now free; they join `running`."""
        tasks, self.untaken = take_tasks(self.ctx, self.untaken, self.claimer)
        self.ctx.commit()
        self.open_sessions(tasks, running)

    def new_session(self, task):
        """A new session of the task's owner, started (not waited for) with the task's settings
        and without an idle_session_timeout (IDLE_TIMEOUT_OFF); and those settings."""
        settings, options = settings_at_start(self.ctx, task)
        options = f"{options or PLAIN_SESSION_OPTIONS} {IDLE_TIMEOUT_OFF}"
        return Session(self.call.sessions.loopback_keywords(task["owner"], options), wait=False), settings

    def run_side_by_side(self, running):
        """Take every task on as its session allows, until all have ended and their ends are
        written.  Rows that were held are tried again each INTERRUPT_EVERY; given tasks still
        untaken when nothing else runs are left to the launcher, which gives them back."""
        served = time.monotonic()
        gathered, gathered_at = [], 0.0
        while running or self.unwritten:
            wait = INTERRUPT_EVERY if not gathered else max(0.0, gathered_at + START_GATHER - time.monotonic())
            connected = [entry for entry in self.ready(running, wait) if self.step(entry)]
            if connected and not gathered:
                gathered_at = time.monotonic()
            for entry in connected:
                entry.gathered = True
            gathered += connected
            if gathered and (time.monotonic() >= gathered_at + START_GATHER
                             or not any(entry.session.connecting for entry in running)):
                for entry in gathered:
                    entry.gathered = False
                self.start_connected(gathered)
                gathered = []
            if time.monotonic() >= served + INTERRUPT_EVERY:
                self.call.serve_interrupts(*(entry.session for entry in running))
                self.retry_held(running)
                served = time.monotonic()
            # (after retry_held too: a held task stopped meanwhile has its session closed there, and
            # the poll of a closed session's socket, -1, failed the call and every task in it)
            for entry in [entry for entry in running if entry.session.handle is None]:
                running.remove(entry)  # ended, or never started

    def retry_held(self, running):
        """Take, start and end what waited for a row another transaction held, if it is free.
        Start nothing once the launcher stops or is gone: it gives those back, or the next one's
        recovery does (this worker, waiting for a held end, started a task after its launcher
        had stopped)."""
        held = [entry for entry in running if entry.held]
        if (self.untaken or held) and not launcher_accepts(self.ctx, self.claimer):
            for entry in held:
                entry.session.close()  # (its row stays TAKE, its launcher's claim)
            self.untaken, held = [], []
        if self.untaken and running:
            self.take_untaken(running)
        if held:
            self.start_connected(held)
        unwritten, self.unwritten = self.unwritten, []
        for entry, end in unwritten:
            self.write_end(entry, *end)

    def ready(self, running, wait):
        """The tasks whose session has something to read (or, connecting, to write), waiting up to
        `wait` seconds; not those whose start waits for their row or for others' (an idle session
        has nothing to say)."""
        by_socket = {}
        poller = select.poll()  # (select's sockets must be numbered below 1024; a backend's may not be)
        for entry in running:
            if entry.held or entry.gathered:
                continue
            socket, for_writing = entry.session.socket
            by_socket[socket] = entry
            poller.register(socket, select.POLLOUT if for_writing else select.POLLIN)
        return [by_socket[socket] for socket, _ in poller.poll(wait * 1000)]

    def step(self, entry):
        """Take the task on as far as its session allows now; True when its session has just connected."""
        session = entry.session
        if session.connecting:
            try:
                return session.advance() and session.ok
            except ConnectError as exc:
                self.call.session_failed(entry.task, exc, opening=True)
                return False
        if entry.reader is None:
            self.read_prepared(entry)
        else:
            self.read_input(entry)
        return False

    def start_connected(self, connected):
        """WORK in the sessions that have connected, committed before any of their inputs goes:
        in one statement (start_tasks) and one commit.  Rows another transaction holds are not
        waited for (a client locking several tasks newest first while the worker, marking them
        oldest first, waited for one: the two deadlocked, the server failed the worker's CALL, and
        the tasks it had started ended FAIL though they ran; test_burst.py): those start once free
        (retry_held).  When the statement fails (a trigger of a DBA's on task that raises, say),
        each task is started alone, so that only those it fails for fail."""
        try:
            outcomes = start_tasks(self.ctx, [entry.task for entry in connected],
                                   [entry.session.pid for entry in connected])
        except self.ctx.plpy.spiexceptions.QueryCanceled:
            raise  # (this worker was cancelled: run_side_by_side's caller stops every task)
        except self.ctx.plpy.SPIError:
            outcomes = {}
        sent = []
        for entry in connected:
            started = outcomes.get(entry.task["id"])
            if started is None:
                started = self.start_alone(entry)
            entry.held = started == HELD
            if entry.held:
                continue  # started once its row is free (retry_held)
            if not started:
                entry.session.close()  # stopped meanwhile, or its start failed: not this worker's to run
                continue
            try:
                entry.preparing = send_prepare(self.ctx, entry.session, entry.task, entry.settings)
            except ConnectError as exc:
                entry.session.close()
                self.call.session_failed(entry.task, exc)
                continue
            sent.append(entry)
        self.ctx.commit()
        now = time.monotonic()
        for entry in sent:
            entry.started = now
            if not entry.preparing:
                self.send_input(entry)

    def start_alone(self, entry):
        """start_task for one task: True, False or HELD; False when its start's UPDATE failed,
        and the task has ended FAIL with the error."""
        try:
            return start_task(self.ctx, entry.task, entry.session.pid, unless_held=True)
        except self.ctx.plpy.spiexceptions.QueryCanceled:
            raise
        except self.ctx.plpy.SPIError as exc:
            # Raised on, it failed the whole call, and the other tasks of the batch, which ran,
            # ended FAIL as lost runs.
            self.call.fail_unstarted(entry.task, f"could not start the task: {str(exc).splitlines()[0]}", None,
                                     sqlstate=getattr(exc, "sqlstate", None))
            return False

    def read_prepared(self, entry):
        """The answer to send_prepare; when it is all read, the input goes."""
        for result in entry.session.arrived_results():
            with result:
                if result.status == PGRES_FATAL_ERROR and entry.error is None:
                    words, verbose_sqlstate = entry.session.error()
                    entry.error = result.field(PG_DIAG_MESSAGE_PRIMARY) or words
                    entry.sqlstate = result.field(PG_DIAG_SQLSTATE) or lost_sqlstate(words, verbose_sqlstate)
                    entry.severity = result.field(PG_DIAG_SEVERITY)
        if not entry.session.answered:
            return
        if entry.error is not None:  # the session broke, or a cancel came before the input
            self.end(entry, None, format_message(entry.error, entry.task["input"], severity=entry.severity),
                     entry.sqlstate or LOST_RUN, None)
            return
        self.send_input(entry)

    def send_input(self, entry):
        """Send the task's input, once its WORK is committed and its session has its settings."""
        try:
            entry.reader = self.call.send_query(entry.session, entry.task)
        except ConnectError as exc:
            self.end(entry, None, format_message(str(exc), entry.task["input"], severity=exc.severity),
                     exc.sqlstate or LOST_RUN, None)

    def read_input(self, entry):
        """What the input has returned so far; its end once it has returned everything, and the
        COMMIT added for a transaction it left open has answered: read as the input was, beside
        the other tasks (a deferred trigger's 8 s in it held every task of the batch)."""
        reader, session = entry.reader, entry.session
        try:
            for result in session.arrived_results():
                reader.take(session, result)
        except OutputTooLarge as exc:
            reader.too_large(session, exc)
        if not session.answered:
            return
        if not reader.closing:
            try:
                if reader.close_transaction(session):
                    return  # (its answer arrives as the input's did)
            except ConnectError as exc:
                reader.broke(exc)
        self.end(entry, *reader.settled(session))

    def end(self, entry, output, error, sqlstate, notices):
        """The task's end, committed on its own; its session closes.

        Not with the other ends of the moment: each end locked its task's key of the prerequisite
        locks (keys of task ids, advisory then), and ends written together took several keys in
        no order another worker's shared; two workers deadlocked, and the tasks of the loser's call,
        which had run, ended FAIL (656 of 1,000 ending together; test_burst.py).  Its stop is
        now, whenever it is written (write_end)."""
        entry.session.close()
        self.write_end(entry, time.time(), output, error, sqlstate, notices)

    def write_end(self, entry, stop, output, error, sqlstate, notices):
        """The end committed, unless another transaction holds the row: then written later."""
        end = (stop, output, error, sqlstate, notices)
        try:
            written = self.call.write_end(entry.task, entry.started, output, error, sqlstate, notices, wake=True,
                                          stop=stop, unless_held=True)
        except self.ctx.plpy.spiexceptions.QueryCanceled:
            raise
        except self.ctx.plpy.SPIError as exc:
            # The end's UPDATE failed (a trigger of a DBA's on task that raises, say): that task stays
            # WORK, and the launcher closes this worker, so that recovery ends the run as lost once it
            # may.  Raised on, it failed the whole call, and the other tasks of the batch, which ran,
            # ended FAIL as lost runs.
            self.call.report["unended"].append({"id": entry.task["id"], "message": str(exc).splitlines()[0]})
            written = None
        if written == HELD:
            self.unwritten.append((entry, end))
        self.ctx.commit()


def main(plpy, GD, SD, task_ids, claimer):
    """The entry point: sql/build.py passes PL/Python's globals of these names."""
    ctx = Context(plpy, GD, SD)
    ctx.make_constraints_immediate()
    replan_after_growth(ctx)
    report = BatchCall(ctx, claimer).run(task_ids)
    return (to_json(report),)
