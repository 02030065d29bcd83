"""A throw-away PostgreSQL cluster and the real launcher, for tests, the demo and the benchmark.

PostgreSQL refuses to run as root, so when the tests run as root (CI does) the
server's files belong to, and its processes run as, the `postgres` OS user.
Clients (tests, launcher) connect over the cluster's own Unix socket with
trust authentication: the socket directory is reachable by that user and root
only, so the trust covers nobody else.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
REPO = Path(__file__).resolve().parent.parent
LAUNCHER = Path(sys.executable).parent / "pg_task_py"


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """initdb + pg_ctl for one cluster in a temporary directory."""

    def __init__(self, settings: dict[str, str] | None = None, hba: str = "local all all trust\n") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="pg_task_py-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "socket"
        self.log = self.base / "server.log"
        self.port = free_port()
        self.settings = settings or {}
        self.hba = hba
        self.as_root = os.geteuid() == 0
        self.owner = pwd.getpwnam("postgres") if self.as_root else pwd.getpwuid(os.getuid())
        self.socket_dir.mkdir()
        for path in (self.base, self.socket_dir):
            os.chown(path, self.owner.pw_uid, self.owner.pw_gid)
            path.chmod(0o700)

    def _pg(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if self.as_root:
            command = ["setpriv", f"--reuid={self.owner.pw_uid}", f"--regid={self.owner.pw_gid}",
                       "--init-groups", *command]
        return subprocess.run(command, check=True, capture_output=True, text=True, cwd=self.base, **kwargs)

    def init(self) -> Cluster:
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                 "--locale=C.UTF-8")
        conf = {
            "port": str(self.port),
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "100",
            "shared_buffers": "64MB",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] %a '",
            **self.settings,
        }
        with open(self.data / "postgresql.conf", "a") as f:
            f.writelines(f"{key} = {value}\n" for key, value in conf.items())
        # Only the socket, whose directory only the server's user and root can reach.
        (self.data / "pg_hba.conf").write_text(self.hba)
        return self

    def start(self) -> None:
        self._pg("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log))

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    def restart(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "restart", "-w", "-t", "60", "-m", mode, "-D", str(self.data), "-l", str(self.log))

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host={self.socket_dir} port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname: str = "postgres", user: str = "postgres", **kwargs: Any) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname, user), autocommit=True, **kwargs)

    def create_database(self, name: str, extension: bool = True) -> None:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        if extension:
            with self.connect(name) as conn:
                conn.execute("CREATE EXTENSION pg_task_py CASCADE")


class Launcher:
    """The real `pg_task_py run` in a subprocess, its log kept for assertions."""

    def __init__(self, *dsns: str, args: tuple[str, ...] = (), log_dir: Path | None = None) -> None:
        self.command = [str(LAUNCHER), "run", *[a for dsn in dsns for a in ("--dsn", dsn)], *args]
        self.log_path = Path(tempfile.mkstemp(prefix="launcher-", suffix=".log", dir=log_dir)[1])
        self.process: subprocess.Popen | None = None

    def start(self) -> Launcher:
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_active(self, timeout: float = 15.0) -> None:
        wait_until(lambda: "scheduling (active)" in self.output() or self.process.poll() is not None,
                   timeout, message="the launcher to start scheduling")
        assert self.process.poll() is None, f"launcher exited:\n{self.output()}"

    def output(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (killing it if it does not stop in time)."""
        if self.process is None:
            return 0
        self.signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        self._log.close()
        return status

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running_cluster(settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    cluster = Cluster(settings).init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
