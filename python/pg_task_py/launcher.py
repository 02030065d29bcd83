"""The scheduler loop for one database: call pgtaskpy.dispatch(), then sleep
until a NOTIFY or the time it asked for.  Every scheduling rule lives in the
database; this module only connects, waits, logs and stops cleanly."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import select
import threading
import time
from dataclasses import dataclass

import psycopg
import psycopg.sql

from pg_task_py import __version__
from pg_task_py.connection_waits import ConnectionWaits, ToldEvery
from pg_task_py.metrics import GROUPS_LABELLED, Metrics
from pg_task_py.text import first_line
from pg_task_py.turns import TurnWatch

log = logging.getLogger("pg_task_py")

# The channel of extensions 1.0-1.2, which do not name it themselves (pgtaskpy.name_of).
LEGACY_CHANNEL = "pg_task_py"
PROMOTION_LOOK_EVERY = 0.5  # seconds between a standby launcher's looks whether it was promoted
WAITING_LOG_EVERY = 5.0  # seconds between "stopping, waiting for N running task(s)" lines
DRAIN_MOST = 0.05  # seconds the listener reads waiting notifications for before a turn
STOP_LOOK_EVERY = 0.1  # seconds between an idle scheduler's looks whether it was asked to stop (a short --grace)
SNAPSHOT_EVERY = 1.0  # seconds between reads of pgtaskpy.metrics_snapshot() (with --metrics)
# What the launcher's sessions set at login, before their first statement, whatever the database's
# or role's defaults (dispatch() sets the rest of what a scheduler session needs itself:
# sql/plpython/dispatch.py, SCHEDULER_SETTINGS): a database's statement_timeout of 30 ms cancelled
# the first turn, for ever, and default_transaction_read_only failed every claim.  And the
# search_path: a database's owner may set the database's (`evil, pg_catalog`), and had its own
# pg_is_in_recovery() and now() run by the launcher's superuser session.  And how the session
# talks: psycopg reads intervals in IntervalStyle postgres only (`status` failed with a traceback
# under a database's iso_8601), the server's warnings reach the log at client_min_messages notice
# (a database's error hid them), and string literals are standard.  And the role it logged in as,
# not a default role a DBA gave it (ALTER ROLE ... SET role), as whom it refused to schedule.
# (session_replication_role, which only a superuser may set, and `status` may run as any role: in
# dispatch.py's SCHEDULER_SETTINGS.)
SESSION_SETTINGS = ("statement_timeout=0", "lock_timeout=0", "idle_in_transaction_session_timeout=0",
                    "idle_session_timeout=0", "default_transaction_read_only=off", "search_path=pg_catalog,pg_temp",
                    "intervalstyle=postgres", "client_min_messages=notice", "standard_conforming_strings=on",
                    "role=none")
# Where sessions of this database get a session_replication_role other than origin by default: the
# table's triggers do not fire in them, and a task author's rows skipped every check (an exclusive
# task, a row inserted DONE, a dependent that did not wait, a cron task run at once).  Meant for a
# restore's own session (PGOPTIONS); as a default, the launcher warns.
REPLICA_DEFAULTS = """
    SELECT string_agg(DISTINCT CASE WHEN s.setrole <> 0 THEN 'ALTER ROLE ' || quote_ident(r.rolname) || ' SET'
                                    WHEN s.setdatabase = 0 THEN 'ALTER DATABASE ... SET, for every database'
                                    ELSE 'ALTER DATABASE ' || quote_ident(current_database()) || ' SET' END, '; ')
      FROM (SELECT setdatabase, setrole, unnest(setconfig) AS setting FROM pg_db_role_setting) AS s
      LEFT JOIN pg_roles AS r ON r.oid = s.setrole
     WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
       AND lower(s.setting) LIKE 'session\\_replication\\_role=%'
       AND lower(s.setting) <> 'session_replication_role=origin'
    UNION ALL
    SELECT 'postgresql.conf' FROM pg_file_settings
     WHERE name = 'session_replication_role' AND applied AND lower(setting) <> 'origin'"""
# libpq's words when target_session_attrs refuses a standby (read-write; primary), and the server's
# when a standby accepts no connections (hot_standby off; not consistent yet) or a server starts.
STANDBY_PHRASES = ("session is read-only", "server is in hot standby mode",
                   "the database system is not accepting connections", "the database system is not yet accepting",
                   "the database system is starting up")
STANDBY_LOG_EVERY = 60.0  # seconds between the lines of a standby's refusals, the same each second
NEEDS_SUPERUSER = "the launcher must connect as a superuser (it drives PL/Python and dblink)"
# Connection errors that retrying cannot fix: wrong password, role or database, a conninfo
# that cannot be read (a bad option value: "connect_timeout=abc", "postgresql://%zz").
# libpq reports connection failures as text only (no SQLSTATE), hence the phrases.
FATAL_SQLSTATES = {"28000", "28P01", "3D000"}
# A role without LOGIN, a pg_hba.conf `reject` line, a service that is not defined, TLS that
# cannot be set up as asked: the same.  (A server whose lc_messages is not English says its own
# words, which no phrase matches: those are retried.)
FATAL_PHRASES = ("does not exist", "authentication failed", "no password supplied",
                 "no pg_hba.conf entry", "invalid connection option", "invalid dsn",
                 "missing \"=\"", "invalid URI", "bad value for", "invalid percent-encoded token",
                 "invalid integer value", "invalid port number",
                 "is not permitted to log in", "pg_hba.conf rejects connection", "definition of service",
                 "service file", "certificate verify failed", "but SSL was required",
                 # (libpq's refusals of the conninfo itself, before any server is asked)
                 "could not match", "could not parse network address", "may not be used with",
                 # (the server's refusals of its `options` or PGOPTIONS, retried forever: a probe)
                 "unrecognized configuration parameter", "invalid value for parameter",
                 "cannot be changed without restarting", "cannot be changed now", "permission denied to set parameter",
                 "invalid command-line argument")
# libpq's words for a keyword's value it does not know (invalid sslmode value: "sometimes").
INVALID_VALUE = re.compile(r'invalid "?[a-z_]+"? value: "')
# The conninfo keywords whose values are secrets: never in the log nor in a metric's label.  Those
# the libpq in use marks so (libpq 18's oauth_client_secret, shown in the clear in every line of
# a database, /health and its labels: a probe), and the SCRAM keys libpq 18 takes in a password's
# place, which it does not mark.
SECRET_KEYWORDS = frozenset(
    {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults() if option.dispchar == b"*"}
    | {"password", "sslpassword", "scram_client_key", "scram_server_key"})


def is_fatal(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt needs the user to act, rather than a retry."""
    if exc.sqlstate in FATAL_SQLSTATES:
        return True
    return any(phrase in str(exc) for phrase in FATAL_PHRASES) or INVALID_VALUE.search(str(exc)) is not None


