"""Tasks run as their owner; each role sees and changes only its own tasks."""

from datetime import timedelta

import psycopg
import pytest
from pg_task_py_testing import Launcher, insert_as, most_at_once, wait_until


@pytest.fixture
def roles(running):
    for role in ("alice", "bob"):
        running.sql(f"CREATE ROLE {role} LOGIN")
        running.sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON task TO {role}")
        running.sql(f"GRANT USAGE ON SEQUENCE task_id_seq TO {role}")
    running.sql("CREATE TABLE bobs_secret (v text)")
    running.sql("GRANT SELECT ON bobs_secret TO bob")
    yield {role: running.connect(role) for role in ("alice", "bob")}
    running.sql("DELETE FROM task")
    running.sql("DROP TABLE bobs_secret")
    for role in ("alice", "bob"):
        running.sql(f"DROP OWNED BY {role}")
        running.sql(f"DROP ROLE {role}")


@pytest.mark.parametrize(
    ("input", "state", "result"),
    [
        ("SELECT current_user, session_user", "DONE", "current_user\tsession_user\nalice\talice"),
        ("RESET ROLE; SELECT current_user", "DONE", "RESET\nalice"),
        ("SET ROLE postgres", "FAIL", 'ERROR:  permission denied to set role "postgres"'),
        ("SET SESSION AUTHORIZATION postgres", "FAIL", 'ERROR:  permission denied to set session authorization'),
        ("SELECT * FROM bobs_secret", "FAIL", "ERROR:  permission denied for table bobs_secret"),
    ],
)
def test_task_runs_as_its_owner(running, roles, input, state, result):
    row = running.wait_done(insert_as(roles["alice"], input, delete=False))
    assert row["owner"] == "alice" and row["state"] == state
    assert (row["output"] if state == "DONE" else row["error"]).startswith(result)


def test_owner_cannot_be_forged(roles):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='task.owner to "postgres"'):
        insert_as(roles["alice"], "SELECT 1", owner="postgres")


def test_an_author_cannot_take_ids_ahead_of_the_sequence_that_another_roles_next_run_needs(running, roles):
    """An id the sequence gives later, inserted by a role, was the id the scheduler's insert of
    another role's next run got: that run ended FAIL (`duplicate key value violates unique
    constraint "task_pkey"`) and its series ended.  Ids below the sequence's stay free to give."""
    series = running.insert("SELECT 1", repeat="1 s", delete=False)
    ahead = running.value("SELECT last_value FROM task_id_seq") + 1
    alice = roles["alice"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied to choose task.id {ahead}"):
        insert_as(alice, "SELECT 1", id=ahead)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to choose task.id"):
        alice.execute("INSERT INTO task (id, input) SELECT %s + i, 'SELECT 1' FROM generate_series(0, 4) AS i",
                      [ahead])
    assert insert_as(alice, "SELECT 1", id=-7, plan="9999-12-31") == -7  # (never given: below the sequence's)
    third = wait_until(lambda: running.sql("SELECT id FROM task WHERE parent = (SELECT id FROM task"
                                           " WHERE parent = %s)", [series]), 20, message="two next runs")
    assert running.sql("SELECT state::text FROM task WHERE id = %s", [series]) == [("DONE",)], third
    running.sql("UPDATE task SET repeat = '0' WHERE state = 'PLAN' AND repeat > '0'")


def test_roles_see_and_change_only_their_own_tasks(running, roles):
    bobs = insert_as(roles["bob"], "SELECT 1", plan="9999-12-31", delete=False)
    alice = roles["alice"]
    assert alice.execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (0,)
    assert alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [bobs]).rowcount == 0
    assert alice.execute("UPDATE task SET input = 'SELECT 2' WHERE id = %s", [bobs]).rowcount == 0
    assert roles["bob"].execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (1,)
    running.sql("GRANT pgtaskpy_admin TO alice")
    assert alice.execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (1,)
    running.sql("REVOKE pgtaskpy_admin FROM alice")


@pytest.mark.parametrize("call", [
    "pgtaskpy.claim_due_tasks(10, 1)",
    "pgtaskpy.claim_next_task(1, NULL)",
    "pgtaskpy.upcoming_in_group(1, 2, 0, 'postgres', 'g')",  # (reads every owner's waiting tasks)
    "pgtaskpy.start_task(1, 1, 1)",
    "pgtaskpy.move_task_to_session(1, 1)",
    "pgtaskpy.finish_task(1, 'DONE', NULL, NULL)",
    "pgtaskpy.unclaim_tasks(NULL, 1)",
])
def test_scheduling_functions_are_not_for_users(roles, call):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"), \
            roles["alice"].transaction():
        roles["alice"].execute(f"SELECT * FROM {call}")




def most_of_each_role_at_once(running, roles):
    """alice and bob each insert 6 tasks of 0.3 s in groups of their own: the most of each that
    ran at once."""
    for role in ("alice", "bob"):
        roles[role].execute("INSERT INTO task (\"group\", input, delete)"
                            " SELECT %s || i, 'SELECT pg_sleep(0.3)', false FROM generate_series(1, 6) AS i", [role])
    running.wait_all_done(30)
    return [most_at_once(running.sql("SELECT start, stop FROM task WHERE owner = %s", [role]))
            for role in ("alice", "bob")]


