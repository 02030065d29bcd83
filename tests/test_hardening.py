"""A hostile but ordinary task author (a LOGIN role with the README's grants) cannot cancel
others' queries, stall the scheduler for everyone, or make a task run twice; bad settings
fail only the tasks they apply to; bookkeeping stays right."""

from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_task_py_testing import Launcher, insert_as, wait_until

SCHEDULER_COLUMNS = {"start": "now()", "stop": "now()", "pid": "1", "worker": "1", "output": "'x'",
                     "error": "'x'", "notice": "'x'"}


@pytest.fixture
def authors(running):
    """alice and bob: LOGIN roles with the grants README gives, nothing more."""
    for role in ("alice", "bob"):
        running.sql(f"CREATE ROLE {role} LOGIN")
        running.sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON task TO {role}")
        running.sql(f"GRANT USAGE ON SEQUENCE task_id_seq TO {role}")
    yield {role: running.connect(role) for role in ("alice", "bob")}
    running.sql("DELETE FROM task")
    for role in ("alice", "bob"):
        running.sql(f"ALTER ROLE {role} RESET ALL")
        running.sql(f"DROP OWNED BY {role}")
        running.sql(f"DROP ROLE {role}")


def wait_state(db, task_id, state, timeout=20.0):
    wait_until(lambda: db.value("SELECT state::text FROM task WHERE id = %s", [task_id]) == state, timeout,
               message=f"task {task_id} to be {state}")


# --- Cancel anyone's query -------------------------------------------------------------------

def test_a_forged_running_task_cannot_cancel_a_superusers_query(running, authors):
    alice = authors["alice"]
    victim = running.connect()
    victim_pid = victim.info.backend_pid
    for state in ("WORK", "TAKE"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"denied to set task.state to {state}"):
            insert_as(alice, "SELECT 1", state=state, worker=victim_pid, remote="x")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to write task.worker"):
        insert_as(alice, "SELECT 1", worker=victim_pid)
    # Even a row that an admin wrote by hand with a stranger's pid in it cancels nothing:
    # task_cancel looks for the backend that really runs the task.
    forged = running.value("INSERT INTO task (state, worker, pid, remote, start, owner, input)"
                           " VALUES ('WORK', %s, %s, 'x', now(), 'alice', 'SELECT 1') RETURNING id",
                           [victim_pid, victim_pid])
    local = running.value("INSERT INTO task (state, worker, pid, start, owner, input)"
                          " VALUES ('WORK', %s, %s, now(), 'alice', 'SELECT 1') RETURNING id",
                          [victim_pid, victim_pid])
    sleeper = victim.execute("SELECT 1")  # the victim is idle between the cancels: any cancel would show below
    for task_id in (forged, local):
        assert alice.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (False,)
    # The privileged half checks the caller's right to the task itself.
    bobs = insert_as(authors["bob"], "SELECT pg_sleep(30)", delete=False)
    wait_state(running, bobs, "WORK")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied to cancel task {bobs}"):
        alice.execute("SELECT pgtaskpy.cancel_running_task(%s, false)", [bobs])
    assert sleeper is not None and victim.execute("SELECT pg_sleep(0.2), 'still here'").fetchone()[1] == "still here"
    assert running.value("SELECT state::text FROM task WHERE id = %s", [bobs]) == "WORK"
    assert authors["bob"].execute("SELECT task_cancel(%s)", [bobs]).fetchone() == (True,)
    row = running.wait_done(bobs)
    assert row["state"] == "FAIL" and row["error"].startswith("ERROR:  canceling statement due to user request")
    victim.close()


# --- Scheduler-owned columns -----------------------------------------------------------------

@pytest.mark.parametrize("column", sorted(SCHEDULER_COLUMNS))
def test_a_task_author_cannot_write_scheduler_columns(running, authors, column):
    alice = authors["alice"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied to write task.{column}"):
        alice.execute(f'INSERT INTO task (input, "{column}") VALUES (\'SELECT 1\', {SCHEDULER_COLUMNS[column]})')
    waiting = insert_as(alice, "SELECT 1", plan=running.value("SELECT now() + interval '1 hour'"))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied to write task.{column}"):
        alice.execute(f'UPDATE task SET "{column}" = {SCHEDULER_COLUMNS[column]} WHERE id = %s', [waiting])


@pytest.mark.parametrize("state", ["TAKE", "WORK", "DONE", "FAIL", "GONE"])
def test_a_task_author_inserts_only_in_plan_or_stop(running, authors, state):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied to set task.state to {state}"):
        insert_as(authors["alice"], "SELECT 1", state=state)


def test_a_running_task_is_never_started_twice_nor_hidden(running, authors):
    alice = authors["alice"]
    task_id = insert_as(alice, "SELECT pg_sleep(1), 'once'", delete=False)
    wait_state(running, task_id, "WORK")
    for state in ("PLAN", "DONE", "STOP"):
        with pytest.raises(psycopg.errors.ObjectInUse, match=f"task {task_id} is running"):
            alice.execute("UPDATE task SET state = %s WHERE id = %s", [state, task_id])
    with pytest.raises(psycopg.errors.ObjectInUse, match="only its data can change"):
        alice.execute("UPDATE task SET input = 'SELECT 2' WHERE id = %s", [task_id])
    # A DELETE hid it: its run went on, and no end, retry or next run was ever recorded.
    with pytest.raises(psycopg.errors.ObjectInUse, match=f"task {task_id} is running: it cannot be deleted"):
        alice.execute("DELETE FROM task WHERE id = %s", [task_id])
    alice.execute("UPDATE task SET data = 'progress: half' WHERE id = %s", [task_id])  # a task may report progress
    row = running.wait_done(task_id)
    assert row["state"] == "DONE" and row["output"].endswith("once") and row["data"] == "progress: half"
    assert row["worker"] is None and row["stop"] >= row["start"]  # finished rows keep no worker
    assert running.value("SELECT count(*) FROM task WHERE parent = %s OR id = %s", [task_id, task_id]) == 1


def test_a_superusers_stop_of_a_running_task_is_refused_not_taken(running):
    """pg_task's users stop tasks with UPDATE ... SET state = 'STOP', as superusers: of a running
    task it was taken, the row read STOP while its run went on and committed, and no end was
    ever recorded.  It is refused, with the hint that names task_cancel, whether or not the
    UPDATE stamps stop."""
    running.sql("CREATE TABLE ran (n integer)")
    task_id = running.insert("SELECT pg_sleep(1); INSERT INTO ran VALUES (1); SELECT 'finished'", delete=False)
    wait_state(running, task_id, "WORK")
    for update in ("UPDATE task SET state = 'STOP' WHERE id = %s",
                   "UPDATE task SET state = 'STOP', stop = now() WHERE id = %s"):
        with pytest.raises(psycopg.errors.ObjectInUse, match=f"task {task_id} is running: a STOP does not stop it"):
            running.sql(update, [task_id])
    row = running.wait_done(task_id)
    assert row["state"] == "DONE" and row["output"].endswith("finished")
    assert running.value("SELECT count(*) FROM ran") == 1


def test_a_superusers_delete_of_a_running_task_warns_that_its_run_goes_on(running):
    """An admin's DELETE of a running run (pg_cron's unschedule and TimescaleDB's delete_job done
    by hand) is a repair it may make, but its run went on unseen, without a word."""
    task_id = running.insert("SELECT pg_sleep(30)", delete=False)
    wait_state(running, task_id, "WORK")
    notices = []
    with running.connect() as admin:
        admin.add_notice_handler(lambda notice: notices.append((notice.severity, notice.message_primary,
                                                                notice.message_detail)))
        assert admin.execute("DELETE FROM task WHERE id = %s", [task_id]).rowcount == 1
    assert notices == [("WARNING", f"task {task_id} was running: its run goes on, and its end, retry and next run"
                                   " will not be written", "What it holds is free from the commit on: its group's"
                                   " place, its key, an exclusive task's hold; its dependents follow the deletion"
                                   " (after_any ones start).")], notices
    running.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'")


def test_stop_is_stamped_and_the_waiting_definition_can_change(running, authors):
    alice = authors["alice"]
    later = running.value("SELECT now() + interval '1 hour'")
    stopped = insert_as(alice, "SELECT 1", state="STOP", plan=later)
    waiting = insert_as(alice, "SELECT 1", plan=later)
    alice.execute("UPDATE task SET input = 'SELECT 2', max = 3 WHERE id = %s", [waiting])
    by_update = insert_as(alice, "SELECT 3", plan=later)
    alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [by_update])
    by_cancel = insert_as(alice, "SELECT 4", plan=later)
    assert alice.execute("SELECT task_cancel(%s)", [by_cancel]).fetchone() == (True,)
    for task_id in (stopped, by_update, by_cancel):
        assert running.value("SELECT stop IS NOT NULL AND state = 'STOP' FROM task WHERE id = %s", [task_id])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="task.state to PLAN"):
        alice.execute("UPDATE task SET state = 'PLAN' WHERE id = %s", [stopped])
    assert running.value("SELECT input FROM task WHERE id = %s", [waiting]) == "SELECT 2"