def database_log(name: str, level: int, message: str, *args: object) -> None:
    """A line about one database: `name: message` in the text log, and its `database` field in
    JSON (a log shipper filters on it; the lines of tasks had it, those of the database did not)."""
    log.log(level, "%s: " + message, name, *args, extra={"fields": {"database": name}})


class SetupError(Exception):
    """The database cannot be scheduled as configured; the message says what to do."""


class ConnectedNames:
    """The databases this launcher's schedulers are connected to, by the name of the server they
    are on: one database given twice, spelled two ways (keywords and a URI), got two schedulers of
    one name, whose metrics overwrote each other (`pg_task_py_running_tasks` read 0 while tasks
    ran, a probe).  The second to connect stops, saying so, unless the first is stopping (a reload
    that changed the database's conninfo, or removed one of the two): then it takes over."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders: dict[str, Scheduler] = {}

    def take(self, name: str, scheduler: Scheduler) -> None:
        """`name` is the scheduler's now, unless another scheduler that is not stopping has it
        (SetupError)."""
        with self.lock:
            holder = self.holders.get(name)
            if holder is not None and holder is not scheduler and not holder.stopping.is_set():
                raise SetupError(f"{name}: scheduled already by another conninfo of this launcher"
                                 f" ({display_name(holder.settings.dsn)}): one scheduler a database;"
                                 " remove one of the two")
            self.release(scheduler)
            self.holders[name] = scheduler

    def hand_back(self, name: str, scheduler: Scheduler) -> bool:
        """`name` is the stopping scheduler's again, unless another that is not stopping has taken it
        (as this one stopped); whether it is."""
        with self.lock:
            holder = self.holders.get(name)
            if holder is not None and holder is not scheduler and not holder.stopping.is_set():
                return False
            self.holders[name] = scheduler
            return True

    def release(self, scheduler: Scheduler) -> None:
        for name in [name for name, holder in self.holders.items() if holder is scheduler]:
            del self.holders[name]


CONNECTED = ConnectedNames()


@dataclass
class Settings:
    """How one launcher runs one database (flags or a config-file entry)."""

    dsn: str
    run: int = 2147483647  # most tasks running at once (pg_task.run)
    grace: float = 30.0  # seconds a graceful stop waits for running tasks
    max_backoff: float = 10.0  # longest pause between reconnection attempts
    standby: str | None = None  # conninfo of a standby for tasks of target 'standby' (--standby)


class StopRequest(threading.Event):
    """A scheduler's stop, and since when it was asked: a graceful stop's --grace counts from then,
    not from the moment the turn loop sees it, up to a turn's wait later (with --grace 1, a stop
    cancelled the running tasks 1.75 s after SIGTERM: a probe)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_at: float | None = None  # (time.monotonic())

    def set(self) -> None:
        if not self.is_set():
            self.asked_at = time.monotonic()
        super().set()

    def clear(self) -> None:
        self.asked_at = None
        super().clear()