def test_role_running_limit_caps_one_role(running, roles):
    running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = 2")
    alices, bobs = most_of_each_role_at_once(running, roles)
    assert alices == 2
    assert bobs > 2  # bob is not capped


def test_a_databases_role_running_limit_caps_every_role_below_their_own(running, roles):
    """ALTER DATABASE ... SET, a default for every role, as PostgreSQL applies it: a role's own
    setting goes first.  It was not read at all."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.role_running_limit = 1")
    running.sql("ALTER ROLE bob SET pg_task_py.role_running_limit = 3")
    alices, bobs = most_of_each_role_at_once(running, roles)
    assert alices == 1
    assert 1 < bobs <= 3


@pytest.mark.parametrize("hold", ["rate", "role_running_limit"])
@pytest.mark.parametrize("alices_max", [0, 5])
def test_a_roles_limit_does_not_hold_back_another_roles_tasks_of_the_group(running, roles, hold, alices_max):
    """A role's tasks that its own rate limit or role_running_limit holds back filled the shared
    group's first places in the claim's scan: another role's task of the group waited behind
    them for as long as the limit lasted (a rate of 1 in 1,000 years: for good)."""
    alice, bob = roles["alice"], roles["bob"]
    if hold == "rate":
        running.sql("GRANT pgtaskpy_user TO alice")
        alice.execute("SELECT task_limit('group', 1, '1000 years')")
    else:
        running.sql("ALTER ROLE alice SET pg_task_py.role_running_limit = 0")
    alice.execute("INSERT INTO task (input, max, delete) SELECT 'SELECT 1', %s, false FROM generate_series(1, 6)",
                  [alices_max])
    if hold == "rate":  # (its one start in the window)
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE owner = 'alice' AND state = 'DONE'") == 1,
                   20, message="alice's one start")
    bobs = insert_as(bob, "SELECT 'bob'", delete=False)
    assert running.wait_done(bobs, 20)["state"] == "DONE", running.task(bobs)
    assert running.value("SELECT count(*) FROM task WHERE owner = 'alice' AND state = 'PLAN'") == (
        5 if hold == "rate" else 6)
    running.sql("ALTER ROLE alice RESET ALL")


WEIRD = 'a"; DROP TABLE task; --'


def test_names_with_quotes_and_semicolons(running):
    running.sql(f'CREATE ROLE "{WEIRD.replace(chr(34), chr(34) * 2)}" LOGIN')
    quoted = '"' + WEIRD.replace('"', '""') + '"'
    running.sql(f"GRANT SELECT, INSERT ON task TO {quoted}")
    running.sql(f"GRANT USAGE ON SEQUENCE task_id_seq TO {quoted}")
    try:
        task_id = running.insert("SELECT current_user", group=WEIRD, owner=WEIRD, delete=False)
        row = running.wait_done(task_id)
        assert (row["state"], row["output"], row["group"]) == ("DONE", WEIRD, WEIRD)
        assert running.value("SELECT count(*) FROM task") >= 1  # the table is still there
    finally:
        running.sql("DELETE FROM task")
        running.sql(f"DROP OWNED BY {quoted}")
        running.sql(f"DROP ROLE {quoted}")


def test_extension_in_a_schema_that_needs_quotes(cluster, db):
    # (PostgreSQL itself refuses an extension schema with " $ ' or \ in its name.  A % was read as
    # format()'s by task_enqueue and the copy of a series' own columns: a review.)
    schema = "Odd Schema; 50%q name"
    quoted = '"' + schema.replace('"', '""') + '"'
    in_query = quoted.replace("%", "%%")  # (in a query with parameters)
    cluster.create_database(f"{db.name}_odd", extension=False)
    try:
        with cluster.connect(f"{db.name}_odd") as conn:
            conn.execute(f"CREATE SCHEMA {quoted}")
            conn.execute(f"CREATE EXTENSION pg_task_py SCHEMA {quoted} CASCADE")
            launcher = Launcher(cluster.dsn(f"{db.name}_odd")).start()
            launcher.wait_active()
            task_id = conn.execute(f"INSERT INTO {quoted}.task (input, delete) VALUES ('SELECT 42', false)"
                                   " RETURNING id").fetchone()[0]
            wait_until(lambda: conn.execute(f"SELECT output FROM {in_query}.task WHERE id = %s",
                                            [task_id]).fetchone()[0] == "42", message="the task")
            enqueued = conn.execute(f"SELECT {quoted}.task_enqueue('SELECT 43', data => 'x')").fetchone()[0]
            conn.execute(f"ALTER TABLE {quoted}.task ADD COLUMN customer text")
            series = conn.execute(f"INSERT INTO {quoted}.task (input, repeat, customer) VALUES ('SELECT 44', '1 hour',"
                                  " 'c') RETURNING id").fetchone()[0]
            assert wait_until(lambda: conn.execute(f"SELECT customer FROM {in_query}.task WHERE parent = %s",
                                                   [series]).fetchone(), message="the series' next run") == ("c",)
            assert conn.execute(f"SELECT input FROM {in_query}.task WHERE id = %s", [enqueued]).fetchone() == \
                ("SELECT 43",)
            assert launcher.stop() == 0
    finally:
        with cluster.connect() as admin:
            admin.execute(f"DROP DATABASE {db.name}_odd WITH (FORCE)")


def test_owner_without_login_or_dropped_fails_clearly(running, roles):
    running.sql("ALTER ROLE bob NOLOGIN")
    row = running.wait_done(insert_as(roles["bob"], "SELECT 1", delete=False))
    assert row["state"] == "FAIL"
    assert 'role "bob" is not permitted to log in' in row["error"]
    assert "HINT:  The task runs in a session logged in as its owner" in row["error"]
    running.sql("ALTER ROLE bob LOGIN")
    running.sql("CREATE ROLE dave LOGIN")
    running.sql("GRANT dave TO postgres")
    task_id = running.insert("SELECT 1", owner="dave", plan="9999-12-31", delete=False)
    running.sql("DROP ROLE dave")
    running.sql("UPDATE task SET plan = now() WHERE id = %s", [task_id])
    row = running.wait_done(task_id)
    assert row["state"] == "FAIL" and 'role "dave" does not exist' in row["error"]


def test_one_grant_makes_a_task_author(running):
    """GRANT pgtaskpy_user TO a role is all a DBA does: it enqueues, sees, stops and waits for its tasks."""
    running.sql("CREATE ROLE carol LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("carol") as carol:
            task_id = carol.execute("INSERT INTO task (input, delete) VALUES ('SELECT current_user', false)"
                                    " RETURNING id").fetchone()[0]
            assert carol.execute("SELECT state::text, output FROM task_wait(%s)", [task_id]).fetchone() == \
                ("DONE", "carol")
            later = carol.execute("SELECT task_enqueue('SELECT 1', now() + interval '1 hour')").fetchone()[0]
            assert carol.execute("SELECT task_cancel(%s)", [later]).fetchone() == (True,)
            carol.execute("UPDATE task SET data = 'mine' WHERE id = %s", [task_id])
            assert carol.execute("SELECT count(*) FROM task").fetchone() == (2,)
            carol.execute("DELETE FROM task")
    finally:
        running.sql("DROP OWNED BY carol")
        running.sql("DROP ROLE carol")


def test_a_task_holding_a_lock_on_the_table_can_still_be_cancelled(running):
    """A task author's task that locks `task` (an UPDATE waits for the lock) is cancelled by
    task_cancel at once, not after the task's own end (as only pg_cancel_backend could)."""
    running.sql("CREATE ROLE erin LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("erin") as erin:
            erin.autocommit = True
            task_id = erin.execute("SELECT task_enqueue('BEGIN; LOCK TABLE task IN SHARE MODE; SELECT pg_sleep(60)')"
                                   ).fetchone()[0]
            wait_until(lambda: running.value("SELECT count(*) FROM pg_locks WHERE relation = 'task'::regclass"
                                             " AND mode = 'ShareLock' AND granted") == 1, timeout=30)
            erin.execute("SET statement_timeout = '20s'")
            assert erin.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
            row = running.wait_done(task_id)
            assert (row["state"], row["sqlstate"]) == ("FAIL", "57014"), row
            assert row["stop"] - row["start"] < timedelta(seconds=30), row
    finally:
        running.sql("DROP OWNED BY erin")
        running.sql("DROP ROLE erin")


def test_a_member_of_pgtaskpy_admin_alone_sees_and_steers_every_roles_tasks(running):
    """README: members of pgtaskpy_admin see all; granted that role alone, one could steer groups
    but got `permission denied for table task` and for task_stats."""
    running.sql("CREATE ROLE ops_admin LOGIN IN ROLE pgtaskpy_admin")
    running.sql("CREATE ROLE ops_author LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("ops_author") as author:
            task_id = author.execute("SELECT task_enqueue('SELECT 1', now() + interval '1 hour')").fetchone()[0]
        with running.connect("ops_admin") as admin:
            assert admin.execute("SELECT owner FROM task WHERE id = %s", [task_id]).fetchone() == ("ops_author",)
            assert admin.execute("SELECT count(*) FROM task_stats WHERE owner = 'ops_author'").fetchone() == (1,)
            assert admin.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY ops_admin, ops_author")
        running.sql("DROP ROLE ops_admin, ops_author")


def test_a_task_authors_security_definer_function_called_by_a_superuser_keeps_the_authors_rules(running):
    """A superuser's session calls a task author's SECURITY DEFINER function.  The triggers decided
    with is_superuser, which is the session's: the author's code skipped every rule, inserted an
    exclusive task (the scheduler's mark for its own next runs set), and set its ended task back
    to PLAN, which ran again."""
    running.sql("CREATE ROLE svc LOGIN IN ROLE pgtaskpy_user")
    try:
        running.sql("CREATE FUNCTION svc_exclusive() RETURNS bigint LANGUAGE sql SECURITY DEFINER"
                    " AS $$ SELECT set_config('pgtaskpy.next_run', 'on', true);"
                    "       INSERT INTO task (input, exclusive) VALUES ('SELECT 1', true) RETURNING id $$")
        running.sql("CREATE FUNCTION svc_again(task_id bigint) RETURNS void LANGUAGE sql SECURITY DEFINER"
                    " AS $$ UPDATE task SET state = 'PLAN', start = NULL, stop = NULL, output = NULL"
                    "       WHERE id = task_id $$")
        running.sql("CREATE FUNCTION svc_delete(task_id bigint) RETURNS void LANGUAGE sql SECURITY DEFINER"
                    " AS $$ DELETE FROM task WHERE id = task_id $$")
        running.sql("ALTER FUNCTION svc_exclusive() OWNER TO svc")
        running.sql("ALTER FUNCTION svc_again(bigint) OWNER TO svc")
        running.sql("ALTER FUNCTION svc_delete(bigint) OWNER TO svc")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="make a task exclusive"):
            running.sql("SELECT svc_exclusive()")
        with running.connect("svc") as svc:
            ran = svc.execute("INSERT INTO task (input, delete) VALUES ('SELECT pg_sleep(60)', false)"
                              " RETURNING id").fetchone()[0]
        wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [ran]) == "WORK", 20, 0.02,
                   "svc's task to run")
        with pytest.raises(psycopg.errors.ObjectInUse, match="is running: it cannot be deleted"):
            running.sql("SELECT svc_delete(%s)", [ran])
        running.sql("SELECT task_cancel(%s)", [ran])
        assert running.wait_done(ran)["state"] == "FAIL"
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="set task.state to PLAN"):
            running.sql("SELECT svc_again(%s)", [ran])
        assert running.value("SELECT state::text FROM task WHERE id = %s", [ran]) == "FAIL"
        assert running.value("SELECT count(*) FROM task WHERE exclusive") == 0
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY svc")
        running.sql("DROP ROLE svc")


