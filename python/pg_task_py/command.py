"""The `pg_task_py` command: its stop and reload signals are heard from its first moment.

Importing the launcher (psycopg, the package's metadata) takes a few hundred milliseconds, and
Python's defaults would meet a signal in that time badly: SIGHUP ended the process unheard (a
supervisor's reload sent as the launcher started killed it), SIGINT printed a traceback.  Until
the launcher's own handlers are in place, this module holds the signals; the launcher replays them
(`held_signals`), as if they had come a moment later."""

from __future__ import annotations

import signal

HELD_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def main() -> int:
    held: list[int] = []
    for signum in HELD_SIGNALS:
        signal.signal(signum, lambda signum, _frame: held.append(signum))
    from pg_task_py.cli import main as launcher_main  # (after the handlers: the imports are the slow part)

    return launcher_main(held_signals=held)
