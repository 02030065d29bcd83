"""PostgreSQL clusters as the project's tests, demo and benchmark run them.

The tests' session cluster is pytest-postgresql's (tests/conftest.py); every other throw-away
cluster is testing.postgresql's (ThrowAwayCluster).  Both run with SETTINGS, and clients (tests,
launcher, pgbench) connect over the cluster's own Unix socket with trust authentication: the
socket's directory is reachable by the server's OS user and root only, so the trust covers
nobody else.

PostgreSQL refuses to run as root, and CI runs the tests as root.  Then the libraries are given
wrappers instead of initdb, pg_ctl and postgres (programs()) that run them as the `postgres` OS
user (pg_task_py_testing.as_server_user), and the server's directories belong to that user
(prepare_directory()).  For an ordinary user both are no-ops: the server runs as that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import testing.postgresql
from testing.common.database import Database as _LibraryDatabase

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_USER = "postgres"  # the OS user the server runs as when the caller is root

# Every cluster's settings, as postgresql.conf spells them (also given as `-c name=value`).
SETTINGS = {
    "max_connections": "100",
    "shared_buffers": "64MB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %a '",
}
# Only the socket, whose directory only the server's user and root can reach.
LOCAL_TRUST = "local all all trust\n"

SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def extension_version(control_file: Path) -> str:
    """The extension's version in development: the control file's default_version."""
    return re.search(r"^default_version\s*=\s*'([^']+)'", Path(control_file).read_text(), re.MULTILINE).group(1)


def as_root() -> bool:
    return os.geteuid() == 0


def server_user() -> pwd.struct_passwd:
    """The OS user the server runs as: `postgres` when the caller is root, else the caller."""
    return pwd.getpwnam(SERVER_USER) if as_root() else pwd.getpwuid(os.getuid())


def prepare_directory(path: Path) -> Path:
    """Make directory `path` (created if missing) the server's: its OS user's, mode 0700.

    As root, also let that user reach it: a directory above it, up to the temporary directory,
    that others cannot search gets search permission (o+x; nothing becomes listable or writable).
    Only directories inside the temporary directory are handed over."""
    path = Path(path).resolve()
    temp = Path(tempfile.gettempdir()).resolve()
    if temp not in path.parents:
        raise ValueError(f"{path}: a server directory must be inside {temp}")
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    if as_root():
        user = server_user()
        os.chown(path, user.pw_uid, user.pw_gid)
        for above in path.parents:
            if above == temp:
                break
            mode = above.stat().st_mode
            if not mode & 0o001:
                above.chmod(mode & 0o7777 | 0o001)
    return path


def programs(directory: Path, make: bool = True) -> Path:
    """Where initdb, pg_ctl and postgres are to be found: PG_BIN; as root, wrappers in `directory`
    (written there unless `make` is false) that run PG_BIN's programs as the server's OS user."""
    if not as_root():
        return PG_BIN
    if not make:
        return directory
    directory.mkdir(mode=0o700, exist_ok=True)
    for name in ("initdb", "pg_ctl", "postgres"):
        wrapper = directory / name
        wrapper.write_text("#!/bin/sh\n"
                           f"exec {shlex.quote(sys.executable)} -m pg_task_py_testing.as_server_user"
                           f' {shlex.quote(str(PG_BIN / name))} "$@"\n')
        wrapper.chmod(0o700)
    return directory


def command_line_options(settings: dict[str, str]) -> str:
    """Settings as the server's command-line options (pg_ctl -o passes them through sh)."""
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


class Cluster:
    """A running cluster, as tests, demo and benchmark use it."""

    socket_dir: Path
    port: int
    data: Path  # the data directory (postgresql.conf is there)
    log: Path  # the server's log
    template: str | None = None  # a database with the extension that new_database() copies

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

    def restart(self, mode: str = "fast") -> None:
        raise NotImplementedError


class _Postgresql(testing.postgresql.Postgresql):
    """testing.postgresql's server, run as the project runs its clusters: initdb and postgres as
    the server's OS user, SETTINGS in postgresql.conf, the socket only, pg_hba.conf as given;
    ready when psycopg logs in over the socket (the library's check logs in over TCP)."""

    def initialize(self) -> None:
        base = prepare_directory(Path(self.base_dir))
        for name in self.subdirectories:  # data, and tmp: the socket's directory
            prepare_directory(base / name)
        bin_dir = programs(base / "bin")
        self.settings["initdb"] = str(bin_dir / "initdb")
        self.settings["postgres"] = str(bin_dir / "postgres")
        super().initialize()

    def initialize_database(self) -> None:
        super().initialize_database()  # initdb
        data = Path(self.get_data_directory())
        with open(data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in self.settings["conf"].items())
        (data / "pg_hba.conf").write_text(self.settings["hba"])

    def socket_dir(self) -> Path:
        return Path(self.base_dir) / "tmp"

    def is_server_available(self) -> bool:
        try:
            psycopg.connect(host=str(self.socket_dir()), port=self.settings["port"], dbname="postgres",
                            user="postgres", connect_timeout=5).close()
        except psycopg.OperationalError:
            return False
        return True

    def poststart(self) -> None:
        """Nothing: the library's creates a database `test` over TCP, which these servers refuse."""


class ThrowAwayCluster(Cluster):
    """A cluster of its own, in a temporary directory, started at once; destroy() removes it."""

    def __init__(self, settings: dict[str, str] | None = None, hba: str = LOCAL_TRUST) -> None:
        self.server = _Postgresql(
            conf={**SETTINGS, "listen_addresses": "''", **(settings or {})}, hba=hba,
            initdb_args="-U postgres -A trust -E UTF8 --locale=C.UTF-8", postgres_args="",
            boot_timeout=60,  # crash recovery after an immediate stop, on a busy machine
        )
        self.socket_dir = self.server.socket_dir()
        self.port = self.server.settings["port"]
        self.data = Path(self.server.get_data_directory())
        self.log = Path(self.server.base_dir) / f"{self.server.name}.log"

    def stop(self, mode: str = "fast") -> None:
        # (testing.postgresql's own terminate() always asks for a fast shutdown)
        _LibraryDatabase.terminate(self.server, SHUTDOWN_SIGNALS[mode])

    def start(self) -> None:
        self.server.start()

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        self.server.cleanup()


@contextlib.contextmanager
def throwaway_cluster(settings: dict[str, str] | None = None, hba: str = LOCAL_TRUST) -> Iterator[ThrowAwayCluster]:
    cluster = ThrowAwayCluster(settings, hba)
    try:
        yield cluster
    finally:
        cluster.destroy()