def test_a_member_of_a_role_names_it_as_owner_by_set_role_and_is_told_so(running):
    """README: a role writes only its own tasks.  A member of a team role that named the team as
    owner got row-level security's `new row violates row-level security policy`, which says
    nothing of why; SET ROLE first makes the team's task."""
    running.sql("CREATE ROLE team LOGIN IN ROLE pgtaskpy_user")
    running.sql("CREATE ROLE member LOGIN IN ROLE pgtaskpy_user, team")
    try:
        with running.connect("member") as member:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match='set task.owner to "team"') as raised:
                insert_as(member, "SELECT current_user", owner="team")
            assert "SET ROLE" in raised.value.diag.message_hint
            member.execute("SET ROLE team")
            task_id = insert_as(member, "SELECT current_user", delete=False)
        row = running.wait_done(task_id)
        assert (row["owner"], row["state"], row["output"]) == ("team", "DONE", "team"), row
        running.sql("GRANT pgtaskpy_admin TO member")  # an admin who is a member of the role may name it
        with running.connect("member") as member:
            assert running.wait_done(insert_as(member, "SELECT 1", owner="team", delete=False))["state"] == "DONE"
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY member, team")
        running.sql("DROP ROLE member, team")


@pytest.mark.parametrize("function", ["record_prerequisites", "settle_prerequisites", "prerequisite_stopped",
                                      "prerequisite_deleted", "forget_truncated_prerequisites",
                                      "count_finished_task", "uncount_deleted_tasks"])