class Scheduler:
    """Runs the loop for one database until `stopping` is set."""

    def __init__(self, settings: Settings, stopping: StopRequest, metrics: Metrics | None = None) -> None:
        self.conn: psycopg.Connection | None = None  # the session of the turns, while connected
        self.settings = settings
        self.stopping = stopping
        self.name = display_name(settings.dsn)
        self.metrics = metrics
        self.snapshot_at = 0.0  # time.monotonic() of the next metrics snapshot
        self.snapshot_since: object = None  # the database's now() of the last one
        self.snapshot_refused = ""  # the error of the last snapshot the server refused (said once)
        self.turns: TurnWatch | None = None  # what holds up the turns of the session in use
        self.running = 0  # the tasks its workers ran at its last turn
        self.waits = ConnectionWaits()  # tasks whose sessions found no free connection lately
        self.fallbacks = ToldEvery()  # standby tasks run on the primary, told once a minute a reason
        if metrics:
            metrics.expect(self.name)

    def run(self) -> None:
        """Loop, reconnecting with backoff; raises SetupError for what retrying cannot fix."""
        try:
            self._run()
        finally:
            with CONNECTED.lock:
                CONNECTED.release(self)

    def _run(self) -> None:
        backoff = 0.5
        told: tuple[str, float] | None = None  # a standby's refusal logged last, and when
        while not self.stopping.is_set():
            try:
                # (Each turn of dispatch() gives the session the name workers and recovery look for.)
                conn = connect(self.settings.dsn, "pg_task_py")
            except psycopg.Error as exc:
                if is_fatal(exc):
                    raise SetupError(f"{self.name}: {first_line(exc)}") from None
                reason = first_line(exc)
                if only_standbys(exc):
                    # A promotion may be under way: look again soon, as on a standby that accepts
                    # connections, and say so once a minute, not each second (3,600 lines an hour).
                    backoff = min(backoff, PROMOTION_LOOK_EVERY * 2)
                    if told is None or told[0] != reason or time.monotonic() - told[1] >= STANDBY_LOG_EVERY:
                        database_log(self.name, logging.WARNING,
                                     "cannot connect (%s); trying again each second while it refuses so",
                                     reason)
                        told = (reason, time.monotonic())
                else:
                    database_log(self.name, logging.WARNING, "cannot connect (%s); retrying in %.1fs", reason, backoff)
                if self.metrics:
                    self.metrics.reconnect(self.name)
                backoff = self._pause(backoff)
                continue
            conn.add_notice_handler(self._on_notice)
            self.conn = conn
            try:
                with conn:
                    self._rename(f"{conn.info.dbname}@{conn.info.host}:{conn.info.port}")
                    self._check_role(conn)
                    self._check_extension(conn)
                    if self.settings.standby is not None:
                        # dispatch() hands it to the worker backends it opens (sql/plpython/dispatch.py).
                        conn.execute("SELECT set_config('pgtaskpy.standby', %s, false)", [self.settings.standby])
                    if not self._wait_for_promotion(conn):
                        database_log(self.name, logging.INFO, "stopped")
                        return
                    with (WakeListener(self.settings.dsn, wake_channel(conn), self.name) as wakes,
                          TurnWatch(self.name, lambda: connect(self.settings.dsn, "pg_task_py watch"),
                                    conn.info.backend_pid) as self.turns):
                        database_log(self.name, logging.INFO, "scheduling (active)")
                        backoff = 0.5
                        self.running = 0  # (a new session: none of its workers yet)
                        self._loop(conn, wakes)
                        while not self._drain(conn, wakes):  # (a reload wanted it back while it was stopping)
                            database_log(self.name, logging.INFO, "scheduling again")
                            self._loop(conn, wakes)
                    return
            except psycopg.errors.InsufficientPrivilege as exc:
                # The role lost SUPERUSER (or EXECUTE) while running: retrying cannot fix it.
                raise SetupError(f"{self.name}: {first_line(exc)}: {NEEDS_SUPERUSER}") from None
            except psycopg.Error as exc:
                if self.stopping.is_set() and isinstance(exc, psycopg.errors.QueryCanceled):
                    # (its running tasks were not cancelled, as their rows could not be read: they
                    # run on, and their workers write their ends)
                    left = (f"; the {self.running} task(s) it ran were not cancelled: they go on, and record their"
                            " own end") if self.running else ""
                    database_log(self.name, logging.WARNING, "stopped, its scheduling turn cancelled (%s)%s",
                                 first_line(exc), left)
                    return  # (Databases.left_stuck: a stop that outlasted its grace)
                if self.stopping.is_set():
                    # Not reconnected, as it said it would: the stop went on at once, no task was
                    # cancelled at --grace, and the launcher exited 0 (a probe: its session ended by
                    # a DBA, its database dropped, as it waited for a task).  A stop that failed.
                    # (Its tasks may have ended with the session: a server restart ends them too.)
                    unknown = (f"; the {self.running} task(s) it ran were not cancelled by it: their workers record"
                               " their end, or a launcher's recovery does") if self.running else ""
                    raise SetupError(f"{self.name}: its session was lost while stopping ({first_line(exc)}){unknown}"
                                     ) from None
                what = "connection lost" if conn.broken or isinstance(exc, ListenerLost) else "scheduler error"
                database_log(self.name, logging.WARNING,
                             "%s (%s); reconnecting in %.1fs", what, first_line(exc), backoff)
                if self.metrics:
                    self.metrics.reconnect(self.name)
                backoff = self._pause(backoff)

    def cancel_turn(self) -> None:
        """Cancel the statement of the turn under way, if any (a stop that outlasted its grace
        while the turn waited for a lock); a server that does not answer within 2 s is left."""
        conn = self.conn
        if conn is None or conn.closed:
            return
        try:
            conn.cancel_safe(timeout=2)
        except (psycopg.Error, OSError) as exc:
            database_log(self.name, logging.WARNING, "could not cancel the scheduling turn: %s", first_line(exc))

    def _on_notice(self, notice: psycopg.errors.Diagnostic) -> None:
        """The server's warnings to the launcher's session (a scheduler setting it ignores, said
        once per value: pgtaskpy.warn_ignored_setting) in the launcher's log, not only the server's."""
        if notice.severity_nonlocalized == "WARNING":
            database_log(self.name, logging.WARNING, "%s", notice.message_primary)

    def _rename(self, name: str) -> None:
        try:
            CONNECTED.take(name, self)
        except SetupError:
            if self.metrics:  # (its name before it connected stayed in /health, never turning: 503 for good)
                self.metrics.forget(self.name)
            raise
        if self.metrics and name != self.name:
            self.metrics.rename(self.name, name)
        self.name = name

    def _pause(self, backoff: float) -> float:
        """Wait before the next connection attempt (a stop ends the wait); return the next pause."""
        self.stopping.wait(backoff)
        return min(backoff * 2, self.settings.max_backoff)

    def _check_role(self, conn: psycopg.Connection) -> None:
        """Refuse a role that is not a superuser at once: dispatch() would be denied on every turn."""
        role, superuser = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not superuser:
            raise SetupError(f'{self.name}: role "{role}" is not a superuser: {NEEDS_SUPERUSER}')

    def _check_extension(self, conn: psycopg.Connection) -> None:
        """Refuse a database without the extension; warn when it is older than this launcher."""
        row = conn.execute(
            "SELECT to_regprocedure('pgtaskpy.dispatch(integer, boolean)') IS NOT NULL,"
            " (SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py')"
        ).fetchone()
        if not row or not row[0]:
            raise SetupError(
                f"{self.name}: the pg_task_py extension is not installed in this database; "
                "run CREATE EXTENSION pg_task_py CASCADE; as a superuser (on the primary: it reaches its"
                " standbys by replication), then start the launcher again (or, while it runs for other"
                " databases, send it SIGHUP)"
            )
        if is_older(row[1], __version__):
            database_log(self.name, logging.WARNING,
                         "the pg_task_py extension is version %s, older than this launcher (%s): "
                         "run ALTER EXTENSION pg_task_py UPDATE; in this database",
                         row[1], __version__)
        replica = [where for (where,) in conn.execute(REPLICA_DEFAULTS) if where]
        if replica:
            database_log(self.name, logging.WARNING,
                         "session_replication_role is not origin by default (%s): the triggers of table task"
                         " do not fire in such sessions, and tasks inserted there skip its checks (exclusive,"
                         " states, prerequisites, cron plans); set it for a restore's session only (PGOPTIONS)",
                         "; ".join(replica))

    def _wait_for_promotion(self, conn: psycopg.Connection) -> bool:
        """On a standby, claim and run nothing (dispatch() would only answer "standby", and
        LISTEN is refused there): look every PROMOTION_LOOK_EVERY seconds whether the server
        was promoted.  True once it is a primary, False when stopping first."""
        announced = False
        while not self.stopping.is_set():
            if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                if announced:
                    database_log(self.name, logging.INFO, "promoted: taking over the scheduling")
                return True
            if not announced:
                database_log(self.name, logging.INFO,
                             "a standby (in recovery): running nothing, waiting for a promotion")
                announced = True
            if self.metrics:  # (a look is a standby's turn: /health said 503 on every standby)
                self.metrics.standby_look(self.name)
            self.stopping.wait(PROMOTION_LOOK_EVERY)
        return False

    def _dispatch(self, conn: psycopg.Connection, run_limit: int,
                  cancel: bool = False) -> tuple[float, int]:
        with self.turns.turn():
            events, wake_in, running = conn.execute(
                "SELECT events, wake_in, running FROM pgtaskpy.dispatch(%s, %s)",
                [run_limit, cancel],
            ).fetchone()
        events = events if isinstance(events, list) else json.loads(events)
        self.running = running
        for event in events:
            log_event(self.name, event, self.waits, self.fallbacks)
        if self.metrics:
            self.metrics.turn(self.name, events, running)
            if time.monotonic() >= self.snapshot_at:
                self._snapshot(conn)
        return wake_in, running

    def _snapshot(self, conn: psycopg.Connection) -> None:
        """--metrics: what only the database knows (due tasks by group, start lags, workers, paused
        groups)."""
        self.snapshot_at = time.monotonic() + SNAPSHOT_EVERY
        if conn.execute("SELECT to_regprocedure('pgtaskpy.metrics_snapshot(timestamptz, integer)') IS NULL"
                        ).fetchone()[0]:
            return  # an extension older than 1.3: dispatch()'s figures only
        try:
            snapshot = conn.execute("SELECT pgtaskpy.metrics_snapshot(COALESCE(%s::timestamptz, now()), %s)",
                                    [self.snapshot_since, GROUPS_LABELLED]).fetchone()[0]
        except psycopg.DataError as exc:
            # (a SQL_ASCII database's group or role name that is not UTF-8, which the server will not
            # send to this UTF-8 session: the figures by group are left out, not the database's
            # scheduling, which the error reached and cost a reconnect a second)
            if str(exc) != self.snapshot_refused:
                database_log(self.name, logging.WARNING, "--metrics: no figures by group from this database: %s",
                             first_line(exc))
            self.snapshot_refused = str(exc)
            self.metrics.snapshot_refused(self.name)
            return
        self.snapshot_since = snapshot["at"]
        self.metrics.snapshot(self.name, [tuple(group) for group in snapshot["groups"]], snapshot["lags"],
                              snapshot["workers"], [tuple(group) for group in snapshot["paused"]],
                              snapshot["due_groups"], snapshot["paused_groups"])

    def _loop(self, conn: psycopg.Connection, wakes: WakeListener) -> None:
        while not self.stopping.is_set():
            wake_in, _ = self._dispatch(conn, self.settings.run)
            # (a grace of a second or more counts from the stop's signal all the same: StopRequest)
            wakes.wait(wake_in, until=self.stopping if self.settings.grace < wake_in else None)

    def _drain(self, conn: psycopg.Connection, wakes: WakeListener) -> bool:
        """Graceful stop: claim nothing more, let running tasks end, then cancel the rest; True
        once stopped, False when `stopping` was cleared first (a reload took the database back:
        its tasks run on, not cancelled).

        The announcement of the cancel comes before the turn that cancels, so that the
        lines of the cancelled tasks follow it; the wait is said every WAITING_LOG_EVERY."""
        deadline = (self.stopping.asked_at or time.monotonic()) + self.settings.grace
        cancelled = False
        logged_at = float("-inf")
        _, running = self._dispatch(conn, 0)
        while running:
            if not self.stopping.is_set():
                return False
            now = time.monotonic()
            # Each turn past the deadline cancels (dispatch.py: cancel_running_tasks): a task whose
            # start was under way at the first cancel ran on after the launcher had stopped.
            cancel = now >= deadline
            if cancel and not cancelled:
                database_log(self.name, logging.WARNING, "grace period over, cancelling %d running task(s)", running)
            elif cancelled and now >= deadline + 5:
                database_log(self.name, logging.WARNING, "%d task(s) still running; they record their own end", running)
                break
            elif now - logged_at >= WAITING_LOG_EVERY:
                database_log(self.name, logging.INFO, "stopping, waiting for %d running task(s)", running)
                logged_at = now
            wakes.wait(0.5 if cancelled else min(0.5, deadline - now))  # no wait when cancelling
            _, running = self._dispatch(conn, 0, cancel=cancel)
            cancelled = cancelled or cancel
        if not self.stopping.is_set():
            return False
        database_log(self.name, logging.INFO, "stopped")
        return True


