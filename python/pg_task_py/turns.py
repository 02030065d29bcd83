"""Say in the launcher's log what holds a scheduling turn up.

A turn is one statement in the launcher's session; when another session locks what it needs
(`LOCK TABLE task` by a DBA or a task author, a role holding a named series' advisory key: README, Limits),
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

from pg_task_py.text import first_line

log = logging.getLogger("pg_task_py")

SLOW_TURN = 5.0  # seconds a turn runs before the watcher looks for what blocks it
REPORT_EVERY = 30.0  # seconds between reports while the same turn waits
LOOK_EVERY = 1.0  # seconds between the watcher's looks at the clock
# The sessions pg_blocking_pids names for the launcher's backend: those that hold the lock it
# waits for, and those queued ahead of it for that lock (a worker that waits too, which ending
# would not help: `holds` tells them apart).  For a holder that waits for a lock itself, the first
# session that holds that one (`root_*`): a worker ending a task waited for a client's row lock,
# and the line named the worker, whose end would have lost a finished task's run (a probe).
BLOCKERS = """
WITH waits AS (  -- (holder, waiter): a lock the holder has that the waiter asks for
    SELECT DISTINCT h.pid AS holder, w.pid AS waiter
    FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_locks AS h
      ON (h.locktype, h.database, h.relation, h.page, h.tuple, h.virtualxid, h.transactionid, h.classid, h.objid,
          h.objsubid)
         IS NOT DISTINCT FROM (w.locktype, w.database, w.relation, w.page, w.tuple, w.virtualxid, w.transactionid,
                               w.classid, w.objid, w.objsubid)
    WHERE NOT w.granted AND h.granted AND h.pid <> w.pid
      AND (w.pid = %(pid)s OR w.pid = ANY (pg_catalog.pg_blocking_pids(%(pid)s))))
SELECT b.pid, b.usename, b.application_name, b.state, b.wait_event_type, b.wait_event,
       extract(epoch FROM now() - coalesce(b.xact_start, b.backend_start))::integer AS seconds,
       left(regexp_replace(b.query, '[[:space:]]+', ' ', 'g'), 120) AS query,
       EXISTS (SELECT FROM waits WHERE holder = b.pid AND waiter = %(pid)s) AS holds,
       r.pid AS root_pid, r.usename AS root_role, r.application_name AS root_application, r.state AS root_state,
       extract(epoch FROM now() - coalesce(r.xact_start, r.backend_start))::integer AS root_seconds,
       left(regexp_replace(r.query, '[[:space:]]+', ' ', 'g'), 120) AS root_query
FROM pg_catalog.pg_stat_activity AS b
LEFT JOIN LATERAL (SELECT * FROM pg_catalog.pg_stat_activity AS r
                   WHERE b.wait_event_type = 'Lock' AND r.pid = ANY (pg_catalog.pg_blocking_pids(b.pid))
                   -- (the one that holds the lock: pg_blocking_pids names those queued ahead too, a review)
                   ORDER BY EXISTS (SELECT FROM waits WHERE holder = r.pid AND waiter = b.pid) DESC, r.pid
                   LIMIT 1) AS r ON true