def test_an_admin_may_repair_rows_by_hand(running, authors):
    running.sql("GRANT pgtaskpy_admin TO alice")
    task_id = insert_as(authors["alice"], "SELECT 1", state="FAIL", error="repaired by hand", owner="alice")
    assert running.value("SELECT error FROM task WHERE id = %s", [task_id]) == "repaired by hand"
    running.sql("REVOKE pgtaskpy_admin FROM alice")


# --- Values that would stall the scheduler ---------------------------------------------------

@pytest.mark.parametrize(("column", "value", "constraint"), [
    ("max", -2147483648, "task.max must be at least -2147483647"),
    ("active", "100000000 years", "task.active, live and repeat must be at most 1000 years"),
    ("repeat", "100000000 years", "task.active, live and repeat must be at most 1000 years"),
    ("live", "1001 years", "task.active, live and repeat must be at most 1000 years"),
    ("repeat", "1 mon -30 days", "without negative parts"),
    ("timeout", "25 days", "task.timeout must be at most 2147483.647 seconds"),
    ("plan", "infinity", "task.plan must be a finite time from 1900 to 9999"),
    ("plan", "-infinity", "task.plan must be a finite time from 1900 to 9999"),
    ("plan", "10000-01-01", "task.plan must be a finite time from 1900 to 9999"),
    # (a key of the counters: a longer one failed their index at the task's end, every turn)
    ("group", "x" * 1001, "task.group must not be over 1000 bytes"),
])
def test_values_the_scheduler_cannot_compute_with_are_rejected(running, authors, column, value, constraint):
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint) as caught:
        insert_as(authors["alice"], "SELECT 1", **{column: value})
    assert constraint in caught.value.diag.constraint_name
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        running.sql(f'INSERT INTO task (input, "{column}") VALUES (\'SELECT 1\', %s)', [value])  # superusers too


def test_a_null_group_is_refused_naming_the_group(running, authors):
    """NOT NULL named the hash the group makes: 'null value in column "hash"'."""
    match = 'null value in column "group" of relation "task" violates not-null constraint'
    with pytest.raises(psycopg.errors.NotNullViolation, match=match) as caught:
        insert_as(authors["alice"], "SELECT 1", group=None)
    assert caught.value.diag.column_name == "group"
    task_id = insert_as(authors["alice"], "SELECT 1", plan=running.value("SELECT now() + interval '1 day'"))
    with pytest.raises(psycopg.errors.NotNullViolation, match=match):
        authors["alice"].execute('UPDATE task SET "group" = NULL WHERE id = %s', [task_id])


def test_the_bounds_themselves_run(running):
    task_id = running.insert("SELECT 1", max=-2147483647, timeout="2147483.647 s", active="1000 years",
                             delete=False)
    row = running.wait_done(task_id)
    assert row["state"] == "DONE" and row["max"] == -2147483647


def test_an_error_following_a_task_fails_that_task_only(running, authors):
    """A DBA's trigger refuses the next run of one series: that run ends FAIL with the reason,
    and everyone else's tasks go on (the launcher's turn never fails for everyone)."""
    running.sql("""CREATE FUNCTION refuse_repeats() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN RAISE EXCEPTION 'no more runs of %', NEW.input; END $$""")
    running.sql("CREATE TRIGGER refuse_repeats BEFORE INSERT ON task FOR EACH ROW"
                " WHEN (NEW.parent IS NOT NULL AND NEW.data = 'refused') EXECUTE FUNCTION refuse_repeats()")
    try:
        refused = insert_as(authors["alice"], "SELECT 'first'", repeat="1 s", data="refused", delete=False)
        row = running.wait_done(refused)
        assert row["state"] == "FAIL" and row["output"] == "first"
        assert row["error"] == "ERROR:  what follows the task failed: no more runs of SELECT 'first'"
        assert running.value("SELECT count(*) FROM task WHERE parent = %s", [refused]) == 0
        # Counted once, as the FAIL it ended: not as a DONE turned FAIL by hand too.
        assert running.sql("SELECT done_total, fail_total FROM task_stats WHERE owner = %s AND \"group\" = %s",
                           [row["owner"], row["group"]]) == [(0, 1)]
        assert running.wait_done(insert_as(authors["bob"], "SELECT 'others run'"))["output"] == "others run"
        assert "scheduler error" not in running.launchers[0].output()
    finally:
        running.sql("DROP TRIGGER refuse_repeats ON task")
        running.sql("DROP FUNCTION refuse_repeats()")