class ListenerLost(psycopg.OperationalError):
    """The connection of the listening session broke (the server restarted, say)."""


class WakeListener:
    """A session of its own that LISTENs on the wake channel, and a wait for its NOTIFYs.

    Not the session of the turns: a backend sends its client every notification
    that arrived during a query before the query's end, and libpq keeps them all
    until the result is read; any role may NOTIFY the channel, and a flood of
    8 kB payloads grew a launcher by gigabytes.  This session runs no query after
    its LISTEN: its notifications are read one by one as they come and dropped,
    and while a turn runs they wait in the socket (its backend waits to send).
    """

    def __init__(self, dsn: str, channel: str, name: str) -> None:
        self.dsn = dsn
        self.channel = channel
        self.name = name  # the database's, for the log
        self._listen()

    def _listen(self) -> None:
        """A new listening session.  (It idles between wakes: a database's or role's
        idle_session_timeout is for its clients.)"""
        conn = connect(self.dsn, "pg_task_py listener")
        try:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.pgconn = conn.pgconn
        self.poll = select.poll()
        self.poll.register(self.pgconn.socket, select.POLLIN)

    def __enter__(self) -> WakeListener:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.conn.close()

    def _listen_again(self, lost: psycopg.OperationalError) -> None:
        """Listen in a new session when this one broke alone (a DBA's reaper of idle sessions,
        a firewall that drops idle connections): the turns' session and its workers go on.
        Reconnecting them too lost the running tasks' count (`--run` passed, a stop that did
        not cancel them).  ListenerLost when that fails too (the server restarted, say)."""
        self.conn.close()
        try:
            self._listen()
        except psycopg.Error as exc:
            raise ListenerLost(f"{first_line(lost)}; listening again: {first_line(exc)}") from None
        database_log(self.name, logging.WARNING,
                     "the listening session was lost (%s); listening in a new one", first_line(lost))

    def wait(self, timeout: float, until: threading.Event | None = None) -> None:
        """Sleep until a wake arrives, `timeout` seconds pass or `until` is set (looked at every
        STOP_LOOK_EVERY: a stop's --grace under a second began after the turn's wait); one that
        arrived during the turn ends it at once.  Those that arrived with it are read too: the
        next turn serves them all."""
        deadline = time.monotonic() + timeout
        while not self._read_arrived():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (until is not None and until.is_set()):
                return
            self.poll.poll(min(remaining, STOP_LOOK_EVERY if until is not None else remaining) * 1000)

    def _read_arrived(self) -> bool:
        """Whether notifications had arrived: all those in the socket now, read without blocking,
        for up to DRAIN_MOST seconds (a flood that goes on must not hold up the turns).  One
        read a turn left a flood of 7 kB payloads 30 s behind, in the server's queue of
        notifications, which is the whole cluster's: full, it fails every NOTIFY (a probe)."""
        woken = False
        deadline = time.monotonic() + DRAIN_MOST
        while True:
            try:
                self.pgconn.consume_input()
            except psycopg.OperationalError as exc:
                self._listen_again(exc)
                return True  # (wakes sent while it was away are lost: a turn looks now)
            while self.pgconn.notifies() is not None:
                woken = True
            if time.monotonic() >= deadline or not self.poll.poll(0):
                return woken


