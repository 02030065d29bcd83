"""Tasks run as their owner; each role sees and changes only its own tasks."""

import psycopg
import pytest


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


def insert_as(conn, input, **columns):
    names = ", ".join(["input", *columns])
    marks = ", ".join(["%s"] * (1 + len(columns)))
    return conn.execute(f"INSERT INTO task ({names}) VALUES ({marks}) RETURNING id",
                        [input, *columns.values()]).fetchone()[0]


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


def test_roles_see_and_change_only_their_own_tasks(running, roles):
    bobs = insert_as(roles["bob"], "SELECT 1", plan="infinity", delete=False)
    alice = roles["alice"]
    assert alice.execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (0,)
    assert alice.execute("UPDATE task SET state = 'STOP' WHERE id = %s", [bobs]).rowcount == 0
    assert alice.execute("UPDATE task SET input = 'SELECT 2' WHERE id = %s", [bobs]).rowcount == 0
    assert roles["bob"].execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (1,)
    running.sql("GRANT pgtaskpy_admin TO alice")
    assert alice.execute("SELECT count(*) FROM task WHERE id = %s", [bobs]).fetchone() == (1,)
    running.sql("REVOKE pgtaskpy_admin FROM alice")


def test_scheduling_functions_are_not_for_users(roles):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        roles["alice"].execute("SELECT * FROM pgtaskpy.claim_due_tasks(10, 1)")