def test_an_authors_bulk_of_finished_rows_is_counted_a_batch_a_turn(db):
    """Each finished row an author inserts (or moves, or deletes) is a change of task_stats'
    counters, which the launcher adds up under the scheduling lock: a bulk of 1,000,000, added
    up in one call, held every role's claims 12 s.  A call adds whole groups of about 5,000
    changes (40-60 ms of a 2-core machine); the launcher's next turns go on with the rest, and
    the totals come out whole."""
    db.sql("CREATE ROLE alice LOGIN")
    db.sql("GRANT pgtaskpy_user TO alice")
    try:
        with db.connect("alice") as alice:
            alice.execute("INSERT INTO task (input, state, \"group\") SELECT 'x', 'STOP', 'g' || i"
                          " FROM generate_series(1, 25000) AS i")
        assert db.sql("SELECT folded, more FROM pgtaskpy.fold_group_counts()") == [(5000, True)]
        assert db.value("SELECT count(*) FROM pgtaskpy.group_count_changes") == 20000
        assert db.value("SELECT sum(stop_total) FROM task_stats WHERE owner = 'alice'") == 25000  # (pending too)
        db.launcher()
        wait_until(lambda: db.value("SELECT count(*) FROM pgtaskpy.group_count_changes") == 0, 30,
                   message="the launcher's turns to add up the rest")
        assert db.sql("SELECT count(*), sum(stop) FROM pgtaskpy.group_counts WHERE owner = 'alice'") == [(25000, 25000)]
        assert db.value("SELECT sum(stop_total) FROM task_stats WHERE owner = 'alice'") == 25000
        assert db.wait_done(db.insert("SELECT 'others run'", delete=False))["output"] == "others run"
    finally:
        db.sql("DELETE FROM task WHERE owner = 'alice'")
        db.sql("DROP OWNED BY alice")
        db.sql("DROP ROLE alice")


@pytest.mark.parametrize("how", ["RENAME TO zed_renamed", "DROP"])
def test_a_series_whose_owner_is_dropped_or_renamed_ends_with_a_clear_error(running, how):
    """Each run failed to log in, and the series went on failing for ever; a role created later
    with the old name would have run it."""
    running.sql("CREATE ROLE zed LOGIN")
    running.sql("GRANT SELECT, INSERT, UPDATE, DELETE ON task TO zed")
    running.sql("GRANT USAGE ON SEQUENCE task_id_seq TO zed")
    try:
        with running.connect("zed") as zed:
            first = insert_as(zed, "SELECT 'ran'", repeat="1 s", delete=False)
        assert running.wait_done(first)["output"] == "ran"
        running.sql("DROP OWNED BY zed")  # (as a DBA would first: the grants)
        running.sql(f"ALTER ROLE zed {how}" if how != "DROP" else "DROP ROLE zed")
        failed = wait_until(lambda: running.value(
            "SELECT id FROM task WHERE owner = 'zed' AND state = 'FAIL'"), 20, message="the series' run to FAIL")
        row = running.task(failed)
        assert row["error"].startswith("ERROR:  could not open the task's session: "), row["error"]
        assert 'HINT:  No role is named "zed" any more (dropped, or renamed): the task ends' in row["error"]
        assert row["repeat"] == timedelta(0)
        assert running.value("SELECT count(*) FROM task WHERE owner = 'zed' AND state = 'PLAN'") == 0
    finally:
        running.sql("DELETE FROM task WHERE owner = 'zed'")
        running.sql("DROP ROLE IF EXISTS zed_renamed")
        running.sql("DROP ROLE IF EXISTS zed")


def test_a_task_of_a_role_that_may_not_log_in_fails_08001_with_the_hint_and_is_retried(running):
    """NOLOGIN, or CONNECT revoked: the task ends FAIL 08001 with the server's reason and the hint,
    and a retry (08 is in the default retry_on) runs once the role may log in again.  A Python
    error in the hint's text failed it as a worker that failed three times, with no retry."""
    running.sql("CREATE ROLE erin NOLOGIN")
    running.sql("GRANT pgtaskpy_user TO erin")
    try:
        first = running.insert("SELECT 'ran'", owner="erin", retry=2, retry_delay="2 s", delete=False)
        failed = running.wait_done(first)
        assert (failed["state"], failed["sqlstate"]) == ("FAIL", "08001"), failed
        assert 'role "erin" is not permitted to log in' in failed["error"], failed["error"]
        assert "check the role exists with LOGIN and may CONNECT to the database" in failed["error"], failed["error"]
        running.sql("ALTER ROLE erin LOGIN")
        retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2", [first]), 20,
                           message="the retry of the failed login")
        assert running.wait_done(retry)["output"] == "ran"
    finally:
        running.sql("DELETE FROM task WHERE owner = 'erin'")
        running.sql("DROP OWNED BY erin")
        running.sql("DROP ROLE erin")


def test_an_authors_lock_on_its_waiting_task_holds_back_no_other_roles_task_of_the_group(running, authors):
    """README's Guarantees: a client's lock on a waiting task holds back that task alone.  alice
    holds her due task, first in the default group's order (max 5), and bob's tasks of that group
    start meanwhile.  The launcher's claim ranked her row first, skipped it, and claimed none of the
    group's: every role's tasks there waited as long as she held it (a probe)."""
    alice, bob = authors["alice"], authors["bob"]
    held = insert_as(alice, "SELECT 'held'", max=5, delete=False,
                     plan=running.value("SELECT now() + interval '1 s'"))
    with alice.transaction():
        alice.execute("SELECT FROM task WHERE id = %s FOR UPDATE", [held])
        wait_until(lambda: running.value("SELECT plan < now() - interval '0.3 s' FROM task WHERE id = %s", [held]),
                   10, 0.02, "the held task to be due")
        bobs = [insert_as(bob, f"SELECT {n}", delete=False) for n in range(3)]
        rows = [running.wait_done(task_id, 15) for task_id in bobs]
        assert [(row["state"], row["output"]) for row in rows] == [("DONE", str(n)) for n in range(3)], rows
        assert max(row["start"] - row["plan"] for row in rows) < timedelta(seconds=5), rows
        assert running.value("SELECT state::text FROM task WHERE id = %s", [held]) == "PLAN"  # (still held)
    row = running.wait_done(held, 10)  # and it runs once its author lets go
    assert (row["state"], row["output"]) == ("DONE", "held"), row


