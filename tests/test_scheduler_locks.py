"""The scheduler's locks are out of other roles' reach.

They were advisory locks keyed by the task table's oid, and PostgreSQL lets every role take any
advisory lock: a role of the database with no right on the extension held up every claim with
one `pg_advisory_lock`, and every task's end with 1,024 of them.  The scheduling lock is now a
lock on a view no role but the extension's owner may lock (sql/created_once/26_locks.sql), and
an end waits only for the commits of INSERTs of its own dependents, through its own row.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from pg_task_py_testing import insert_as, wait_until

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
])
def test_a_task_author_cannot_take_the_scheduling_lock(db, statement):
    db.sql("CREATE ROLE author LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect(user="author") as author, pytest.raises(psycopg.errors.InsufficientPrivilege):
            author.autocommit = False  # (LOCK TABLE needs a transaction block)
            author.execute(statement)
    finally:
        db.sql("DROP ROLE author")


def test_a_database_owner_s_analyze_in_an_open_transaction_holds_up_nothing(db):
    """A database's owner may ANALYZE any table of it, in a transaction block, and then holds the
    table's lock until the transaction ends: on a table as the scheduling lock, every claim waited
    for it.  A view's lock ANALYZE lets go at once."""
    db.sql("CREATE ROLE dbo LOGIN")
    db.sql(f'ALTER DATABASE "{db.name}" OWNER TO dbo')
    launcher = db.launcher()
    try:
        with db.connect(user="dbo") as owner:
            owner.autocommit = False
            owner.execute("ANALYZE pgtaskpy.scheduling_lock")
            assert db.wait_done(db.insert("SELECT 'while analyzed'"), timeout=15)["output"] == "while analyzed"
            owner.rollback()
    finally:
        db.sql(f'ALTER DATABASE "{db.name}" OWNER TO postgres')
        db.sql("DROP ROLE dbo")
    assert "held by backend" not in launcher.output()


def test_an_author_s_open_transaction_holds_up_only_its_own_prerequisites_ends(db):
    """An author that fires the prerequisite triggers early (SET CONSTRAINTS ALL IMMEDIATE) and
    keeps its transaction open holds what they lock until it ends.  Those were keys of task ids
    that every role's ends shared (1,024 of them): such a transaction, with an INSERT `after` 5,000
    tasks of its own, or a STOP of them, held up the ends of every other role's tasks.  Now it
    holds only its own prerequisites' rows: another role's task runs to its end."""
    db.sql("CREATE ROLE author LOGIN IN ROLE pgtaskpy_user")
    db.sql("CREATE ROLE other LOGIN IN ROLE pgtaskpy_user")
    launcher = db.launcher()
    try:
        with db.connect(user="author") as author, db.connect(user="other") as other:
            author.execute("INSERT INTO task (input, plan)"
                           " SELECT 'SELECT 1', now() + interval '1 hour' FROM generate_series(1, 5000)")
            for holding in ("INSERT INTO task (input, after) SELECT 'SELECT 2', array_agg(id) FROM task",
                            "UPDATE task SET state = 'STOP' WHERE state = 'PLAN'"):
                author.autocommit = False
                author.execute("SET CONSTRAINTS ALL IMMEDIATE")
                author.execute(holding)
                task = insert_as(other, "SELECT 'not held up'", delete=False)
                assert db.wait_done(task, timeout=15)["output"] == "not held up", holding
                author.rollback()
                author.autocommit = True
    finally:
        db.sql("DROP OWNED BY author, other")
        db.sql("DROP ROLE author, other")
    assert "Traceback" not in launcher.output()


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