def test_an_author_cannot_attach_the_schedulers_trigger_functions_to_a_table_of_its_own(running, function):
    """The workflow triggers' functions run as the extension's owner (SECURITY DEFINER) and were
    executable by anyone: attached to an author's own table, fed another role's task ids, they
    stopped that role's dependents, or let one run before its prerequisite (a probe)."""
    running.sql("CREATE ROLE mallory LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("mallory") as mallory:
            mallory.execute("CREATE TABLE pg_temp.fed (id bigint, after bigint[])")
            try:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"function pgtaskpy.{function}"):
                    mallory.execute(f"CREATE TRIGGER fed AFTER DELETE ON fed FOR EACH ROW"
                                    f" EXECUTE FUNCTION pgtaskpy.{function}()")
            finally:
                mallory.execute("DROP TABLE pg_temp.fed")
    finally:
        running.sql("DROP ROLE mallory")


def test_an_authors_setting_of_the_schedulers_resolving_flag_leaves_no_dependent_waiting(running):
    """pgtaskpy.resolving, set by the scheduler around its own stops of dependents, tells the
    trigger that follows a hand stop to leave them to it; any session may set it, and an author
    who did stopped its task with another role's dependent `after_any` it left waiting for good
    (a probe).  The flag counts for a superuser's statement only."""
    running.sql("CREATE ROLE mallory LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("mallory") as mallory:
            mallory.autocommit = False
            prerequisite = insert_as(mallory, "SELECT 1", plan="2100-01-01", delete=False)
            mallory.commit()
            dependent = running.insert("SELECT 'ran'", after=[prerequisite], after_any=True, delete=False)
            mallory.execute("SET LOCAL pgtaskpy.resolving = on")
            mallory.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [prerequisite])
            mallory.commit()
        row = running.wait_done(dependent)
        assert (row["state"], row["output"]) == ("DONE", "ran"), row
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE mallory")


def test_the_only_security_definer_routines_anyone_may_call_are_the_three_with_a_proof(running):
    """A SECURITY DEFINER trigger function left executable by PUBLIC (forget_truncated_prerequisites)
    could be attached to an author's own table, and emptied every role's waits when it fired: their
    dependents waited for ever (an audit).  Every such routine of the extension is revoked from
    PUBLIC, but the three README's Security model names, which act only with a proof."""
    callable_by_anyone = running.sql(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
        " JOIN pg_depend AS d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'"
        " JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pg_task_py'"
        " WHERE p.prosecdef AND has_function_privilege('public', p.oid, 'EXECUTE') ORDER BY 1")
    assert [name for (name,) in callable_by_anyone] == [
        "pgtaskpy.cancel_running_task(bigint,boolean)", "pgtaskpy.end_series(name,text)",
        "pgtaskpy.follow_skipped_run(bigint)"]