def connect(dsn: str, application_name: str) -> psycopg.Connection:
    """A session of the launcher's, with SESSION_SETTINGS after the conninfo's own options (or
    PGOPTIONS', which an `options` given here would replace).  In UTF-8 whatever the database's
    encoding: in a SQL_ASCII database psycopg reads text in no encoding, as bytes."""
    options = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or os.environ.get("PGOPTIONS", "")
    ours = " ".join(f"-c {setting}" for setting in SESSION_SETTINGS)
    return psycopg.connect(dsn, autocommit=True, fallback_application_name=application_name,
                           options=f"{options} {ours}".strip(), client_encoding="UTF8")


def wake_channel(conn: psycopg.Connection) -> str:
    """The NOTIFY channel the database wakes launchers on, as the extension names it."""
    if conn.execute("SELECT to_regprocedure('pgtaskpy.name_of(text)') IS NULL").fetchone()[0]:
        return LEGACY_CHANNEL
    return conn.execute("SELECT pgtaskpy.name_of('channel')").fetchone()[0]


def only_standbys(exc: psycopg.Error) -> bool:
    """Whether a failed attempt reached a server, but one that target_session_attrs refuses as a
    standby (libpq's words for read-write and primary), or a standby that accepts no connections
    (hot_standby off), or one starting: no primary yet, during a failover.  A backoff up to 10 s
    put off the takeover after a promotion as long."""
    return any(phrase in str(exc) for phrase in STANDBY_PHRASES)