# --- Settings that would break everything ----------------------------------------------------

def test_a_bad_role_running_limit_fails_only_that_roles_tasks(running, authors):
    running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = 'abc'")
    alices = insert_as(authors["alice"], "SELECT 1")
    bobs = insert_as(authors["bob"], "SELECT 'bob runs'")
    assert running.wait_done(bobs)["output"] == "bob runs"
    row = running.wait_done(alices)
    assert row["state"] == "FAIL"
    assert row["error"] == ('ERROR:  invalid value for setting "pg_task_py.role_running_limit" of role "alice": "abc"\n'
                            "HINT:  It must be a whole number of tasks: ALTER ROLE alice SET"
                            " pg_task_py.role_running_limit = 4, or RESET it.\nSTATEMENT:  SELECT 1")
    running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = 2")
    assert running.wait_done(insert_as(authors["alice"], "SELECT 'fixed'"))["output"] == "fixed"


@pytest.mark.parametrize("default", ["ALTER ROLE ALL", "ALTER DATABASE {db}"])
def test_a_bad_default_role_running_limit_says_where_it_is_set(running, authors, default):
    """A default for every role (ALTER ROLE ALL, ALTER DATABASE) was not read: a value that is not
    a whole number fails the tasks of the roles it applies to, and names the command to fix."""
    default = default.format(db=running.name)
    running.sql("ALTER ROLE bob SET pg_task_py.role_running_limit = 5")  # (bob's own goes first)
    running.sql(f"{default} SET pg_task_py.role_running_limit = 'abc'")
    try:
        alices = insert_as(authors["alice"], "SELECT 1")
        bobs = insert_as(authors["bob"], "SELECT 'bob runs'")
        assert running.wait_done(bobs)["output"] == "bob runs"
        row = running.wait_done(alices)
        assert row["error"] == ('ERROR:  invalid value for setting "pg_task_py.role_running_limit" of role "alice":'
                                f' "abc"\nHINT:  It must be a whole number of tasks: {default} SET'
                                " pg_task_py.role_running_limit = 4, or RESET it.\nSTATEMENT:  SELECT 1"), row
    finally:
        running.sql(f"{default} RESET pg_task_py.role_running_limit")
    assert running.wait_done(insert_as(authors["alice"], "SELECT 'fixed'"))["output"] == "fixed"


def test_a_role_running_limit_of_ten_or_more_digits_is_a_whole_number(running, authors):
    """Past integer's range it means no limit: it was taken for "not a whole number", and every
    due task of the role ended FAIL."""
    running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = '10000000000'")
    try:
        assert running.wait_done(insert_as(authors["alice"], "SELECT 'runs'"))["output"] == "runs"
    finally:
        running.sql("ALTER ROLE alice RESET pg_task_py.role_running_limit")


@pytest.mark.parametrize("value", ["lots", "²"])  # (a digit to str.isdigit, not to int())
def test_a_bad_output_limit_fails_the_databases_tasks_cleanly(running, value):
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = '{value}'")
    try:
        row = running.wait_done(running.insert("SELECT 1"))
        assert row["state"] == "FAIL"
        assert row["error"].startswith(
            f'ERROR:  invalid value for setting "pg_task_py.output_limit" of database {running.name}: "{value}"\n'
            "HINT:  It must be a whole number of characters")
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.output_limit")
    # The value is read afresh (at most a second old): the next tasks run.
    wait_until(lambda: running.wait_done(running.insert("SELECT 'ok'"))["state"] == "DONE", 10,
               message="tasks to run again after RESET")
    assert "Traceback" not in running.launchers[0].output()
    assert "worker failed" not in running.launchers[0].output()


def test_a_retention_of_thousands_of_years_keeps_the_rows_and_scheduling_goes_on(running):
    """now() - '7000 years' is out of range: every launcher turn of the database failed."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention = '7000 years'")
    try:
        kept = running.wait_done(running.insert("SELECT 'kept'", delete=False))
        # Housekeeping runs once a second: a task planned 2.5 s on has seen it run twice.
        running.wait_done(running.insert("SELECT 1", plan=running.value("SELECT now() + interval '2.5 s'")))
        assert running.task(kept["id"])["output"] == "kept"
        assert "scheduler error" not in running.launchers[0].output()
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.retention")


def test_a_task_author_cannot_change_a_tasks_id(running, authors):
    """Its dependents name it by id: a changed id left them waiting for ever."""
    alice = authors["alice"]
    prerequisite = insert_as(alice, "SELECT 1", plan=running.value("SELECT now() + interval '1 day'"), delete=False)
    dependent = alice.execute("INSERT INTO task (input, after) VALUES ('SELECT 2', %s) RETURNING id",
                              [[prerequisite]]).fetchone()[0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to change task.id"):
        alice.execute("UPDATE task SET id = id + 1000 WHERE id = %s", [prerequisite])
    alice.execute("UPDATE task SET plan = now() WHERE id = %s", [prerequisite])
    assert running.wait_done(dependent)["state"] == "DONE"


def test_a_timeout_under_a_millisecond_is_one(running):
    """statement_timeout is in whole milliseconds: 0.9 ms cut to 0 was no timeout at all."""
    row = running.wait_done(running.insert("SELECT pg_sleep(1.5)", timeout="0.9 ms", delete=False))
    assert row["state"] == "FAIL" and row["sqlstate"] == "57014"


def test_an_exclusive_task_its_owner_may_not_run_holds_nothing_back(running, authors):
    """A role running limit of 0 keeps the owner's exclusive task from being claimed: while it
    counted as due, every role's tasks waited for it (until its `active` ran out)."""
    running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = 0")
    exclusive = running.insert("SELECT 1", exclusive=True, owner="alice", delete=False)
    try:
        bobs = insert_as(authors["bob"], "SELECT 'bob runs'")
        assert running.wait_done(bobs)["output"] == "bob runs"
        assert running.task(exclusive)["state"] == "PLAN"
    finally:
        running.sql("ALTER ROLE alice RESET pg_task_py.role_running_limit")


