"""The scheduler's locks are out of other roles' reach.

They were advisory locks keyed by the task table's oid, and PostgreSQL lets every role take any
advisory lock: a role of the database with no right on the extension held up every claim with
one `pg_advisory_lock`, and every task's end with 1,024 of them.  They are now locks on tables
that no role but the extension's owner may lock (sql/created_once/26_locks.sql).
"""

from __future__ import annotations

import psycopg
import pytest
from pg_task_py_testing import Launcher, throwaway_cluster, wait_until

# The advisory keys of the task table's oid that the scheduler used to take: the scheduling lock
# (0) and the 1,024 keys of the prerequisite locks (4 mod 8, up to 8,188).
OLD_KEYS = [0] + list(range(4, 8192, 8))


@pytest.fixture
def bystander(db):
    """A role that may log in and nothing else: no task rights, no grant of the extension's."""
    db.sql("CREATE ROLE bystander LOGIN")
    db.sql("CREATE ROLE capped LOGIN IN ROLE pgtaskpy_user")
    db.sql("ALTER ROLE capped SET pg_task_py.role_running_limit = 5")
    yield
    db.sql("DROP OWNED BY capped")
    db.sql("DROP ROLE capped, bystander")


def test_advisory_locks_of_a_role_with_no_rights_hold_up_nothing(db, bystander):
    """The role holds every advisory key the scheduler took (and the one a role with a running
    limit still tries for, which a worker now leaves to the launcher): plain tasks, a chain whose
    ends release its steps, and the capped role's tasks that workers went on with, all run."""
    table = db.value("SELECT 'task'::regclass::oid::int4")
    owner_key = db.value("SELECT hashtext('capped') | 1")
    launcher = db.launcher()
    with db.connect(user="bystander") as holder:
        holder.execute("SELECT count(pg_advisory_lock(%s, k)) FROM unnest(%s::int4[]) AS k",
                       [table, [*OLD_KEYS, owner_key]])
        held = db.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND granted",
                        [holder.info.backend_pid])
        assert held == len(OLD_KEYS) + 1
        lone = db.insert("SELECT 'lone'", delete=False)
        with db.connect() as app:  # (the chain's INSERT waited for the keys too: with a deadline)
            app.execute("SET statement_timeout = '30s'")
            chain = app.execute("SELECT task_chain(ARRAY['SELECT 1', 'SELECT 2', 'SELECT 3'], 'chained')").fetchone()
        with db.connect(user="capped") as capped:
            capped.execute("INSERT INTO task (input, \"group\", max, delete)"
                           " SELECT 'SELECT ' || i, 'capped', 0, false FROM generate_series(1, 6) AS i")
        wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 1 + 3 + 6, 60, 0.1,
                   "every task to run while the role holds the keys")
        assert db.value("SELECT output FROM task WHERE id = %s", [lone]) == "lone"
        assert db.value("SELECT count(*) FROM task WHERE \"group\" = 'chained' AND state = 'DONE'") == 3, chain
    assert "turn_waits" not in launcher.output() and "held by backend" not in launcher.output()


@pytest.mark.parametrize("statement", [
    "LOCK TABLE pgtaskpy.scheduling_lock IN ROW SHARE MODE",
    "LOCK TABLE pgtaskpy.scheduling_lock IN EXCLUSIVE MODE",
    "SELECT FROM pgtaskpy.prerequisite_lock FOR SHARE",
    "SELECT FROM pgtaskpy.prerequisite_lock FOR UPDATE",
])
def test_a_task_author_cannot_take_the_scheduler_s_locks(db, statement):
    db.sql("CREATE ROLE author LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect(user="author") as author, pytest.raises(psycopg.errors.InsufficientPrivilege):
            author.autocommit = False  # (LOCK TABLE needs a transaction block)
            author.execute(statement)
    finally:
        db.sql("DROP ROLE author")


def test_the_prerequisite_locks_are_filled_again_after_a_crash():
    """The table of prerequisite locks is UNLOGGED: a crash's recovery empties it.  The first lock
    after that (here, the INSERT of a chain) fills it again, and the steps still wait for each other."""
    with throwaway_cluster() as cluster:
        cluster.create_database("crash")
        with cluster.connect("crash") as conn:
            conn.execute("CHECKPOINT")  # (commits are asynchronous in the tests' clusters: kept through the crash)
        cluster.restart("immediate")
        with cluster.connect("crash") as conn:
            conn.autocommit = True
            assert conn.execute("SELECT count(*) FROM pgtaskpy.prerequisite_lock").fetchone()[0] == 0
            conn.execute("CREATE TABLE steps (n int, at timestamptz DEFAULT clock_timestamp())")
            conn.execute("SELECT task_chain(ARRAY['SELECT pg_sleep(0.2); INSERT INTO steps VALUES (1)',"
                         " 'INSERT INTO steps VALUES (2)'], 'after the crash')")
            launcher = Launcher(cluster.dsn("crash")).start()
            try:
                wait_until(lambda: conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 2, 60, 0.1,
                           "the chain to run")
            finally:
                launcher.stop()
            assert [row[0] for row in conn.execute("SELECT n FROM steps ORDER BY at")] == [1, 2]
            assert conn.execute("SELECT count(*) FROM pgtaskpy.prerequisite_lock").fetchone()[0] == 1024


def test_a_held_series_key_holds_up_no_claim_while_the_launcher_ends_a_lost_run(running):
    """A named series' lock is still an advisory key (README, Limits): a role that holds it held
    up the launcher's end of the series' lost run, under the scheduling lock, and every claim with
    it.  The launcher now gives that end up after a second, runs the others' tasks, and ends the
    run at a later turn, once the key is let go: FAIL as a lost run, and the series goes on."""
    run = running.insert("SELECT pg_sleep(60)", key="held", repeat="1 hour", group="held_series", delete=False)
    wait_until(lambda: running.task(run)["state"] == "WORK", 20, 0.05, "the run to start")
    worker = running.value("SELECT worker FROM task WHERE id = %s", [run])
    key = running.value("SELECT (hashtext(current_user::text || E'\\x1f' || 'held') & -4) | 2")
    with running.connect() as holder:
        holder.execute("SELECT pg_advisory_lock('task'::regclass::oid::int4, %s)", [key])
        running.sql("SELECT pg_terminate_backend(%s)", [worker])
        wait_until(lambda: running.value(  # the launcher's turn, ending the lost run, waits for the key
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_task_py%%'"
            " AND %s = ANY (pg_blocking_pids(pid))", [holder.info.backend_pid]), 20, 0.02, "the end to wait")
        lone = running.insert("SELECT 'lone'", delete=False)
        assert running.wait_done(lone, timeout=15)["output"] == "lone"
        assert running.task(run)["state"] == "WORK"  # (its end waits for the key)
        holder.execute("SELECT pg_advisory_unlock('task'::regclass::oid::int4, %s)", [key])
    row = running.wait_done(run, timeout=20)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row
    assert "task worker ended before the task finished" in row["error"], row
    assert running.value("SELECT count(*) FROM task WHERE key = 'held' AND state = 'PLAN'") == 1
