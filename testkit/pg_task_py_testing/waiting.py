"""Waiting on a condition with a deadline, and reading concurrency off start/stop times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def most_at_once(intervals: list[tuple]) -> int:
    """The most (start, stop) intervals that overlap at any one moment."""
    points = sorted([(start, 1) for start, _ in intervals] + [(stop, -1) for _, stop in intervals])
    most = current = 0
    for _, step in points:
        current += step
        most = max(most, current)
    return most