@pytest.mark.slow
def test_retention_is_read_afresh_and_covers_stop_rows(db):
    db.sql(f"ALTER DATABASE {db.name} SET pg_task_py.retention = '0'")
    launcher = db.launcher()  # its session starts with the setting
    stopped = db.insert("SELECT 1", state="STOP")
    done = db.insert("SELECT 1", delete=False)
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE id IN (%s, %s)", [stopped, done]) == 0, 10,
               message="finished and STOP rows past retention to be deleted")
    db.sql(f"ALTER DATABASE {db.name} RESET pg_task_py.retention")
    kept = db.wait_done(db.insert("SELECT 'kept'", delete=False))["id"]
    # Housekeeping runs once a second: a task planned 2.5 s on has seen it run twice.
    db.wait_done(db.insert("SELECT 1", plan=db.value("SELECT now() + interval '2.5 s'")))
    assert db.value("SELECT output FROM task WHERE id = %s", [kept]) == "kept"
    assert launcher.stop() == 0


# --- Bookkeeping -----------------------------------------------------------------------------

def test_orphan_recovery_knows_this_databases_workers(running, cluster):
    """A WORK row naming a backend that is alive but is no worker of this database (a restored
    copy's row, a reused pid; after a failover, the pid of the new primary's launcher, connected
    while it was a standby) is recovered all the same."""
    launcher_backend = running.value(  # (named so during its turns, where recovery runs)
        "SELECT pid FROM pg_stat_activity WHERE application_name IN ('pg_task_py', 'pg_task_py launcher')"
        " AND datname = current_database()")
    with cluster.connect("postgres", application_name="pg_task_py worker") as elsewhere, \
            running.connect() as here:
        rows = [running.value("INSERT INTO task (state, worker, start, input) VALUES ('WORK', %s, now(), 'SELECT 1')"
                              " RETURNING id", [pid])
                for pid in (elsewhere.info.backend_pid, here.info.backend_pid, launcher_backend)]
        taken = running.value("INSERT INTO task (state, worker, input) VALUES ('TAKE', %s, 'SELECT ''again''')"
                              " RETURNING id", [elsewhere.info.backend_pid])
        for task_id in rows:
            row = running.wait_done(task_id)
            assert row["state"] == "FAIL"
            assert row["error"].startswith("ERROR:  task worker ended before the task finished")
        assert running.wait_done(taken)["output"] == "again"  # back to PLAN, then run once



def test_a_retry_set_under_another_roles_task_is_not_that_tasks_retry(running, authors):
    """An author may set the parent of her tasks, a waiting retry's too; the scheduler's uses of
    a lineage match the owner.  A probe: alice set her retry's parent to bob's running task; his
    dependent inserted while it ran was handed to her retry when it failed, and ran when she let
    it; and a series of hers took its next plan from a plan of bob's she cannot read."""
    alice, bob = authors["alice"], authors["bob"]
    first = insert_as(alice, "SELECT 1/0", retry=1, retry_delay="1 day", retry_on=["*"], repeat="1 day",
                      delete=False)
    retry = wait_until(lambda: running.value("SELECT id FROM task WHERE parent = %s AND attempt = 2", [first]),
                       20, message="alice's retry")
    prerequisite = insert_as(bob, "SELECT pg_sleep(60)", delete=False)
    wait_state(running, prerequisite, "WORK")
    alice.execute("UPDATE task SET parent = %s, input = 'SELECT 1' WHERE id = %s", [prerequisite, retry])
    with running.connect("bob") as open_insert:
        open_insert.execute("BEGIN")
        dependent = insert_as(open_insert, "SELECT 'ran'", after=[prerequisite], delete=False)
        bob.execute("SELECT task_cancel(%s)", [prerequisite])
        wait_state(running, prerequisite, "FAIL")
        open_insert.execute("COMMIT")
    assert running.task(dependent)["state"] == "STOP", running.task(dependent)
    assert running.task(dependent)["error"] == f"ERROR:  prerequisite task {prerequisite} ended FAIL"
    # Her retry runs, and her series' next run follows it (its first attempt is no longer in its
    # lineage): not a day after bob's plan.
    bobs = insert_as(bob, "SELECT 1", plan="2031-07-04 03:17:00+00")
    alice.execute("UPDATE task SET parent = %s, plan = now() WHERE id = %s", [bobs, retry])
    assert running.wait_done(retry)["state"] == "DONE"
    next_plan = wait_until(lambda: running.value("SELECT plan FROM task WHERE parent = %s AND state = 'PLAN'",
                                                 [retry]), 20, message="the series' next run")
    assert next_plan - running.task(retry)["plan"] == timedelta(days=1)