WHERE b.pid = ANY (pg_catalog.pg_blocking_pids(%(pid)s))
ORDER BY holds DESC, b.pid
"""
SYNC_REP = ("IPC", "SyncRep")  # the wait event of a commit waiting for a synchronous standby
# What the launcher's backend waits on when no session blocks it.
WAIT = "SELECT wait_event_type, wait_event FROM pg_catalog.pg_stat_activity WHERE pid = %(pid)s"


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
        failed = None
        try:
            yield
        except BaseException as exc:
            failed = exc
            raise
        finally:
            started, reported, self.started = self.started, self.reported_at, None
            if reported is not None:
                went = time.monotonic() - started
                if failed is None:
                    log.info("%s: the scheduling turn went on after %.0fs", self.name, went, extra={
                        "fields": {"database": self.name, "event": "turn_went_on", "seconds": round(went)}})
                else:  # (cancelled by a stop that outlasted its grace, say: it did not go on)
                    log.info("%s: the scheduling turn ended after %.0fs without finishing (%s)", self.name, went,
                             first_line(failed), extra={
                                 "fields": {"database": self.name, "event": "turn_ended", "seconds": round(went)}})

    def _watch(self) -> None:
        while not self.ended.wait(LOOK_EVERY):
            started, now = self.started, time.monotonic()
            if started is None or now - started < SLOW_TURN:
                continue
            if self.reported_at is None or now - self.reported_at >= REPORT_EVERY:
                self.reported_at = now
                self._report(now - started)

    def _report(self, waited: float) -> None:
        fields = {"database": self.name, "event": "turn_waits", "seconds": round(waited)}
        try:
            with self.connect() as conn:
                blockers = conn.execute(BLOCKERS, {"pid": self.backend_pid}).fetchall()
                wait = None if blockers else conn.execute(WAIT, {"pid": self.backend_pid}).fetchone()
        except psycopg.Error as exc:
            log.warning("%s: the scheduling turn has run for %.0fs (what holds it up could not be read: %s)",
                        self.name, waited, str(exc).strip().splitlines()[0], extra={"fields": fields})
            return
        if not blockers:
            event = ":".join(wait) if wait and all(wait) else None
            log.warning("%s: the scheduling turn has run for %.0fs (no session blocks it%s)", self.name, waited,
                        waits_on(wait), extra={"fields": {**fields, "wait_event": event}})
            return
        for pid, role, application, state, wait_type, wait_name, seconds, query, holds, *root in blockers:
            about = {**fields, "backend": pid, "holds": holds, "role": role, "application": application,
                     "state": state, "query": query}
            if holds and root[0] is not None:
                root_pid, root_role, root_application, root_state, root_seconds, root_query = root
                about["waits_for"] = {"backend": root_pid, "role": root_role, "application": root_application,
                                      "state": root_state, "seconds": root_seconds, "query": root_query}
                log.warning('%s: the scheduling turn has waited %.0fs for a lock held by backend %s (role "%s",'
                            ' application "%s": %s), which waits for a lock held by backend %s (role "%s",'
                            ' application "%s", %s for %ss: %s); nothing starts until that one lets go',
                            self.name, waited, pid, role, application, query, root_pid, root_role,
                            root_application, root_state, root_seconds, root_query, extra={"fields": about})
            elif holds:
                log.warning('%s: the scheduling turn has waited %.0fs for a lock held by backend %s (role "%s",'
                            ' application "%s", %s for %ss: %s%s); nothing starts until it lets go',
                            self.name, waited, pid, role, application, state, seconds, query,
                            holder_waits((wait_type, wait_name)), extra={"fields": about})
            else:  # (ending it would not help: it waits for the same holder)
                log.warning('%s: the scheduling turn has waited %.0fs behind backend %s (role "%s", application'
                            ' "%s": %s), which waits for the same lock', self.name, waited, pid, role,
                            application, query, extra={"fields": about})


def holder_waits(wait: tuple[str | None, str | None]) -> str:
    """What a lock's holder itself waits for, when ending it would not be the cure: a commit
    waiting for a synchronous standby held the turn, and the line named the client or launcher
    that committed (a probe, while a standby was being rejoined).  Other waits are the lock's, told
    apart already."""
    return waits_on(wait) if wait == SYNC_REP else ""


def waits_on(wait: tuple[str | None, str | None] | None) -> str:
    """What the launcher's backend waits on, for the report of a turn no session blocks.  A commit
    waiting for a synchronous standby that does not answer (a promoted server keeps the
    synchronous_standby_names of the primary it was copied from) was told as nothing at all."""
    if not wait or not all(wait):
        return ""
    if wait == SYNC_REP:
        return ("; its commit waits for a synchronous standby (IPC:SyncRep): none that"
                " synchronous_standby_names names has confirmed it")
    return f"; its backend waits on {wait[0]}:{wait[1]}"
