"""Say in the launcher's log what holds a scheduling turn up.

A turn is one statement in the launcher's session; when another session locks what it needs
(a DBA's `LOCK TABLE task`, a role's `pg_advisory_lock` of the scheduler's key: README, Limits),
the turn waits, and nothing in the log said why: task lines just stopped.  A watcher thread
notices a turn that lasts past SLOW_TURN seconds and logs the sessions that block the launcher's
backend (`pg_blocking_pids`), read from a session of its own, and again every REPORT_EVERY
seconds while the turn waits; the turn's end after such a report is logged too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

log = logging.getLogger("pg_task_py")

SLOW_TURN = 5.0  # seconds a turn runs before the watcher looks for what blocks it
REPORT_EVERY = 30.0  # seconds between reports while the same turn waits
LOOK_EVERY = 1.0  # seconds between the watcher's looks at the clock
BLOCKERS = (
    "SELECT b.pid, b.usename, b.application_name, b.state,"
    " extract(epoch FROM now() - coalesce(b.xact_start, b.backend_start))::integer,"
    " left(regexp_replace(b.query, '\\s+', ' ', 'g'), 120)"
    " FROM pg_catalog.pg_stat_activity AS b WHERE b.pid = ANY (pg_catalog.pg_blocking_pids(%s)) ORDER BY b.pid"
)


class TurnWatch:
    """Watches the turns of one launcher session (`backend_pid`, on the server of `connect()`)."""

    def __init__(self, name: str, connect: Callable[[], psycopg.Connection], backend_pid: int) -> None:
        self.name = name
        self.connect = connect
        self.backend_pid = backend_pid
        self.started: float | None = None  # time.monotonic() of the running turn's start
        self.reported_at: float | None = None  # of the last report on the running turn
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._watch, name=f"turns of {name}", daemon=True)

    def __enter__(self) -> TurnWatch:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.ended.set()
        # (not for ever: a report's connection attempt may hang on a lost network, and the
        # launcher must reconnect or stop meanwhile; the thread is a daemon, and ends with it)
        self.thread.join(2 * LOOK_EVERY)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Around one turn's statement."""
        self.reported_at, self.started = None, time.monotonic()
        try:
            yield
        finally:
            started, reported, self.started = self.started, self.reported_at, None
            if reported is not None:
                log.info("%s: the scheduling turn went on after %.0fs", self.name, time.monotonic() - started)

    def _watch(self) -> None:
        while not self.ended.wait(LOOK_EVERY):
            started, now = self.started, time.monotonic()
            if started is None or now - started < SLOW_TURN:
                continue
            if self.reported_at is None or now - self.reported_at >= REPORT_EVERY:
                self.reported_at = now
                self._report(now - started)

    def _report(self, waited: float) -> None:
        try:
            with self.connect() as conn:
                blockers = conn.execute(BLOCKERS, [self.backend_pid]).fetchall()
        except psycopg.Error as exc:
            log.warning("%s: the scheduling turn has run for %.0fs (what holds it up could not be read: %s)",
                        self.name, waited, str(exc).strip().splitlines()[0])
            return
        if not blockers:
            log.warning("%s: the scheduling turn has run for %.0fs (no session blocks it)", self.name, waited)
            return
        for pid, role, application, state, seconds, query in blockers:
            log.warning('%s: the scheduling turn has waited %.0fs for a lock held by backend %s (role "%s",'
                        ' application "%s", %s for %ss: %s); nothing starts until it lets go',
                        self.name, waited, pid, role, application, state, seconds, query)