# --- Property: whatever a task author inserts, other roles' tasks keep running ---------------

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
intervals = st.one_of(
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2)),
    st.sampled_from(["100000000 years", "1000 years", "1 mon -30 days", "-1 s", "25 days", "0"]),
)
author_rows = st.fixed_dictionaries(
    {"input": st.one_of(st.sampled_from(["SELECT 1", "SELECT 1/0", "SELECT pg_sleep(0.01)", "SELEC", ";"]), texts)},
    optional={
        "plan": st.sampled_from(["infinity", "-infinity", "now", "1899-12-31", "9999-12-31", "epoch"]),
        "active": intervals, "live": intervals, "timeout": intervals, "repeat": intervals,
        "count": st.integers(-3, 2**31 - 1), "max": st.integers(-(2**31), 2**31 - 1),
        "state": st.sampled_from(["PLAN", "TAKE", "WORK", "DONE", "FAIL", "STOP", "GONE"]),
        "start": st.just("now"), "stop": st.just("now"), "pid": st.integers(0, 2**31 - 1),
        "worker": st.integers(0, 2**31 - 1), "output": texts, "error": texts, "notice": texts,
        "delete": st.booleans(), "drift": st.booleans(), "header": st.booleans(), "string": st.booleans(),
        "save": st.booleans(), "delimiter": texts, "escape": texts, "quote": texts, "null": texts,
        "data": texts, "group": texts, "remote": st.one_of(st.none(), texts), "parent": st.integers(-5, 5),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=author_rows)
def test_whatever_an_author_inserts_other_roles_tasks_run(running, authors, values):
    try:
        insert_as(authors["alice"], **values)
    except psycopg.Error as exc:
        # A clear SQL error: bad data (22), a rejected value (23), no right (42), running (55).
        assert exc.sqlstate[:2] in ("22", "23", "42", "55"), (exc.sqlstate, str(exc))
    bobs = insert_as(authors["bob"], "SELECT 'bob runs'")
    assert running.wait_done(bobs, 20)["output"] == "bob runs"
    assert running.launchers[0].process.poll() is None


def test_the_launcher_never_logs_a_password(tmp_path):
    launcher = Launcher("host=/nonexistent port=1 dbname=app password=hunter2", log_dir=tmp_path).start()
    try:
        wait_until(lambda: "cannot connect" in launcher.output(), 15, message="a connection attempt to be logged")
    finally:
        assert launcher.stop() == 0
    assert "dbname=app" in launcher.output() and "hunter2" not in launcher.output()


def launcher_peak_mib(launcher: Launcher) -> float:
    """The launcher process's peak resident memory (VmHWM), MiB."""
    status = open(f"/proc/{launcher.process.pid}/status").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def test_a_notify_flood_on_the_wake_channel_does_not_grow_the_launcher(db):
    """Any role may NOTIFY the launcher's channel: a role with no grants sends 240 MB of payloads
    at once, which reach the launcher at the end of a turn.  It keeps none of them (it held every
    one until its next wait: 830 MB for 100,000), and goes on scheduling."""
    launcher = db.launcher()
    db.wait_done(db.insert("SELECT 1"))
    before = launcher_peak_mib(launcher)
    db.sql("CREATE ROLE flooder LOGIN")
    try:
        with db.connect("flooder") as flooder:
            flooder.execute("SELECT count(pg_notify('pg_task_py', repeat('x', 7990) || g))"
                            " FROM generate_series(1, 30000) AS g")
        wait_until(lambda: db.value("SELECT pg_notification_queue_usage()") == 0, 60,
                   message="the launcher's session to read every notification")
        assert db.wait_done(db.insert("SELECT 'after'"), 30)["output"] == "after"
        assert launcher_peak_mib(launcher) - before < 60
    finally:
        db.sql("DROP ROLE flooder")


def refusing(running, what, condition):
    """A DBA's trigger on task that raises "the DBA refuses the `what` of <id>" on `condition`."""
    running.sql(f"CREATE FUNCTION refuse_{what}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF {condition} THEN RAISE EXCEPTION 'the DBA refuses the {what} of %', NEW.id; END IF;"
                " RETURN NEW; END $$")
    running.sql(f"CREATE TRIGGER refuse_{what} BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION refuse_{what}()")
    yield
    running.sql(f"DROP TRIGGER refuse_{what} ON task")
    running.sql(f"DROP FUNCTION refuse_{what}()")


@pytest.fixture
def refusing_trigger(running):
    """A DBA's trigger on task that refuses the start of tasks whose input says poison-start."""
    yield from refusing(running, "start", "NEW.state = 'WORK' AND NEW.input LIKE '%poison-start%'")


def test_a_start_a_trigger_refuses_fails_that_task_alone_in_a_burst(running, refusing_trigger):
    """A burst's worker marked its tasks WORK one by one, and the refused one failed its whole call:
    tasks of the batch that had run ended FAIL as lost runs, others never ran."""
    running.sql("CREATE TABLE ran (id bigint PRIMARY KEY)")
    with running.conn.transaction():
        running.sql("INSERT INTO task (input, \"group\", delete)"
                    " SELECT 'INSERT INTO ran VALUES (current_setting(''pg_task.id'')::bigint)', 'b' || g, false"
                    " FROM generate_series(1, 150) AS g")
        poison = running.insert("SELECT 1 /* poison-start */", group="bp", delete=False)
    running.wait_all_done(60)
    row = running.task(poison)
    assert row["state"] == "FAIL" and "the DBA refuses the start of" in row["error"], row
    assert row["error"].startswith("ERROR:  could not start the task: "), row
    assert row["sqlstate"] == "P0001", row  # (the trigger's: retry_on can name it)
    others = running.sql("SELECT state::text, count(*) FROM task WHERE id <> %s GROUP BY 1", [poison])
    assert others == [("DONE", 150)], others
    assert running.value("SELECT count(*) FROM ran") == 150


def test_a_start_a_trigger_refuses_fails_that_task_alone_in_a_group(running, refusing_trigger):
    """In a group that runs one task at a time, which workers go on with: the task before the
    refused one ends DONE, the refused one FAIL with the trigger's error, the one after runs."""
    first = running.insert("SELECT pg_sleep(0.3)", group="one_at_a_time", max=0, delete=False)
    poison = running.insert("SELECT 1 /* poison-start */", group="one_at_a_time", max=0, delete=False)
    last = running.insert("SELECT 'after'", group="one_at_a_time", max=0, delete=False)
    assert running.wait_done(first)["state"] == "DONE"
    row = running.wait_done(poison)
    assert row["state"] == "FAIL" and "the DBA refuses the start of" in row["error"], row
    assert running.wait_done(last)["output"] == "after"


@pytest.fixture
def skipping_trigger(running):
    """A DBA's trigger on task that returns NULL for the start of tasks whose input says
    skip-start, so that the start's UPDATE skips the row."""
    running.sql("CREATE FUNCTION skip_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
    running.sql("CREATE TRIGGER skip_start BEFORE UPDATE ON task FOR EACH ROW"
                " WHEN (OLD.state = 'TAKE' AND NEW.state = 'WORK' AND NEW.input LIKE '%skip-start%')"
                " EXECUTE FUNCTION skip_start()")
    yield
    running.sql("DROP TRIGGER skip_start ON task")
    running.sql("DROP FUNCTION skip_start()")


@pytest.mark.parametrize("burst", [False, True])
def test_a_start_a_trigger_skips_fails_that_task_alone(running, skipping_trigger, burst):
    """It was taken for a task stopped meanwhile: given back, claimed again, 50 times a second
    for good, the log silent."""
    if burst:
        running.sql("INSERT INTO task (input, \"group\", delete)"
                    " SELECT 'SELECT ' || g, 'b' || g, false FROM generate_series(1, 60) AS g")
    skipped = running.insert("SELECT 1 /* skip-start */", group="skipped", delete=False)
    row = running.wait_done(skipped)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "09000"), row
    assert row["error"] == ("ERROR:  could not start the task: a trigger on task made its start no start"
                            " (returned NULL)\nSTATEMENT:  SELECT 1 /* skip-start */"), row
    running.wait_all_done(60)
    assert running.value("SELECT count(*) FROM task WHERE state = 'DONE'") == (60 if burst else 0)


def test_an_end_a_trigger_refuses_holds_back_that_task_alone_in_a_burst(running):
    """A DBA's trigger that refused one task's end failed its burst worker's whole call: the other
    tasks of the batch, which had run, ended FAIL as lost runs.  That task now stays WORK (a launcher
    ends it once the trigger lets it), and the others end as they ran."""
    running.sql("CREATE FUNCTION refuse_end() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.state IN ('DONE', 'FAIL') AND NEW.input LIKE '%refuse-end%' THEN"
                " RAISE EXCEPTION 'the DBA refuses the end of %', NEW.id; END IF; RETURN NEW; END $$")
    running.sql("CREATE TRIGGER refuse_end BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION refuse_end()")
    try:
        with running.conn.transaction():
            # (first: in the burst's first batch, whose sessions open before the server is full;
            # the tasks refused a session wait, and run later, a few at a time)
            refused = running.insert("SELECT 'refuse-end'", group="refused", delete=False)
            running.sql("INSERT INTO task (input, \"group\", delete)"
                        " SELECT 'SELECT pg_sleep(0.2)', 'e' || g, false FROM generate_series(1, 150) AS g")
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id <> %s"
                                         " AND state IN ('PLAN', 'TAKE', 'WORK')", [refused]) == 0,
                   60, 0.1, "the other tasks to end")
        others = running.sql("SELECT state::text, count(*) FROM task WHERE id <> %s GROUP BY 1", [refused])
        assert others == [("DONE", 150)], others
        assert running.task(refused)["state"] == "WORK"
        # Its worker closes: kept idle (as the spare, for good), it held the task WORK with it.
        worker = running.task(refused)["worker"]
        wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [worker]) == 0,
                   5, 0.1, "the worker to close")
        # (logged as the turn that closed the worker returns: it may come just after the close)
        said = f"could not end task {refused}: the DBA refuses the end of {refused}"
        wait_until(lambda: said in running.launchers[0].output(), 10, 0.05, "the launcher to log the refused end")
        assert running.task(refused)["state"] == "WORK"  # (the trigger refuses FAIL too)
    finally:
        running.sql("DROP TRIGGER refuse_end ON task")
        running.sql("DROP FUNCTION refuse_end()")
    row = running.wait_done(refused, 15)
    assert row["state"] == "FAIL" and "task worker ended before the task finished" in row["error"], row