def display_name(dsn: str) -> str:
    """How logs name a database before the launcher has connected: its conninfo without its secrets."""
    if not dsn:
        return "(libpq environment)"
    try:
        keywords = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(a conninfo that cannot be parsed)"
    for secret in SECRET_KEYWORDS:
        keywords.pop(secret, None)
    dbname = str(keywords.get("dbname", ""))
    if "=" in dbname or "://" in dbname:  # (a conninfo as the dbname, its password in it: not shown)
        keywords["dbname"] = "(a conninfo)"
    return psycopg.conninfo.make_conninfo(**keywords)


def ascii_digits(text: str) -> bool:
    """Whether `text` is one or more of 0-9: str.isdigit() also takes '²', which int() refuses,
    and '١', which int() reads as 1 but libpq refuses."""
    return text.isascii() and text.isdigit()


def version_tuple(text: str) -> tuple[int, ...] | None:
    """(1, 3) for '1.3'; None for a version that is not dotted numbers (nothing to compare)."""
    parts = text.split(".")
    return tuple(int(part) for part in parts) if all(ascii_digits(part) for part in parts) else None


def is_older(extension: str | None, launcher: str) -> bool:
    """Whether the installed extension is older than the launcher's major.minor (1.2 < 1.3.0)."""
    installed = version_tuple(extension or "")
    wanted = version_tuple(launcher)
    return installed is not None and wanted is not None and installed < wanted[:2]


