"""Fixtures: one real cluster per test session (pytest-postgresql), a fresh database with the
extension per test (a copy of a template), the real launcher."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pg_task_py_testing import (
    SETTINGS,
    Cluster,
    Database,
    Launcher,
    as_root,
    command_line_options,
    new_database,
    prepare_directory,
    programs,
)
from pytest_postgresql import factories
from pytest_postgresql.executors import PostgreSQLExecutor

# The session cluster's own files, made by `server_files` before the server starts and removed
# after it stopped: the socket's directory, pg_hba.conf, and (as root) the programs' wrappers.
SERVER_FILES = Path(tempfile.gettempdir()) / f"pg_task_py-tests-{secrets.token_hex(6)}"
# pytest-postgresql waits for the server's TCP port and makes the template database over TCP: the
# server also listens on 127.0.0.1, where only postgres may log in, with this session's password.
# Everything else (tests, launchers, workers) uses the socket.
PASSWORD = secrets.token_urlsafe(18)
HBA = "local all all trust\nhost all postgres 127.0.0.1/32 scram-sha-256\n"


def with_extension(*, autocommit: bool, **conninfo: object) -> None:
    """pytest-postgresql's loader of the template database that each test's database copies."""
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_task_py CASCADE")


postgresql_proc = factories.postgresql_proc(
    executable=str(programs(SERVER_FILES / "bin", make=False) / "pg_ctl"),
    host="127.0.0.1",
    port=None,  # any free port
    user="postgres",
    password=PASSWORD,
    dbname="pg_task_py",  # the template: pg_task_py_tmpl
    unixsocketdir=str(SERVER_FILES / "socket"),
    postgres_options=command_line_options(
        {**SETTINGS, "listen_addresses": "127.0.0.1", "hba_file": f"'{SERVER_FILES / 'pg_hba.conf'}'"}),
    load=[with_extension],
)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """As root, the server runs as the postgres OS user and must reach its data directory, which
    pytest-postgresql puts in pytest's temporary directory: the session gets a base directory of
    its own, as every pytest run takes search permission off /tmp/pytest-of-root."""
    if as_root() and config.option.basetemp is None:
        basetemp = tempfile.mkdtemp(prefix="pg_task_py-pytest-")
        config.option.basetemp = basetemp
        config.add_cleanup(lambda: shutil.rmtree(basetemp, ignore_errors=True))


class SessionCluster(Cluster):
    """pytest-postgresql's server (its executor) as the tests use a cluster."""

    def __init__(self, executor: PostgreSQLExecutor) -> None:
        self.executor = executor
        self.socket_dir = Path(executor.unixsocketdir)
        self.port = executor.port
        self.data = Path(executor.datadir)
        self.log = Path(executor.logfile)
        self.template = executor.template_dbname

    def restart(self, mode: str = "fast") -> None:
        assert mode == "fast", "pytest-postgresql stops its server with a fast shutdown"
        self.executor.stop()
        self.executor.start()


@pytest.fixture(scope="session")
def server_files() -> Iterator[Path]:
    """SERVER_FILES, the server's OS user's."""
    prepare_directory(SERVER_FILES)
    prepare_directory(SERVER_FILES / "socket")
    (SERVER_FILES / "pg_hba.conf").write_text(HBA)
    programs(SERVER_FILES / "bin")
    try:
        yield SERVER_FILES
    finally:
        shutil.rmtree(SERVER_FILES, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(server_files: Path, request: pytest.FixtureRequest) -> SessionCluster:
    """The session's cluster.  The server is asked for here, so that it starts once its files are
    there and stops before they go."""
    return SessionCluster(request.getfixturevalue("postgresql_proc"))


@pytest.fixture
def db(cluster: SessionCluster) -> Iterator[Database]:
    with new_database(cluster) as database:
        yield database


@pytest.fixture(scope="module")
def shared(cluster: SessionCluster) -> Iterator[Database]:
    """One database and launcher for a whole module of independent, quick tasks."""
    with new_database(cluster) as database:
        launcher = database.launcher()
        yield database
        assert launcher.stop() == 0, launcher.output()


@pytest.fixture
def latin1(cluster: SessionCluster) -> Iterator[tuple[psycopg.Connection, Launcher]]:
    """A LATIN1 database with the extension and a launcher: a connection to it and the launcher
    (killed, and the database dropped, at the end)."""
    name = "latin1_db"
    with cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    launcher = None
    try:
        with cluster.connect(name) as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
            launcher = Launcher(cluster.dsn(name)).start()
            launcher.wait_active()
            yield conn, launcher
    finally:
        if launcher is not None:
            launcher.kill()
        with cluster.connect() as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def running(db: Database) -> Iterator[Database]:
    """A database with a launcher running on it (stopped cleanly at the end of the test)."""
    launcher = db.launcher()
    yield db
    assert launcher.stop() == 0, launcher.output()