def test_an_admin_steers_another_roles_tasks_but_cannot_change_what_they_run(running):
    """A member of pgtaskpy_admin who is not a member of a role rewrote the input of that role's
    waiting task (a superuser's: ALTER ROLE ... SUPERUSER), which then ran as that role (a probe).
    It may still stop, plan and repair such a task; not change its input, remote or target, nor
    its retries (a probe's admin gave another role's task three retries of any error: it ran four
    times as that role, and with retry_unsafe a lost run that may have committed ran again), nor
    its attempt (written back to 1, a failed task's retry ran again and again)."""
    running.sql("CREATE ROLE ops LOGIN IN ROLE pgtaskpy_admin")
    try:
        waiting = running.insert("SELECT 'mine'", plan=running.value("SELECT now() + interval '1 hour'"),
                                 delete=False)
        with running.connect("ops") as ops:
            for change in ("input = 'ALTER ROLE ops SUPERUSER'", "remote = 'dbname=postgres'",
                           "target = 'standby'", "retry = 3", "retry_on = '{*}'", "retry_unsafe = true",
                           "retry_delay = '0'", "retry_max = '1 s'", "attempt = 2"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="change what task .* runs"):
                    ops.execute(f"UPDATE task SET {change} WHERE id = %s", [waiting])
            ops.execute("UPDATE task SET plan = now() WHERE id = %s", [waiting])
        row = running.wait_done(waiting)
        assert (row["state"], row["output"]) == ("DONE", "mine"), row
        assert running.value("SELECT rolsuper FROM pg_roles WHERE rolname = 'ops'") is False
    finally:
        running.sql("DROP ROLE ops")


def test_an_admin_cannot_start_another_roles_task_nor_point_its_cancel_at_a_superusers_query(running):
    """A member of pgtaskpy_admin who is not a member of a superuser set that superuser's finished
    task back to waiting with a repeat of a second (it ran again and again as the superuser), and
    set a waiting one WORK with a pid of its choosing, which task_cancel then signalled: a
    superuser's query, which the admin's own pg_cancel_backend may not cancel (a probe).  It may
    still stop such a task and repair its end."""
    running.sql("CREATE ROLE ops2 LOGIN IN ROLE pgtaskpy_user, pgtaskpy_admin")
    victim = running.connect()
    try:
        later = running.value("SELECT now() + interval '1 hour'")
        finished = running.insert("SELECT 'once'", delete=False)
        running.wait_done(finished)
        waiting = running.insert("SELECT 1", plan=later)
        with running.connect("ops2") as ops:
            pid = victim.info.backend_pid
            for change, target in (("state = 'PLAN', stop = NULL", finished),
                                   (f"state = 'WORK', start = now(), pid = {pid}", waiting),
                                   (f"pid = {pid}", finished)):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"denied to run task {target}"):
                    ops.execute(f"UPDATE task SET {change} WHERE id = %s", [target])
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="change what task .* runs"):
                ops.execute("UPDATE task SET repeat = '1 second' WHERE id = %s", [waiting])
            ops.execute("UPDATE task SET error = 'noted by hand' WHERE id = %s", [finished])
            ops.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [waiting])
        assert victim.execute("SELECT pg_sleep(0.1), 'still here'").fetchone()[1] == "still here"
        assert running.sql("SELECT state::text, error FROM task WHERE id IN (%s, %s) ORDER BY id",
                           [finished, waiting]) == [("DONE", "noted by hand"), ("STOP", None)]
        assert running.value("SELECT count(*) FROM task WHERE parent = %s", [finished]) == 0
    finally:
        victim.close()
        running.sql("DROP ROLE ops2")