def log_event(database: str, event: dict, waits: ConnectionWaits | None = None,
              fallbacks: ToldEvery | None = None) -> None:
    """One readable line per event from dispatch(); with --log-json its fields go along as they are.
    `waits`: the database's tasks waiting for a free connection, whose tries go to DEBUG;
    `fallbacks`: its standby tasks run on the primary, told at WARNING once a minute a reason."""
    try:
        level, text = describe(event)
        if waits is not None:
            level, text = waits_told(waits, event, level, text)
        if fallbacks is not None and event.get("event") == "standby_fallback":
            level, text = fallbacks.told(str(event.get("why")), text)
    except (KeyError, TypeError, ValueError):  # an event shaped otherwise (another version's): show it all
        level, text = logging.INFO, describe_other(event)
    log.log(level, "%s: %s", database, text, extra={"fields": {"database": database, **event}})


def waits_told(waits: ConnectionWaits, event: dict, level: int, text: str) -> tuple[int, str]:
    """The line of an event of a task that may wait for a free connection (connection_waits.py)."""
    kind = event.get("event")
    if kind == "postponed":
        return waits.refused(event["id"], postponed_reason(event))
    if kind == "start":
        return waits.handed_out(event["id"]), text
    if kind == "end":
        waits.ended(event["id"])
    return level, text


def postponed_reason(event: dict) -> str:
    """Why a task's session did not open and the task waits (a `postponed` event)."""
    if event.get("server_down"):
        return "its session's server is starting up or shutting down"
    return "no free connection for its session"


