"""The scheduler loop for one database: call pgtaskpy.dispatch(), then sleep
until a NOTIFY or the time it asked for.  Every scheduling rule lives in the
database; this module only connects, waits, logs and stops cleanly."""

from __future__ import annotations

import json
import logging
import select
import threading
import time
from dataclasses import dataclass

import psycopg

log = logging.getLogger("pg_task_py")

CHANNEL = "pg_task_py"
# Connection errors that retrying cannot fix: wrong password, role or database.
# libpq reports connection failures as text only (no SQLSTATE), hence the phrases.
FATAL_SQLSTATES = {"28000", "28P01", "3D000"}
FATAL_PHRASES = ("does not exist", "authentication failed", "no password supplied",
                 "no pg_hba.conf entry", "invalid connection option", "invalid dsn",
                 "missing \"=\"", "invalid URI")


def is_fatal(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt needs the user to act, rather than a retry."""
    if exc.sqlstate in FATAL_SQLSTATES:
        return True
    return any(phrase in str(exc) for phrase in FATAL_PHRASES)


class SetupError(Exception):
    """The database cannot be scheduled as configured; the message says what to do."""


@dataclass
class Settings:
    """How one launcher runs one database (flags or a config-file entry)."""

    dsn: str
    run: int = 2147483647  # most tasks running at once (pg_task.run)
    grace: float = 30.0  # seconds a graceful stop waits for running tasks
    max_backoff: float = 10.0  # longest pause between reconnection attempts


class Scheduler:
    """Runs the loop for one database until `stopping` is set."""

    def __init__(self, settings: Settings, stopping: threading.Event) -> None:
        self.settings = settings
        self.stopping = stopping
        self.name = settings.dsn or "(libpq environment)"

    def run(self) -> None:
        """Loop, reconnecting with backoff; raises SetupError for what retrying cannot fix."""
        backoff = 0.5
        while not self.stopping.is_set():
            try:
                conn = psycopg.connect(self.settings.dsn, autocommit=True,
                                       application_name="pg_task_py launcher")
            except psycopg.Error as exc:
                if is_fatal(exc):
                    raise SetupError(f"{self.name}: {first_line(exc)}") from None
                log.warning("%s: cannot connect (%s); retrying in %.1fs", self.name, first_line(exc), backoff)
                backoff = self._pause(backoff)
                continue
            try:
                with conn:
                    self.name = f"{conn.info.dbname}@{conn.info.host}:{conn.info.port}"
                    self._check_extension(conn)
                    waiter = NotifyWaiter(conn)
                    conn.execute(f"LISTEN {CHANNEL}")
                    log.info("%s: scheduling (active)", self.name)
                    backoff = 0.5
                    self._loop(conn, waiter)
                    self._drain(conn, waiter)
                    return
            except psycopg.Error as exc:
                what = "connection lost" if conn.broken else "scheduler error"
                log.warning("%s: %s (%s); reconnecting in %.1fs", self.name, what, first_line(exc), backoff)
                backoff = self._pause(backoff)

    def _pause(self, backoff: float) -> float:
        """Wait before the next connection attempt (a stop ends the wait); return the next pause."""
        self.stopping.wait(backoff)
        return min(backoff * 2, self.settings.max_backoff)

    def _check_extension(self, conn: psycopg.Connection) -> None:
        row = conn.execute(
            "SELECT to_regprocedure('pgtaskpy.dispatch(integer, boolean)') IS NOT NULL"
        ).fetchone()
        if not row or not row[0]:
            raise SetupError(
                f"{self.name}: the pg_task_py extension is not installed in this database; "
                "run CREATE EXTENSION pg_task_py CASCADE; as a superuser, then start the launcher again"
            )

    def _dispatch(self, conn: psycopg.Connection, run_limit: int,
                  cancel: bool = False) -> tuple[float, int]:
        events, wake_in, running = conn.execute(
            "SELECT events, wake_in, running FROM pgtaskpy.dispatch(%s, %s)",
            [run_limit, cancel],
        ).fetchone()
        for event in events if isinstance(events, list) else json.loads(events):
            log_event(self.name, event)
        return wake_in, running

    def _loop(self, conn: psycopg.Connection, waiter: NotifyWaiter) -> None:
        while not self.stopping.is_set():
            wake_in, _ = self._dispatch(conn, self.settings.run)
            waiter.wait(wake_in)

    def _drain(self, conn: psycopg.Connection, waiter: NotifyWaiter) -> None:
        """Graceful stop: claim nothing more, let running tasks end, then cancel the rest."""
        deadline = time.monotonic() + self.settings.grace
        cancelled = False
        while True:
            past_grace = time.monotonic() >= deadline
            _, running = self._dispatch(conn, 0, cancel=past_grace and not cancelled)
            if not running:
                break
            if past_grace:
                if cancelled and time.monotonic() >= deadline + 5:
                    log.warning("%s: %d task(s) still running; they record their own end", self.name, running)
                    break
                if not cancelled:
                    log.warning("%s: grace period over, cancelling %d running task(s)", self.name, running)
                cancelled = True
            log.info("%s: stopping, waiting for %d running task(s)", self.name, running)
            waiter.wait(0.5)
        log.info("%s: stopped", self.name)


class NotifyWaiter:
    """Sleeps until a notification on CHANNEL arrives or a timeout passes.

    Notifications that arrive while a query runs are taken by psycopg and
    handed to notify handlers, so a handler remembers them; between queries
    the socket is watched directly.
    """

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.pending = False
        conn.add_notify_handler(self._on_notify)

    def _on_notify(self, _notify: psycopg.Notify) -> None:
        self.pending = True

    def _drain(self) -> bool:
        got = False
        while self.conn.pgconn.notifies() is not None:
            got = True
        return got

    def wait(self, timeout: float) -> None:
        if self.pending or self._drain() or timeout <= 0:
            self.pending = False
            return
        try:
            ready, _, _ = select.select([self.conn.pgconn.socket], [], [], timeout)
        except (OSError, ValueError) as exc:  # the socket is gone (-1 or closed)
            raise psycopg.OperationalError(f"connection lost: {exc}") from None
        if ready:
            self.conn.pgconn.consume_input()  # raises if the connection broke
            self._drain()


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def log_event(database: str, event: dict) -> None:
    kind = event.get("event")
    extra = {"database": database, **event}
    if kind == "start":
        log.info("%s: task %s started", database, event["id"], extra={"fields": extra})
    elif kind == "end":
        seconds = event.get("seconds")
        took = f" in {seconds:.3f}s" if seconds is not None else ""
        log.info("%s: task %s %s%s", database, event["id"], event["state"], took, extra={"fields": extra})
    elif kind == "start_failed":
        log.warning("%s: task %s waits: no worker backend (%s)", database, event["id"], event["message"],
                    extra={"fields": extra})
    elif kind == "worker_error":
        log.error("%s: task %s: %s", database, event["id"], event["message"], extra={"fields": extra})
    elif kind == "postponed":
        log.warning("%s: task %s waits: no free connection for its session", database, event["id"],
                    extra={"fields": extra})
    elif kind == "spare_failed":
        log.error("%s: cannot open a worker backend: %s", database, event["message"], extra={"fields": extra})
    elif kind == "recovered":
        log.warning("%s: recovered %s task(s) of dead backends", database, event["count"], extra={"fields": extra})
    elif kind == "deleted_old":
        log.info("%s: deleted %s finished task(s) past pg_task_py.retention", database, event["count"],
                 extra={"fields": extra})
    elif kind == "expired":
        log.info("%s: %s task(s) not started within active: GONE", database, event["count"], extra={"fields": extra})
    else:
        log.info("%s: %s", database, json.dumps(event), extra={"fields": extra})
