"""A primary and a streaming standby on this machine, for the failover tests and `make demo-ha`.

The primary is made by initdb, the standby by `pg_basebackup -R` from it; each node is a
`postgres` process of its own (as the server's OS user when the caller is root, like every
cluster of the project: server.programs), on its own port and socket directory.  A node can be
stopped fast or immediate, promoted, and an old primary made a standby of the new one again
(`pg_rewind` or a new base backup).
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from testing.common.database import get_unused_port

from pg_task_py_testing.server import PG_BIN, SETTINGS, SHUTDOWN_SIGNALS, Cluster, as_root, prepare_directory
from pg_task_py_testing.waiting import wait_until

# Replication over the socket as well: pg_basebackup, the standby's WAL receiver and pg_rewind.
REPLICATION_HBA = "local all all trust\nlocal replication all trust\n"
# pg_rewind needs full-page writes and hint bits in the WAL (SETTINGS turn the first off for speed).
REPLICATION_SETTINGS = {"full_page_writes": "on", "wal_log_hints": "on", "wal_level": "replica",
                        "max_wal_senders": "10", "wal_keep_size": "128MB", "hot_standby": "on",
                        "listen_addresses": "''"}


def server_program(name: str, *args: str) -> list[str]:
    """The command line of one of PG_BIN's programs, run as the server's OS user."""
    program = str(PG_BIN / name)
    if not as_root():
        return [program, *args]
    return [sys.executable, "-m", "pg_task_py_testing.as_server_user", program, *args]


def run_program(name: str, *args: str) -> str:
    """Run one of PG_BIN's programs to its end; its output, or AssertionError with it."""
    done = subprocess.run(server_program(name, *args), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{name} {shlex.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


class Node(Cluster):
    """One server of a replicated pair: a `postgres` process on its own port and socket."""

    def __init__(self, base: Path, name: str) -> None:
        self.name = name
        self.home = prepare_directory(base / name)
        self.socket_dir = prepare_directory(self.home / "socket")
        self.data = self.home / "data"
        self.log = self.home / "server.log"
        self.port = get_unused_port()
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0, wait: bool = True) -> None:
        """Start the server; return when it accepts connections (a standby: read-only ones), or at
        once without `wait` (a standby with hot_standby off accepts none)."""
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                server_program("postgres", "-D", str(self.data), "-p", str(self.port), "-k", str(self.socket_dir)),
                stdout=log, stderr=subprocess.STDOUT)
        if wait:
            wait_until(self._accepting, timeout, 0.1, f"{self.name} to accept connections; its log:\n{self.log_tail()}")

    def _accepting(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited; its log:\n{self.log_tail()}")
        try:
            self.connect(connect_timeout=5).close()
        except psycopg.OperationalError:
            return False
        return True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: "fast" (a clean shutdown) or "immediate" (as if it crashed)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(SHUTDOWN_SIGNALS[mode])
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def in_recovery(self) -> bool:
        with self.connect() as conn:
            return conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]

    def promote(self, timeout: float = 30.0) -> None:
        """`pg_ctl promote`, then wait until the node accepts writes."""
        run_program("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", str(int(timeout)))

        def left_recovery() -> bool:
            try:
                return not self.in_recovery()
            except psycopg.OperationalError:  # (hot_standby off: "not accepting connections" a moment more)
                return False
        wait_until(left_recovery, timeout, 0.05, f"{self.name} to leave recovery")

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log.read_text()[-size:]
        except OSError:
            return "(no log)"

    def replication_conninfo(self) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres"