def test_an_authors_security_definer_function_a_superuser_calls_acts_on_no_other_roles_tasks(running):
    """The privileged halves of task_cancel and task_unschedule checked the session's user: a
    task author's SECURITY DEFINER function calling them directly, called by a superuser,
    cancelled another role's running task and ended its series (a probe).  They now check the
    calling role's proof (pgtaskpy.steering_proof); and an author's own wrapper of task_cancel or
    task_unschedule, which another role calls, acts on the author's tasks (it was refused)."""
    running.sql("CREATE ROLE alice_d LOGIN IN ROLE pgtaskpy_user")
    running.sql("CREATE ROLE bob_d LOGIN IN ROLE pgtaskpy_user")
    running.sql("CREATE SCHEMA alice_d AUTHORIZATION alice_d")
    try:
        with running.connect("bob_d") as bob:
            bobs = bob.execute("INSERT INTO task (input, \"group\") VALUES ('SELECT pg_sleep(60)', 'b')"
                               " RETURNING id").fetchone()[0]
            bob.execute("INSERT INTO task (input, key, repeat) VALUES ('SELECT 1', 'bk', '1 hour')")
        with running.connect("alice_d") as alice:
            alice.execute("CREATE FUNCTION alice_d.cancel(id bigint) RETURNS boolean LANGUAGE sql SECURITY DEFINER"
                          " AS $$ SELECT pgtaskpy.cancel_running_task(id, false) $$")
            alice.execute("CREATE FUNCTION alice_d.end_series(o name, k text) RETURNS text LANGUAGE sql"
                          " SECURITY DEFINER AS $$ SELECT pgtaskpy.end_series(o, k)::text $$")
            alice.execute("CREATE FUNCTION alice_d.unschedule(k text) RETURNS boolean LANGUAGE sql SECURITY DEFINER"
                          " AS $$ SELECT task_unschedule(k) $$")
            alice.execute("CREATE FUNCTION alice_d.cancel_mine(id bigint) RETURNS boolean LANGUAGE sql"
                          " SECURITY DEFINER AS $$ SELECT task_cancel(id) $$")
            alice.execute("GRANT USAGE ON SCHEMA alice_d TO bob_d")
            mine = alice.execute("INSERT INTO task (input, \"group\", delete) VALUES ('SELECT pg_sleep(60)', 'a',"
                                 " false) RETURNING id").fetchone()[0]
            alice.execute("INSERT INTO task (input, key, repeat) VALUES ('SELECT 1', 'ak', '1 hour')")
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id IN (%s, %s) AND state = 'WORK'",
                                         [bobs, mine]) == 2, 20, 0.02, "both tasks running")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"cancel task {bobs}"):
            running.sql("SELECT alice_d.cancel(%s)", [bobs])  # (called by a superuser)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match='end the series "bk"'):
            running.sql("SELECT alice_d.end_series('bob_d', 'bk')")
        assert running.value("SELECT state::text FROM task WHERE id = %s", [bobs]) == "WORK"
        assert running.value("SELECT repeat FROM task WHERE key = 'bk'") == timedelta(hours=1)
        with running.connect("bob_d") as bob:
            assert bob.execute("SELECT alice_d.cancel_mine(%s)", [mine]).fetchone() == (True,)
            assert bob.execute("SELECT alice_d.unschedule('ak')").fetchone() == (True,)
            assert bob.execute("SELECT alice_d.unschedule('no such key')").fetchone() == (False,)
            assert bob.execute("SELECT alice_d.cancel_mine(%s)", [bobs]).fetchone() == (False,)  # (not alice's)
        assert running.wait_done(mine)["state"] == "FAIL"
        assert running.value("SELECT state::text FROM task WHERE key = 'ak' AND state = 'PLAN'") is None
        assert running.value("SELECT count(*) FROM pgtaskpy.steering_proof") == 0
    finally:
        running.sql("SELECT task_cancel(id) FROM task WHERE state IN ('TAKE', 'WORK')")
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE state IN ('TAKE', 'WORK')") == 0, 20,
                   0.05, "the running tasks cancelled")
        running.sql("DELETE FROM task")
        running.sql("DROP SCHEMA alice_d CASCADE")
        running.sql("DROP OWNED BY alice_d, bob_d")
        running.sql("DROP ROLE alice_d, bob_d")


def test_an_exclusive_task_an_admin_gave_an_author_is_run_again_as_it_was_and_no_other(running):
    """Once an admin had made one of an author's tasks exclusive, any row naming it as `parent` was
    let through: the author inserted exclusive tasks of any input, as many as it liked (a probe).
    Only task_retry's copy of it, one at a time, is let through now."""
    running.sql("CREATE ROLE excl_author LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("excl_author") as author:
            given = author.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 day')"
                                   " RETURNING id").fetchone()[0]
            running.sql("UPDATE task SET exclusive = true WHERE id = %s", [given])  # (an admin's)
            author.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [given])
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="make a task exclusive"):
                author.execute("INSERT INTO task (input, exclusive, parent) VALUES ('SELECT 2', true, %s)", [given])
            running.sql("SELECT task_pause('group', 'excl_author')")  # (the copy waits while the author tries it)
            again = author.execute("SELECT task_retry(%s)", [given]).fetchone()[0]
            assert running.value("SELECT exclusive FROM task WHERE id = %s", [again]) is True
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="make a task exclusive"):
                author.execute("INSERT INTO task (input, exclusive, parent) VALUES ('SELECT 1', true, %s)", [given])
            author.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [again])
            for series in ("repeat = '1 millisecond'", "cron = '* * * * *'", "retry = 100"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="make a task exclusive"):
                    author.execute(f"INSERT INTO task (input, exclusive, parent, {series.split(' = ')[0]})"
                                   f" VALUES ('SELECT 1', true, %s, {series.split(' = ')[1]})", [given])
            again = author.execute("SELECT task_retry(%s)", [given]).fetchone()[0]
            # Nor does the copy run anything else, nor stop being the copy (then another was let in).
            # Nor how often or how long: a repeat of a millisecond held back every role's tasks.
            for change in ("input = 'SELECT pg_sleep(100000)'", "parent = NULL", "remote = 'dbname=postgres'",
                           "repeat = '1 millisecond'", "cron = '* * * * *'", "timeout = '1 day'", "retry = 100",
                           "retry_on = '{*}'"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"change what exclusive task {again}"):
                    author.execute(f"UPDATE task SET {change} WHERE id = %s", [again])
            author.execute("UPDATE task SET data = 'mine' WHERE id = %s", [again])  # (its data is the author's)
            # Ending a series of its own is the author's, as README tells a run to end its series.
            series = running.value("INSERT INTO task (input, exclusive, repeat, plan, owner) VALUES ('SELECT 1',"
                                   " true, '1 hour', now() + interval '1 day', 'excl_author') RETURNING id")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"change what exclusive task {series}"):
                author.execute("UPDATE task SET repeat = '1 minute' WHERE id = %s", [series])
            author.execute("UPDATE task SET repeat = '0', cron = NULL WHERE id = %s", [series])
            assert running.value("SELECT repeat FROM task WHERE id = %s", [series]) == timedelta(0)
            running.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [series])
            running.sql("SELECT task_resume('group', 'excl_author')")
            assert running.wait_done(again)["state"] == "DONE"
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE excl_author")