@pytest.fixture
def refusing_claims(running):
    """A DBA's trigger on task that refuses the claim (PLAN -> TAKE) of tasks whose input says
    poison-claim, and with `everything` in their data, every change of them."""
    yield from refusing(running, "claim", "NEW.input LIKE '%poison-claim%'"
                                          " AND (NEW.state = 'TAKE' OR NEW.data = 'everything')")


def test_a_claim_a_trigger_refuses_fails_that_task_alone(running, refusing_claims):
    """The launcher claims its tasks in one statement: a trigger refusing one task's claim failed
    it, every turn, and no task of the database started.  That task now ends FAIL with the
    trigger's error, and the others run; an exclusive task's claim, refused, fails it alone too."""
    with running.conn.transaction():
        running.sql("INSERT INTO task (input, \"group\", delete)"
                    " SELECT 'SELECT 1', 'c' || g, false FROM generate_series(1, 100) AS g")
        poison = running.insert("SELECT 1 /* poison-claim */", group="cp", delete=False)
    exclusive = running.insert("SELECT 3 /* poison-claim */", exclusive=True, delete=False)
    running.wait_all_done(60)
    for task_id in (poison, exclusive):
        row = running.task(task_id)
        assert row["state"] == "FAIL", row
        assert row["error"].startswith(f"ERROR:  could not claim the task: the DBA refuses the claim of {task_id}"), row
    assert running.value("SELECT count(*) FROM task WHERE \"group\" LIKE 'c%%' AND state = 'DONE'") == 100
    output = running.launchers[0].output()
    assert f"could not claim task {poison}: the DBA refuses the claim of {poison}" in output
    assert "scheduler error" not in output


def test_a_task_a_trigger_refuses_to_claim_and_to_fail_holds_back_no_other(running, refusing_claims):
    """Its claim and its end both refused, the task waits (the launcher says why), and holds back
    its group only."""
    poison = running.insert("SELECT 1 /* poison-claim */", data="everything", delete=False)
    wait_until(lambda: f"could not end task {poison} FAIL" in running.launchers[0].output(), 15,
               message="the launcher to try to fail the task")
    other = running.insert("SELECT 'others run'", group="other", delete=False)
    assert running.wait_done(other)["output"] == "others run"
    assert running.task(poison)["state"] == "PLAN"
    assert "scheduler error" not in running.launchers[0].output()
    running.sql("DELETE FROM task WHERE id = %s", [poison])  # (the trigger refuses no DELETE)


def test_a_claim_that_fails_for_the_server_s_trouble_fails_no_task(running):
    """An error that says nothing about the task (here a serialization failure, as no memory or
    disk would be) fails the launcher's turn, and the task is claimed once it passes: it does
    not end FAIL as a refused claim does."""
    running.sql("CREATE TABLE trouble (on_ boolean)")
    running.sql("INSERT INTO trouble VALUES (true)")
    running.sql("CREATE FUNCTION trouble() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.state = 'TAKE' AND EXISTS (SELECT FROM public.trouble) THEN"
                " RAISE EXCEPTION 'passing trouble' USING ERRCODE = 'serialization_failure'; END IF;"
                " RETURN NEW; END $$")
    running.sql("CREATE TRIGGER trouble BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION trouble()")
    try:
        task_id = running.insert("SELECT 'claimed after all'", delete=False)
        wait_until(lambda: "passing trouble" in running.launchers[0].output(), 15,
                   message="the launcher's turn to fail")
        assert running.task(task_id)["state"] == "PLAN"
        running.sql("DELETE FROM trouble")
        assert running.wait_done(task_id)["output"] == "claimed after all"
    finally:
        running.sql("DROP TRIGGER trouble ON task")
        running.sql("DROP FUNCTION trouble()")
        running.sql("DROP TABLE trouble")


