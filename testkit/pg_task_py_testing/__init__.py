"""Helpers of pg_task_py's tests, demo and benchmark: throw-away PostgreSQL clusters
(testing.postgresql; the tests' session cluster is pytest-postgresql's), the real launcher in a
subprocess, and databases with the extension.  Installed into the project's virtual environment
by scripts/setup.sh (`pip install ./testkit`)."""

from pg_task_py_testing.database import ACTIVE_STATES, GATED, Database, insert_as, new_database
from pg_task_py_testing.endpoint import free_port, scrape
from pg_task_py_testing.launcher import LAUNCHER, Launcher
from pg_task_py_testing.replication import Node, ReplicatedPair, multi_host_dsn, replicated_pair
from pg_task_py_testing.server import (
    PG_BIN,
    SETTINGS,
    Cluster,
    ThrowAwayCluster,
    as_root,
    command_line_options,
    extension_version,
    prepare_directory,
    programs,
    throwaway_cluster,
)
from pg_task_py_testing.waiting import most_at_once, wait_until

__all__ = [
    "ACTIVE_STATES", "GATED", "LAUNCHER", "PG_BIN", "SETTINGS", "Cluster", "Database", "Launcher", "Node",
    "ReplicatedPair", "ThrowAwayCluster", "as_root", "command_line_options", "extension_version", "free_port",
    "insert_as", "most_at_once", "multi_host_dsn", "new_database", "prepare_directory", "programs",
    "replicated_pair", "scrape", "throwaway_cluster", "wait_until",
]