def test_task_schedule_while_an_exclusive_run_is_in_progress_keeps_the_series_exclusive(db):
    """The owner's task_schedule of a series an admin made exclusive is refused while a run waits
    (check_task); while one ran, it put a definition that was not exclusive beside it, and the
    admin's exclusive left the series (a probe).  It is refused then too; an admin's call keeps
    the series exclusive."""
    db.sql("CREATE ROLE excl_owner LOGIN IN ROLE pgtaskpy_user")
    try:
        run = db.value("INSERT INTO task (input, key, cron, exclusive, owner, state, start)"
                       " VALUES ('SELECT 1', 'nightly', '0 3 * * *', true, 'excl_owner', 'WORK', now()) RETURNING id")
        with db.connect("excl_owner") as owner:
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match=f"permission denied to change what exclusive task {run} runs"):
                owner.execute("SELECT task_schedule('nightly', '0 4 * * *', 'SELECT 2')")
            # Nor while a retry of it waits: the call stopped the retry and put a run beside it
            # that was not exclusive (a review).
            retry = db.value("INSERT INTO task (input, key, \"group\", cron, exclusive, owner, attempt, plan, data,"
                             " active) VALUES ('SELECT 1', 'retried', 'retried', '0 3 * * *', true, 'excl_owner', 2,"
                             " now() + interval '1 h', 'payload', '5 min') RETURNING id")
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match=f"permission denied to change what exclusive task {retry} runs"):
                owner.execute("SELECT task_schedule('retried', '0 3 * * *', 'SELECT 666')")
            owner.execute("SELECT task_schedule('retried', '0 3 * * *', 'SELECT 1')")  # (the same: no change)
            assert db.sql("SELECT id, state::text, exclusive FROM task WHERE key = 'retried'") == \
                [(retry, "PLAN", True)]
            # An admin's change stops the retry, and the series' new run is as the retry was but for
            # what the call gives: it was not exclusive, and lost its data and active (a review).
            db.sql("GRANT pgtaskpy_admin TO excl_owner")
            owner.execute("SELECT task_schedule('retried', '0 3 * * *', 'SELECT 777')")
        rows = db.sql("SELECT state::text, input, exclusive, data, active FROM task WHERE key = 'retried' ORDER BY id")
        assert rows == [("STOP", "SELECT 1", True, "payload", timedelta(minutes=5)),
                        ("PLAN", "SELECT 777", True, "payload", timedelta(minutes=5))]
        assert db.value("SELECT count(*) FROM task WHERE key = 'nightly'") == 1
        mine = db.value("INSERT INTO task (input, key, cron, exclusive, state, start)"
                        " VALUES ('SELECT 1', 'mine', '0 3 * * *', true, 'WORK', now()) RETURNING id")
        beside = db.value("SELECT task_schedule('mine', '0 4 * * *', 'SELECT 2')")
        assert beside != mine and db.value("SELECT exclusive FROM task WHERE id = %s", [beside]) is True
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP ROLE excl_owner")


def test_proofs_an_author_leaves_behind_are_deleted_a_few_thousand_a_turn(running):
    """Any role may insert rows into pgtaskpy.steering_proof (for its own name): leftovers of
    committed transactions are deleted by housekeeping, a few thousand a turn, not all at once in
    a turn that holds the scheduling lock (two million stalled every role's starts)."""
    running.sql("CREATE ROLE flooder LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("flooder") as flooder:
            flooder.execute("INSERT INTO pgtaskpy.steering_proof (owner) SELECT 'flooder'"
                            " FROM generate_series(1, 12000)")
        wait_until(lambda: running.value("SELECT count(*) FROM pgtaskpy.steering_proof") < 12000, 10, 0.05,
                   "housekeeping to delete some")
        assert running.value("SELECT count(*) FROM pgtaskpy.steering_proof") > 0  # (not all in one turn)
        wait_until(lambda: running.value("SELECT count(*) FROM pgtaskpy.steering_proof") == 0, 20, 0.1,
                   "housekeeping to delete them all")
    finally:
        running.sql("DROP ROLE flooder")


def test_a_new_role_of_a_renamed_ones_name_never_runs_in_the_old_ones_kept_session(running):
    """A kept session (`live`) went on with the group's tasks by the owner's name: after ALTER
    ROLE ... RENAME and a new role of the old name, the new role's task ran in the old role's
    session, with its rights (a probe: 5 of 5)."""
    running.sql("CREATE TABLE payroll (v text); INSERT INTO payroll VALUES ('secret')")
    running.sql("CREATE ROLE etl LOGIN IN ROLE pgtaskpy_user; GRANT SELECT ON payroll TO etl")
    try:
        with running.connect("etl") as etl:
            etl.autocommit = True
            first = [insert_as(etl, "SELECT pg_sleep(0.3)", live="1 hour", group="g", delete=False)
                     for _ in range(6)]
        wait_until(lambda: running.task(first[0])["state"] == "DONE", 20, 0.02, "the first task to end")
        running.sql("ALTER ROLE etl RENAME TO etl_retired")
        running.sql("CREATE ROLE etl LOGIN IN ROLE pgtaskpy_user")
        with running.connect("etl") as etl:
            etl.autocommit = True
            task_id = insert_as(etl, "SELECT session_user || ' ' || coalesce((SELECT v FROM payroll), '')",
                                live="1 hour", group="g", delete=False)
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["sqlstate"]) == ("FAIL", "42501"), row  # (permission denied for table payroll)
        assert running.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") == 0
    finally:
        running.sql("DROP OWNED BY etl; DROP ROLE etl")
        running.sql("DROP OWNED BY etl_retired; DROP ROLE IF EXISTS etl_retired")


