"""Text from the database as a terminal shows it."""

from __future__ import annotations

import re

# C0 and C1 controls; the bidirectional marks, embeddings, overrides and isolates; the line and
# paragraph separators.
CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """Control characters (newline and tab too) as Python writes them: \\n, \\x1b, \\u202e.

    A task's group, error or output is its author's text: an escape sequence in it cleared the
    screen or retitled the terminal of whoever read the launcher's log or `status`, a newline in
    it wrote a line of its own that read as another row, and a right-to-left override turned
    the rest of the line around (a probe)."""
    return CONTROLS.sub(lambda match: repr(match.group())[1:-1], text)


def first_line(exc: BaseException) -> str:
    """The message's first line, without the `spiexceptions.Name: ` that PL/Python puts before
    an error raised inside dispatch() (the SQLSTATE's name says nothing to a user)."""
    text = re.sub(r"^spiexceptions\.\w+: ", "", str(exc).strip())
    return text.splitlines()[0] if text else type(exc).__name__