def test_a_deletion_a_trigger_refuses_keeps_that_task_alone(running):
    """Retention deletes finished tasks a batch at a time: a DBA's trigger refusing one task's
    DELETE failed every launcher turn (only a foreign key's refusal was caught), and no task of
    the database started.  That task is kept, the others go, and tasks run."""
    running.sql("CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF OLD.input LIKE '%keep-me%' THEN RAISE EXCEPTION 'the DBA keeps %', OLD.id; END IF;"
                " RETURN OLD; END $$")
    running.sql("CREATE TRIGGER refuse_delete BEFORE DELETE ON task FOR EACH ROW EXECUTE FUNCTION refuse_delete()")
    try:
        ended = [running.wait_done(running.insert(f"SELECT {i} /* {'keep-me' if i == 1 else ''} */",
                                                  delete=False))["id"] for i in range(3)]
        running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.retention = '1 s'")
        wait_until(lambda: running.value("SELECT array_agg(id) FROM task WHERE id = ANY (%s)", [ended]) == [ended[1]],
                   15, message="the tasks the trigger lets go to be deleted")
        assert running.wait_done(running.insert("SELECT 'others run'"), 10)["output"] == "others run"
        wait_until(lambda: "a trigger refuses their DELETE" in running.launchers[0].output(), 70,
                   message="the launcher's word on the kept task")
        assert "scheduler error" not in running.launchers[0].output()
    finally:
        running.sql(f"ALTER DATABASE {running.name} RESET pg_task_py.retention")
        running.sql("DROP TRIGGER refuse_delete ON task")
        running.sql("DROP FUNCTION refuse_delete()")


@pytest.fixture
def deferred_refusal(running):
    """A DBA's deferred constraint trigger on task, which raises at the commit of a transaction
    that changed a task whose input says poison-<state> to that state; poison-TAKE refuses any
    claim, also a worker's that starts the task at once (PLAN -> WORK, in a session ready for it)."""
    running.sql("CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.input LIKE '%poison-' || NEW.state || '%'"
                " OR (NEW.input LIKE '%poison-TAKE%' AND OLD.state = 'PLAN' AND NEW.state = 'WORK') THEN"
                " RAISE EXCEPTION 'the DBA refuses % of %', NEW.state, NEW.id; END IF; RETURN NULL; END $$")
    running.sql("CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER UPDATE ON task DEFERRABLE INITIALLY DEFERRED"
                " FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()")
    yield
    running.sql("DROP TRIGGER refuse_at_commit ON task")
    running.sql("DROP FUNCTION refuse_at_commit()")


def test_a_transition_a_deferred_trigger_refuses_holds_back_that_task_alone(running, deferred_refusal):
    """A refusal at the commit failed the launcher's whole turn, or the worker's whole call: a
    claim refused so, or an expiry (GONE), held back every role's tasks, and a worker's end of a
    task that had run, committed with its claim of the group's next task (refused), ended it FAIL
    as a lost run.  The scheduler's transactions check deferred constraints at each statement."""
    # (Long enough for the worker to have the next task's session ready when it claims it.)
    first = running.insert("SELECT 'ran' FROM pg_sleep(0.5)", group="one_at_a_time", max=0, delete=False)
    claim = running.insert("SELECT 1 /* poison-TAKE */", group="one_at_a_time", max=0, delete=False)
    gone = running.insert("SELECT 2 /* poison-GONE */", plan="2020-01-01", active="1 s", delete=False)
    with running.conn.transaction():
        running.sql("INSERT INTO task (input, \"group\", delete)"
                    " SELECT 'SELECT 1', 'd' || g, false FROM generate_series(1, 100) AS g")
        burst_claim = running.insert("SELECT 3 /* poison-TAKE */", group="dp", delete=False)
    end = running.insert("SELECT 4 /* poison-DONE */", group="end", delete=False)
    assert running.wait_done(first)["output"] == "ran"
    for task_id in (claim, burst_claim):
        row = running.wait_done(task_id)
        assert row["state"] == "FAIL" and "could not claim the task: the DBA refuses TAKE" in row["error"], row
    wait_until(lambda: f"could not end task {gone} GONE" in running.launchers[0].output(), 15,
               message="the launcher to try to expire the task")
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE \"group\" LIKE 'd%%' AND state = 'DONE'")
               == 100, 30, message="the burst to run")
    assert running.wait_done(running.insert("SELECT 'others run'", group="other"), 10)["output"] == "others run"
    assert running.task(gone)["state"] == "PLAN"
    # Its end refused, its worker closes, and a launcher ends the run as lost (the trigger lets FAIL be).
    row = running.wait_done(end, 15)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row
    assert "scheduler error" not in running.launchers[0].output()
    running.sql("DROP TRIGGER refuse_at_commit ON task")
    assert running.wait_done(gone, 10)["state"] == "GONE"
    running.sql("CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER UPDATE ON task DEFERRABLE INITIALLY DEFERRED"
                " FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()")  # (for the fixture to drop)


@pytest.mark.parametrize("rewrite", ["RETURN NULL", "NEW.state := 'PLAN'; RETURN NEW"])
def test_a_claim_a_trigger_makes_no_claim_fails_that_task_alone(running, rewrite):
    """A BEFORE UPDATE trigger that skipped a task's claim (returned NULL) or turned it back to
    PLAN: the task, first in the order, was chosen at every turn and never claimed, the log
    silent; a hundred such took every claim, and no other task started.  Such a task ends FAIL."""
    running.sql("CREATE FUNCTION skip_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.state = 'TAKE' AND NEW.input LIKE '%poison-skip%' THEN " + rewrite + "; END IF;"
                " RETURN NEW; END $$")
    running.sql("CREATE TRIGGER skip_claim BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION skip_claim()")
    try:
        with running.conn.transaction():
            running.sql("INSERT INTO task (input, \"group\", max, delete)"
                        " SELECT 'SELECT 1 /* poison-skip */', 's' || g, 1, false FROM generate_series(1, 300) AS g")
        other = running.insert("SELECT 'others run'", group="other", max=0, delete=False)
        assert running.wait_done(other, 30)["output"] == "others run"
        running.wait_all_done(60)
        rows = running.sql("SELECT state::text, error, count(*) FROM task WHERE id <> %s GROUP BY 1, 2", [other])
        assert rows == [("FAIL", "ERROR:  could not claim the task: a trigger on task made its claim no claim"
                                 " (returned NULL, or another state or worker)\nSTATEMENT:  SELECT 1 /* poison-skip */",
                         300)], rows
        assert "a trigger on task made its claim no claim" in running.launchers[0].output()
    finally:
        running.sql("DROP TRIGGER skip_claim ON task")
        running.sql("DROP FUNCTION skip_claim()")