def wait_running_input(running, task_id):
    """Until the task's session runs its input (a cancel before it would be lost)."""
    wait_until(lambda: running.value("SELECT count(*) FROM task AS t JOIN pg_stat_activity AS a ON a.pid = t.pid"
                                     " WHERE t.id = %s AND t.state = 'WORK' AND a.query LIKE 'SELECT pg_sleep%%'",
                                     [task_id]), 30, 0.05, f"task {task_id} to run its input")


RENAMES = [("", "ALTER ROLE {r} RENAME TO {r}_renamed"), ("", "DROP ROLE {r}"),
           ("", "ALTER ROLE {r} RENAME TO {r}_renamed; CREATE ROLE {r} LOGIN"),
           ("", "DROP ROLE {r}; CREATE ROLE {r} LOGIN"), ("SUPERUSER", "ALTER ROLE {r} RENAME TO {r}_renamed")]


@pytest.mark.parametrize(("kind", "change"), RENAMES)
def test_a_running_task_whose_owner_was_renamed_or_dropped_can_still_be_cancelled(running, kind, change):
    """task_cancel found the task's session by its owner's name: once the role was renamed or
    dropped (another perhaps made with its name) it returned false and the run went on, beyond
    the scheduler's reach."""
    running.sql(f"CREATE ROLE frank LOGIN {kind} IN ROLE pgtaskpy_user")
    try:
        task_id = running.insert("SELECT pg_sleep(60)", owner="frank", delete=False)
        wait_running_input(running, task_id)
        running.sql(change.format(r="frank"))
        assert running.value("SELECT task_cancel(%s)", [task_id]) is True
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["sqlstate"]) == ("FAIL", "57014"), row
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE IF EXISTS frank, frank_renamed")


@pytest.mark.parametrize(("kind", "change"), RENAMES)
def test_a_lost_run_whose_owner_was_renamed_ends_its_session_before_it_ends_fail(running, kind, change):
    """A run whose worker died is FAIL only once its session is gone (README, Guarantees): the
    session was found by its owner's name, and after a rename the run ended FAIL at once while
    its session went on running the input, and could commit."""
    running.sql(f"CREATE ROLE gina LOGIN {kind} IN ROLE pgtaskpy_user")
    try:
        task_id = running.insert("SELECT pg_sleep(60)", owner="gina", delete=False)
        wait_running_input(running, task_id)
        session, worker = running.sql("SELECT pid, worker FROM task WHERE id = %s", [task_id])[0]
        running.sql(change.format(r="gina"))
        running.sql("SELECT pg_terminate_backend(%s)", [worker])
        row = running.wait_done(task_id, 30)
        assert row["state"] == "FAIL", row
        assert running.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [session]) == 0
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE IF EXISTS gina, gina_renamed")


def test_a_superuser_demoted_while_connected_is_checked_as_what_it_now_is(running):
    """A session's is_superuser stays as it logged in after ALTER ROLE ... NOSUPERUSER, and the
    triggers trusted it: such a session set its ended task back to PLAN (it ran again) and, with
    the scheduler's next-run mark, inserted an exclusive task. They are checked by the role's
    rights as they are now."""
    running.sql("CREATE ROLE hank LOGIN SUPERUSER")
    try:
        with running.connect("hank") as hank:
            hank.autocommit = True
            done = running.wait_done(insert_as(hank, "SELECT 1", delete=False))["id"]
            running.sql("ALTER ROLE hank NOSUPERUSER")
            running.sql("GRANT pgtaskpy_user TO hank")
            assert hank.execute("SHOW is_superuser").fetchone() == ("on",)  # (stale: as it logged in)
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to set task.state"):
                hank.execute("UPDATE task SET state = 'PLAN', plan = now() WHERE id = %s", [done])
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="to make a task exclusive"):
                with hank.transaction():
                    hank.execute("SET LOCAL pgtaskpy.next_run = 'on'")
                    hank.execute("INSERT INTO task (input, exclusive) VALUES ('SELECT 1', true)")
            assert running.value("SELECT state::text FROM task WHERE id = %s", [done]) == "DONE"
            assert running.value("SELECT count(*) FROM task WHERE exclusive") == 0
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY hank")
        running.sql("DROP ROLE hank")
