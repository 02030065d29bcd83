"""Tell a task's wait for a free connection once, not at every try; and the same of other lines
that may come at every task (ToldEvery).

A task whose session the server refuses for lack of connections (its role or database at its
CONNECTION LIMIT, the server full, a remote refusing) waits again and is handed out once a
second until a session opens.  Each try logged two lines ("task N started", "task N waits: no
free connection for its session"): a hundred such tasks wrote two hundred lines a second for as
long as the refusal lasted.  The first refusal of a task is told at WARNING, and then once every
TELL_EVERY seconds while it goes on waiting; the tries between go to DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

TELL_EVERY = 60.0  # seconds between the WARNING lines of one task that goes on waiting
# Seconds after a task's last refusal that it no longer counts as waiting (it started, ended, went
# GONE or was deleted): it is tried once a second while it waits, so a wait this long is over.
FORGET_AFTER = 10.0


class ConnectionWaits:
    """The tasks of one database whose sessions found no free connection lately."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.first: dict[int, float] = {}  # task id: its first refusal of this wait
        self.told: dict[int, float] = {}  # task id: its last refusal at WARNING
        self.last: dict[int, float] = {}  # task id: its last refusal
        self.swept = clock()  # when the ended waits were last forgotten

    def refused(self, task_id: int, reason: str = "no free connection for its session") -> tuple[int, str]:
        """The level and text of the line of the task's refusal, now (`reason`: why it waits)."""
        now = self.clock()
        self._forget_ended(now)
        first = self.first.setdefault(task_id, now)
        self.last[task_id] = now
        text = f"task {task_id} waits: {reason}"
        if task_id not in self.told:
            self.told[task_id] = now
            return logging.WARNING, text
        if now - self.told[task_id] >= TELL_EVERY:
            self.told[task_id] = now
            return logging.WARNING, f"{text} (for {now - first:.0f}s)"
        return logging.DEBUG, text

    def handed_out(self, task_id: int) -> int:
        """The level of the line of a task's start: DEBUG for another try of a waiting one."""
        self._forget_ended(self.clock())
        return logging.DEBUG if task_id in self.last else logging.INFO

    def ended(self, task_id: int) -> None:
        for kept in (self.first, self.told, self.last):
            kept.pop(task_id, None)

    def _forget_ended(self, now: float) -> None:
        if now - self.swept < 1.0:  # (a look at every wait for each line of a busy turn: once a second)
            return
        self.swept = now
        for task_id in [task_id for task_id, last in self.last.items() if now - last > FORGET_AFTER]:
            self.ended(task_id)


class ToldEvery:
    """Lines of one kind told at WARNING once every TELL_EVERY seconds, the others at DEBUG.

    A standby that is down or behind sends every task of target 'standby' to the primary: a
    line a task, at WARNING, would bury the log under a reporting load's tasks.  The first of a
    kind (of reason) is told, then once a minute with how many went to DEBUG since.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: dict[str, float] = {}  # kind: when it was last told at WARNING
        self.untold: dict[str, int] = {}  # kind: lines at DEBUG since

    def told(self, kind: str, text: str) -> tuple[int, str]:
        """The level and text of a line of `kind`, now."""
        now = self.clock()
        if kind in self.last and now - self.last[kind] < TELL_EVERY:
            self.untold[kind] = self.untold.get(kind, 0) + 1
            return logging.DEBUG, text
        self.last[kind] = now
        since = self.untold.pop(kind, 0)
        return logging.WARNING, f"{text} (and {since} more since the last such line)" if since else text