def describe(event: dict) -> tuple[int, str]:
    """The level and text of an event's log line."""
    kind = event.get("event")
    if kind == "start":
        return logging.INFO, f"task {event['id']} started"
    if kind == "end":  # (a failure at WARNING: --log-level WARNING shows failures, not every start)
        return logging.WARNING if event.get("state") == "FAIL" else logging.INFO, describe_end(event)
    if kind == "cancel":
        if event.get("cancelled"):
            return logging.WARNING, f"task {event['id']} cancelled (grace period over)"
        return logging.WARNING, f"could not cancel task {event['id']}"
    if kind == "start_failed":
        return logging.WARNING, f"task {event['id']} waits: no worker backend ({event['message']})"
    if kind == "worker_error":  # (the error's first line: the rest is PL/Python's CONTEXT)
        error = str(event.get("message") or "").strip().split("\n", 1)[0]
        if event.get("failed"):
            return logging.ERROR, f"task {event['id']} FAIL: its worker failed: {error}"
        return logging.WARNING, (f"task {event['id']}: its worker failed ({error}); the task waits again if it had"
                                 " not started, else it ends FAIL once its session has ended")
    if kind == "unended":
        return logging.ERROR, (f"could not end task {event['id']}: {event['message']}; its worker closes, and"
                               " the task ends FAIL as a lost run once that end may be written")
    if kind == "claim_error":
        return logging.ERROR, f"a worker could not claim its group's next task: {event['message']}"
    if kind == "postponed":
        return logging.WARNING, f"task {event['id']} waits: {postponed_reason(event)}"
    if kind == "standby_fallback":
        return logging.WARNING, (f"task {event['id']} of target standby runs on the primary, read-only:"
                                 f" {event['reason']}")
    if kind == "spare_failed":
        return logging.ERROR, f"cannot open a worker backend: {event['message']}"
    if kind == "spare_lost":  # (its first line, as of worker_error)
        error = str(event.get("message") or "").strip().split("\n", 1)[0]
        return logging.WARNING, f"an idle worker backend failed ({error}); another is opened when needed"
    if kind == "extension_recreated":
        return logging.WARNING, (f"the extension was dropped and created again: closed {event['workers']} worker(s)"
                                 " of the dropped one's tasks (their ends went with its table)")
    if kind == "standby":
        return logging.INFO, "a standby (in recovery): running nothing"
    if kind == "subscribed":
        return logging.WARNING, (f'the subscription "{event["subscription"]}" copies the task table into this'
                                 " database (logical replication): running nothing here, where the publisher's"
                                 " launcher runs its tasks; disable or drop the subscription to run them here")
    if kind == "unsubscribed":
        return logging.INFO, (f'the subscription "{event["subscription"]}" no longer copies the task table:'
                              " scheduling here")
    if kind == "ids_advanced":
        return logging.WARNING, (f"task_id_seq was behind the table's ids (rows copied by logical replication,"
                                 f" or inserted with ids of their own): moved past {event['id']}")
    if kind == "unclaimed":
        return logging.INFO, f"took back {event['count']} claimed task(s) that no worker started: they wait again"
    if kind == "recovered":
        return logging.WARNING, f"recovered {event['count']} task(s) of dead backends"
    if kind == "deleted_old":
        # (delete_old_tasks returns one count for all its reasons: the line cannot tell which applied)
        return logging.INFO, (f"deleted {event['count']} finished task(s) past their retention"
                              " (pg_task_py.retention*, keep_runs)")
    if kind == "retention_kept":
        return logging.WARNING, (f"kept {event['count']} finished task(s) past pg_task_py.retention or keep_runs: other"
                                 " tables reference them by a foreign key without ON DELETE CASCADE or SET NULL,"
                                 " a trigger refuses their DELETE, or a transaction holds a row it would change")
    if kind == "retention_blocked":
        return logging.WARNING, (f"finished tasks past pg_task_py.retention or keep_runs are kept: {event['message']}"
                                 " (a table references them by a foreign key without ON DELETE CASCADE or SET NULL)")
    if kind == "expired":
        return logging.INFO, f"{event['count']} task(s) not started within active: GONE"
    if kind == "misconfigured":
        return logging.WARNING, (f"{event['count']} task(s) FAIL: their owner's pg_task_py.role_running_limit"
                                 " is not a whole number (see their error)")
    return logging.INFO, describe_other(event)


def describe_end(event: dict) -> str:
    """`task 42 FAIL in 0.012s (22012): ERROR:  division by zero` (the error's first line, when
    sent); for a task with retries, whether and when it runs again:
    `task 42 FAIL in 0.010s (40001), retry 2 of 5 at 12:00:03: ERROR:  ...`."""
    seconds = event.get("seconds")
    took = f" in {seconds:.3f}s" if seconds is not None else ""
    code = f" ({event['sqlstate']})" if event.get("sqlstate") else ""
    error = str(event.get("error") or "").strip()
    reason = f": {error.splitlines()[0]}" if error else ""
    return f"task {event['id']} {event['state']}{took}{code}{describe_retry(event)}{reason}"


def describe_retry(event: dict) -> str:
    """`, retry 2 of 5 at 12:00:03` (the launcher's local time; its date too when not today's:
    a retry two days on read as a time passed), `, no retry` when a task with retries is not
    tried again, or nothing for a task without retries."""
    if "retry" not in event:
        return ""
    if event["retry"] is None:
        return ", no retry"
    at = datetime.datetime.fromisoformat(event["retry_at"]).astimezone()
    when = f"{at:%H:%M:%S}" if at.date() == datetime.datetime.now().astimezone().date() else f"{at:%Y-%m-%d %H:%M:%S}"
    return f", retry {event['retry']} of {event['retries']} at {when}"


def describe_other(event: dict) -> str:
    """`kind: key=value ...` for an event this launcher has no line for (a newer extension's)."""
    fields = " ".join(f"{key}={plain(value)}" for key, value in event.items() if key != "event")
    return f"{event.get('event', 'event')}: {fields}".rstrip()


def plain(value: object) -> str:
    """A value as a log line shows it: a string bare unless spaces or quotes make it ambiguous."""
    if not isinstance(value, str):
        return json.dumps(value, default=str, separators=(",", ":"))  # 42, true, null
    return value if value and not any(c.isspace() or c in '"=' for c in value) else json.dumps(value)