@pytest.mark.parametrize("holding", [
    "SELECT FROM pgtaskpy.group_limit FOR SHARE",
    "SELECT task_limit('limited', 50)",
])
def test_an_author_s_open_transaction_on_its_rate_limit_holds_up_only_its_own_group(db, holding):
    """A role may write its groups' rate limits (task_limit, or the rows of pgtaskpy.group_limit).
    Held in an open transaction, its row held up the launcher's claim, which counts its group's
    starts there under the scheduling lock, and with it every role's tasks."""
    db.sql("CREATE ROLE author LOGIN IN ROLE pgtaskpy_user")
    db.sql("CREATE ROLE other LOGIN IN ROLE pgtaskpy_user")
    launcher = db.launcher()
    try:
        with db.connect(user="author") as author, db.connect(user="other") as other:
            author.execute("SELECT task_limit('limited', 100, '1 second')")
            author.autocommit = False
            author.execute(holding)
            with db.connect(user="author") as same_role:
                limited = insert_as(same_role, "SELECT 'its own group'", group="limited", delete=False)
            task = insert_as(other, "SELECT 'not held up'", delete=False)
            assert db.wait_done(task, timeout=15)["output"] == "not held up"
            author.rollback()
            assert db.wait_done(limited, timeout=15)["output"] == "its own group"
    finally:
        db.sql("DROP OWNED BY author, other")
        db.sql("DROP ROLE author, other")
    assert "held by backend" not in launcher.output()

@pytest.mark.parametrize("hold", ["rate limit", "running limit"])
def test_a_limit_committed_while_a_claim_waits_for_the_scheduling_lock_holds_that_claim(db, hold):
    """A claim read whether any rate or running limit existed before it took the scheduling lock:
    a role's first limit committed while the claim waited for it (another launcher's turn) was
    not seen, and the claim took ten of its tasks under a limit of one (a probe)."""
    db.sql("CREATE ROLE lock_alice LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect("lock_alice") as alice, db.connect() as holder, db.connect() as claimer:
            alice.execute("INSERT INTO task (input, \"group\", max)"
                          " SELECT 'SELECT 1', 'g', 9 FROM generate_series(1, 10)")
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE ONLY pgtaskpy.scheduling_lock IN EXCLUSIVE MODE")
            claimed = {}
            claim = threading.Thread(target=lambda: claimed.update(rows=claimer.execute(
                "SELECT * FROM pgtaskpy.claim_due_tasks(100, pg_backend_pid())").fetchall()))
            claim.start()
            wait_until(lambda: db.value("SELECT count(*) FROM pg_locks WHERE NOT granted"
                                        " AND relation = 'pgtaskpy.scheduling_lock'::regclass"), 10, 0.01,
                       "the claim waiting for the lock")
            if hold == "rate limit":
                alice.execute("SELECT task_limit('g', 1, '1 hour')")
            else:
                db.sql("ALTER ROLE lock_alice SET pg_task_py.role_running_limit = 1")
            holder.execute("COMMIT")
            claim.join(10)
        assert len(claimed["rows"]) == 1, claimed
    finally:
        db.sql("DELETE FROM task WHERE owner = 'lock_alice'")
        db.sql("DELETE FROM pgtaskpy.group_limit WHERE owner = 'lock_alice'")
        db.sql("ALTER ROLE lock_alice RESET ALL")
        db.sql("DROP OWNED BY lock_alice")
        db.sql("DROP ROLE lock_alice")


def test_a_plain_reindex_of_the_table_under_load_fails_no_task(db):
    """A plain `REINDEX TABLE task` holds each index it has rebuilt and waits for the next, which
    a worker's earlier read in the same transaction holds, while the worker's start or end waits
    for REINDEX's lock on the table.  The worker tried its change again in that transaction,
    lost the same deadlock every time, and tasks that had run ended FAIL as lost runs (08006),
    tasks that had not FAIL 40P01 (a probe: 5 tasks in 640 beside 40 REINDEXes; this test, in
    2 runs of 3).  It commits before it tries again now.  REINDEX may lose the deadlock, as may
    a launcher's turn (it runs again): neither is a task's."""
    db.sql(f"ALTER DATABASE {db.name} SET deadlock_timeout = '100ms'")  # (cycles broken at once)
    launcher = db.launcher()
    with db.connect() as dba:
        dba.autocommit = True
        for _ in range(60):
            db.sql("INSERT INTO task (\"group\", input)"
                   " SELECT 'g' || i % 4, 'SELECT pg_sleep(0.01)' FROM generate_series(1, 16) AS i")
            try:
                dba.execute("REINDEX TABLE task")
            except psycopg.errors.DeadlockDetected:
                pass
    db.wait_all_done(60)
    assert db.sql("SELECT id, state, sqlstate, error FROM task WHERE state <> 'DONE'") == []
    assert db.value("SELECT count(*) FROM task") == 960
    assert launcher.stop() == 0, launcher.output()