class ReplicatedPair:
    """A primary and a streaming standby of it.  `primary` and `standby` name the nodes by their
    role now: promote() swaps them, rejoin() makes the old primary the new one's standby."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.base = prepare_directory(Path(tempfile.mkdtemp(prefix="pg_task_py-pair-")))
        self.settings = {**SETTINGS, **REPLICATION_SETTINGS, **(settings or {})}
        self.primary = Node(self.base, "node1")
        self.standby = Node(self.base, "node2")
        self.old_primary: Node | None = None  # the primary before the last failover, until it rejoins

    def start(self) -> ReplicatedPair:
        """initdb and start the primary, then make and start the standby."""
        run_program("initdb", "-D", str(self.primary.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                    "--locale=C.UTF-8")
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in self.settings.items())
        (self.primary.data / "pg_hba.conf").write_text(REPLICATION_HBA)
        self.primary.start()
        self.make_standby(self.standby, self.primary)
        return self

    def make_standby(self, node: Node, source: Node) -> None:
        """A new base backup of `source` into `node`'s (removed) data directory, started as its standby."""
        node.stop("immediate")
        if node.data.exists():
            shutil.rmtree(node.data)
        run_program("pg_basebackup", "-D", str(node.data), "-R", "-X", "stream", "-c", "fast",
                    "-h", str(source.socket_dir), "-p", str(source.port), "-U", "postgres")
        node.start()
        self.wait_streaming(node)

    def wait_streaming(self, node: Node | None = None, timeout: float = 60.0) -> None:
        """Wait until the standby's WAL receiver streams from the primary."""
        node = node or self.standby

        def streaming() -> bool:
            with node.connect() as conn:
                return conn.execute("SELECT status = 'streaming' FROM pg_stat_wal_receiver").fetchone() == (True,)
        wait_until(streaming, timeout, 0.05, f"{node.name} to stream; its log:\n{node.log_tail()}")

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Wait until the standby has replayed everything the primary has written so far: up to its
        WAL insert position, since with synchronous_commit off a commit returns before its WAL is
        written (the write position would leave the last commits out)."""
        with self.primary.connect() as conn:
            lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]

        def replayed() -> bool:
            with self.standby.connect() as conn:
                return conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()[0]
        wait_until(replayed, timeout, 0.02, f"{self.standby.name} to replay up to {lsn}")

    def fail_over(self, mode: str = "fast") -> None:
        """Stop the primary ("fast" or "immediate") and promote the standby: the roles swap."""
        self.primary.stop(mode)
        self.standby.promote()
        self.old_primary = self.primary
        self.primary, self.standby = self.standby, self.primary

    def rejoin(self, how: str = "pg_rewind") -> None:
        """Make the old primary (stopped by fail_over) a standby of the new primary: with
        pg_rewind (which writes standby.signal and primary_conninfo), or a new base backup."""
        node = self.old_primary or self.standby
        node.stop("immediate")
        if how == "pg_rewind":
            # pg_rewind reads the new timeline from the control file, which a promotion
            # updates only with its next checkpoint.
            with self.primary.connect() as conn:
                conn.execute("CHECKPOINT")
            run_program("pg_rewind", "--target-pgdata", str(node.data), "--write-recovery-conf",
                        "--source-server", f"{self.primary.replication_conninfo()} dbname=postgres")
            node.start()
            self.wait_streaming(node)
        else:
            self.make_standby(node, self.primary)
        self.old_primary = None

    def destroy(self) -> None:
        for node in (self.primary, self.standby):
            node.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def replicated_pair(settings: dict[str, str] | None = None) -> Iterator[ReplicatedPair]:
    """A started primary and streaming standby, destroyed afterwards."""
    pair = ReplicatedPair(settings)
    try:
        yield pair.start()
    finally:
        pair.destroy()


def multi_host_dsn(nodes: list[Node], dbname: str, **keywords: str) -> str:
    """One conninfo naming every node (libpq tries them in order), e.g. with
    target_session_attrs=read-write to find the primary."""
    hosts = ",".join(str(node.socket_dir) for node in nodes)
    ports = ",".join(str(node.port) for node in nodes)
    extra = "".join(f" {key}={value}" for key, value in keywords.items())
    return f"host={hosts} port={ports} dbname={dbname} user=postgres{extra}"

