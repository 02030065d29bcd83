"""A test's own database with the extension, and helpers to drive it."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg

from pg_task_py_testing.launcher import Launcher
from pg_task_py_testing.server import Cluster
from pg_task_py_testing.waiting import wait_until

ACTIVE_STATES = ("PLAN", "TAKE", "WORK")
GATED = "SELECT 'long' FROM (SELECT count(*) FROM gate) AS g"  # a task that runs until the gate opens (close_gate)


@dataclass
class Database:
    """A database with the extension on `cluster`, `conn` an autocommit connection to it."""

    cluster: Cluster
    name: str
    conn: psycopg.Connection
    launchers: list[Launcher] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    def connect(self, user: str = "postgres") -> psycopg.Connection:
        return self.cluster.connect(self.name, user)

    def sql(self, query: str, params: object = None) -> list[tuple]:
        cursor = self.conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []

    def value(self, query: str, params: object = None) -> object:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def insert(self, input: str, **columns: object) -> int:
        return insert_as(self.conn, input, **columns)

    def task(self, task_id: int) -> dict | None:
        cursor = self.conn.execute("SELECT * FROM task WHERE id = %s", [task_id])
        row = cursor.fetchone()
        return dict(zip([d.name for d in cursor.description], row)) if row else None

    def wait_done(self, task_id: int, timeout: float = 20.0) -> dict | None:
        """The task's row once it has ended (None if it was deleted)."""
        def ended() -> object:
            row = self.task(task_id)
            return ("deleted",) if row is None else (row if row["state"] not in ACTIVE_STATES else None)
        row = wait_until(ended, timeout, message=f"task {task_id} to end; unfinished: {self.unfinished()}"
                         f"\nlaunchers' logs:\n" + "\n".join(launcher.output()[-3000:] for launcher in self.launchers))
        return None if row == ("deleted",) else row

    def unfinished(self) -> str:
        """What a timed-out wait reports: the unfinished tasks and the database's backends."""
        tasks = self.sql("SELECT id, state, left(input, 20), pid, worker, plan - now(), max, hash, count, live"
                         " FROM task WHERE state::text = ANY(%s)",
                         [list(ACTIVE_STATES)])
        backends = self.sql("SELECT pid, application_name, state, wait_event_type, wait_event, left(query, 80),"
                            " pg_blocking_pids(pid), backend_xmin"
                            " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return f"{tasks}\nbackends: {backends}"

    def close_gate(self) -> psycopg.Connection:
        """A session whose open transaction holds the new table `gate` locked: a task of input
        GATED runs until that transaction ends (COMMIT on the connection returned)."""
        self.sql("CREATE TABLE gate ()")
        keeper = self.connect()
        keeper.execute("BEGIN")
        keeper.execute("LOCK TABLE gate IN ACCESS EXCLUSIVE MODE")
        return keeper

    def terminate_task_sessions(self, seconds: float) -> None:
        """A DBA's pg_terminate_backend of the database's task sessions (kept, started ahead or
        running, here or on a remote server of this cluster), again and again for `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                     " AND application_name = 'pg_task_py task'")

    def wait_first_attempts_done(self, timeout: float = 60.0) -> None:
        """Until every task but the retries (those with a `parent`, which may be planned later) has ended."""
        wait_until(lambda: self.value("SELECT count(*) FROM task WHERE parent IS NULL AND state::text = ANY(%s)",
                                      [list(ACTIVE_STATES)]) == 0,
                   timeout, interval=0.1, message=f"the tasks' ends; unfinished: {self.unfinished()}")

    def wait_all_done(self, timeout: float = 30.0) -> None:
        wait_until(lambda: self.value("SELECT count(*) FROM task WHERE state::text = ANY(%s)",
                                      [list(ACTIVE_STATES)]) == 0,
                   timeout, interval=0.05, message=f"all tasks to end; unfinished: {self.unfinished()}"
                   f"\nlaunchers' logs:\n" + "\n".join(launcher.output()[-3000:] for launcher in self.launchers))

    def launcher(self, *args: str, wait: bool = True) -> Launcher:
        launcher = Launcher(self.dsn, args=args).start()
        self.launchers.append(launcher)
        if wait:
            launcher.wait_active()
        return launcher


def insert_as(conn: psycopg.Connection, input: str, **columns: object) -> int:
    """INSERT a task with these columns through `conn` (as its role), returning its id."""
    names = ["input", *columns]
    quoted = ", ".join(f'"{name}"' for name in names)
    marks = ", ".join(["%s"] * len(names))
    return conn.execute(f"INSERT INTO task ({quoted}) VALUES ({marks}) RETURNING id",
                        [input, *columns.values()]).fetchone()[0]


_names = itertools.count()


@contextlib.contextmanager
def new_database(cluster: Cluster) -> Iterator[Database]:
    """A fresh database with the extension: a copy of the cluster's template when it has one;
    dropped afterwards, its launchers killed first."""
    name = f"test_{next(_names)}"
    if cluster.template:
        with cluster.connect() as conn:
            conn.execute(f'CREATE DATABASE {name} TEMPLATE "{cluster.template}"')
    else:
        cluster.create_database(name)
    conn = cluster.connect(name)
    database = Database(cluster, name, conn)
    try:
        yield database
    finally:
        for launcher in database.launchers:
            launcher.kill()
        conn.close()
        # A worker of a killed launcher may be opening a session into this very
        # database, and a backend blocked in a connection attempt cannot be
        # forced out at once: try the DROP again for a few seconds.
        wait_until(lambda: drop_database(cluster, name), 30, 0.5, f"DROP DATABASE {name}")


def drop_database(cluster: Cluster, name: str) -> bool:
    with cluster.connect() as admin:
        try:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except psycopg.errors.ObjectInUse:
            return False
    return True
