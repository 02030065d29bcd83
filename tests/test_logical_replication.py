"""Logical replication of a database that uses pg_task_py (blue/green copies, FOR ALL TABLES
publications): the publisher schedules as before; a copy runs nothing while its subscription is
enabled, then takes over without a duplicate key.  Publisher and subscriber are two databases of
one cluster with wal_level = logical."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_task_py_testing import Launcher, throwaway_cluster, wait_until


@pytest.fixture
def logical() -> Iterator:
    with throwaway_cluster({"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}) as cluster:
        cluster.create_database("pub")
        with cluster.connect("pub") as conn:
            conn.autocommit = True
            conn.execute("CREATE PUBLICATION everything FOR ALL TABLES")
        yield cluster


def started(launcher: Launcher) -> Launcher:
    launcher.start()
    launcher.wait_active()
    return launcher


def test_a_database_published_for_all_tables_schedules_and_counts(logical):
    """The extension's two tables without a key have REPLICA IDENTITY FULL: the launcher's
    deletes of folded counters failed every turn ("does not have a replica identity and
    publishes deletes"), and nothing started."""
    launcher = started(Launcher(logical.dsn("pub")))
    try:
        with logical.connect("pub") as conn:
            conn.autocommit = True
            task = conn.execute("INSERT INTO task (input, delete) VALUES ('SELECT 42', false) RETURNING id"
                                ).fetchone()[0]
            wait_until(lambda: conn.execute("SELECT state::text FROM task WHERE id = %s", [task]).fetchone()[0]
                       == "DONE", 20, 0.05, "the task DONE")
            # (the counters are folded from group_count_changes, whose rows are then deleted)
            wait_until(lambda: conn.execute("SELECT done_total FROM task_stats").fetchone()[0] == 1, 20, 0.1,
                       "the end counted")
            conn.execute("SELECT task_cancel(id) FROM task WHERE false")  # (the steering proofs' table too)
            series = conn.execute("SELECT task_schedule('s', '@hourly', 'SELECT 1')").fetchone()[0]
            assert conn.execute("SELECT task_cancel(%s)", [series]).fetchone()[0]
        assert "replica identity" not in launcher.output(), launcher.output()
    finally:
        launcher.stop()


def test_a_copy_runs_nothing_while_its_subscription_is_enabled_then_takes_over(logical):
    """A launcher on both sides ran each task planned ahead twice; a copy taken over had its id
    sequence behind the ids it received, and every insert failed on the primary key."""
    logical.create_database("copy")
    with logical.connect("pub") as conn:
        conn.autocommit = True
        conn.execute("SELECT pg_create_logical_replication_slot('copy', 'pgoutput')")
        conn.execute("INSERT INTO task (input, delete) SELECT 'SELECT ' || i, false FROM generate_series(1, 3) AS i")
    launcher = started(Launcher(logical.dsn("copy")))
    try:
        with logical.connect("copy") as conn:
            conn.autocommit = True
            conn.execute(f"CREATE SUBSCRIPTION copy CONNECTION '{logical.dsn('pub')}' PUBLICATION everything"
                         " WITH (create_slot = false, slot_name = 'copy')")
            wait_until(lambda: 'the subscription "copy" copies the task table' in launcher.output(), 20, 0.1,
                       "the launcher to see the subscription")
            wait_until(lambda: conn.execute("SELECT count(*) FROM task").fetchone()[0] == 3, 20, 0.1,
                       "the copy of the tasks")
            # Its turns go on without starting them: the launcher's session has the stopping name,
            # on which workers give up their group (and no claim is made under it).
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_task_py launcher (stopping)'"
            ).fetchone()[0] == 1, 20, 0.1, "the launcher's session to say it runs nothing")
            assert conn.execute("SELECT array_agg(state::text) FROM task").fetchone()[0] == ["PLAN"] * 3
            conn.execute("ALTER SUBSCRIPTION copy DISABLE")
            wait_until(lambda: conn.execute("SELECT count(*) FROM task WHERE state = 'DONE'").fetchone()[0] == 3,
                       20, 0.1, "the copied tasks run here")
            # Each ran once, here: the publisher has no launcher.
            assert sorted(row[0] for row in conn.execute("SELECT output FROM task")) == ["1", "2", "3"]
            mine = conn.execute("INSERT INTO task (input, delete) VALUES ('SELECT 4', false) RETURNING id"
                                ).fetchone()[0]
            assert mine > 3
            wait_until(lambda: conn.execute("SELECT output FROM task WHERE id = %s", [mine]).fetchone()[0] == "4",
                       20, 0.1, "a task of the copy's own")
            conn.execute("ALTER SUBSCRIPTION copy SET (slot_name = NONE)")
            conn.execute("DROP SUBSCRIPTION copy")
        output = launcher.output()
        assert 'the subscription "copy" no longer copies the task table: scheduling here' in output, output
        assert "task_id_seq was behind the table's ids" in output and "moved past 3" in output, output
    finally:
        launcher.stop()
        with logical.connect("pub") as conn:
            conn.autocommit = True
            conn.execute("SELECT pg_drop_replication_slot('copy') FROM pg_replication_slots WHERE slot_name = 'copy'")
