"""`pg_task_py status`: the view task_stats as a table a person reads at a glance."""

from __future__ import annotations

import signal
import sys
import time
from datetime import timedelta

import psycopg
from psycopg import sql

from pg_task_py.launcher import connect
from pg_task_py.text import escape_controls, first_line

COLUMNS = ("owner", "group", "running", "due", "late", "later", "done 1h", "fail 1h", "gone 1h", "paused",
           "last error")
QUERY = """
SELECT owner, "group", running, due, oldest_due_lateness, later, done_1h, fail_1h, gone_1h, paused,
       split_part(last_error, E'\\n', 1)
FROM {view}
ORDER BY oldest_due_lateness DESC NULLS LAST, paused DESC, fail_1h DESC, owner, "group"
"""
CLEAR = "\033[H\033[2J"  # cursor home, clear the screen


STOP_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM}  # (SIGHUP: its terminal closed)


class StatusError(Exception):
    """The database cannot be read; the message says why."""


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP to a status that waits on the server (a lock, as `VACUUM FULL task`
    holds, or a server that never answers its connect): psycopg cancels a query a KeyboardInterrupt
    stops, so the signal's handler raises one, and the command ends rather than wait on."""


def show_status(dsn: str, watch: float | None, out=sys.stdout) -> None:
    """Print task_stats once, or every `watch` seconds until a signal stops it (Stopped).  A
    watch that has shown a table outlives a lost connection (a server restart): it says so and
    connects again."""
    shown = False
    try:
        # (blocked by the caller until here: a stop from now on cancels what waits on the server)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        while True:
            try:
                with connect(dsn, "pg_task_py status") as conn:
                    query = status_query(conn)
                    clear = CLEAR if watch and out.isatty() else ""  # (a file or a pipe: one table after another)
                    while True:
                        rows = conn.execute(query).fetchall()
                        # (before the write: an unbuffered stdout hands the table to its reader as it
                        # is written, and a stop from then on is no failure)
                        shown = True
                        out.write(clear + render(rows))
                        out.flush()
                        if watch is None:
                            return
                        time.sleep(watch)
            except psycopg.OperationalError as exc:
                if watch is None or not shown:
                    raise StatusError(first_line(exc)) from None
                out.write(f"connection lost: {first_line(exc)}; trying again in {watch:g}s\n")
                out.flush()
                time.sleep(watch)
            except psycopg.Error as exc:
                raise StatusError(first_line(exc)) from None
    except Stopped as exc:
        if not shown:
            raise StatusError(f"stopped by {exc} before the table was read") from None


def status_query(conn: psycopg.Connection) -> sql.Composed:
    """The query of task_stats in the extension's schema, whether or not that is on the search_path
    (the session has the launcher's settings: its search_path of pg_catalog alone above all)."""
    schema = conn.execute(
        "SELECT n.nspname FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n"
        " ON n.oid = e.extnamespace WHERE e.extname = 'pg_task_py'").fetchone()
    if schema is None:
        raise StatusError("no view task_stats here: the extension pg_task_py is not installed in this database"
                          " (CREATE EXTENSION pg_task_py CASCADE)")
    view = sql.Identifier(schema[0], "task_stats")
    if conn.execute(sql.SQL("SELECT pg_catalog.to_regclass({}) IS NULL").format(
            sql.Literal(view.as_string(conn)))).fetchone()[0]:
        raise StatusError("no view task_stats here: the extension pg_task_py is older than 1.3 in this"
                          " database (ALTER EXTENSION pg_task_py UPDATE)")
    return sql.SQL(QUERY).format(view=view)


def render(rows: list[tuple]) -> str:
    """An aligned text table, numbers to the right; a line when there is nothing to show."""
    if not rows:
        return "no tasks\n"
    cells = [[cell(value) for value in row] for row in rows]
    widths = [max(len(name), *(len(row[i]) for row in cells)) for i, name in enumerate(COLUMNS)]
    numeric = {2, 3, 5, 6, 7, 8}

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if i in numeric else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip() + "\n"

    return line(list(COLUMNS)) + line(["-" * w for w in widths]) + "".join(line(row) for row in cells)


def cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "PAUSED" if value else ""
    if isinstance(value, timedelta):
        return duration(value)
    text = escape_controls(str(value))  # (a role's group or error, shown to the superuser too)
    return text if len(text) <= 60 else text[:57] + "..."


def duration(value: timedelta) -> str:
    """12s, 4m05s, 3h02m, 2d04h: lateness at a glance."""
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{value.total_seconds():.1f}s" if seconds < 10 else f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
