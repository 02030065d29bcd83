"""The extension's objects: columns, defaults from settings, rejected values, dump."""

import subprocess

import psycopg
import pytest
from pg_task_py_testing import PG_BIN

PG_TASK_COLUMNS = {
    "id": "bigint", "parent": "bigint", "plan": "timestamp with time zone",
    "start": "timestamp with time zone", "stop": "timestamp with time zone",
    "active": "interval", "live": "interval", "repeat": "interval", "timeout": "interval",
    "count": "integer", "hash": "integer", "max": "integer", "pid": "integer", "state": "state",
    "delete": "boolean", "drift": "boolean", "header": "boolean", "string": "boolean",
    "delimiter": "text", "escape": "text", "quote": "text", "data": "text", "error": "text",
    "group": "text", "input": "text", "null": "text", "output": "text", "remote": "text",
    "save": "boolean", "owner": "name",
}


def test_task_has_pg_task_columns(db):
    rows = db.sql("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                  " WHERE attrelid = 'task'::regclass AND attnum > 0 AND NOT attisdropped")
    columns = dict(rows)
    for name, type_ in PG_TASK_COLUMNS.items():
        assert columns.get(name) == type_, name
    states = db.value("SELECT enum_range(NULL::state)::text")
    assert states == "{PLAN,TAKE,WORK,DONE,FAIL,STOP,GONE}"


def test_defaults_match_pg_task(db):
    task_id = db.insert("SELECT 1")
    row = db.task(task_id)
    assert row["state"] == "PLAN"
    assert (row["max"], row["count"], row["delete"], row["drift"], row["header"], row["string"]) == \
        (0, 0, True, False, True, True)
    assert (row["delimiter"], row["quote"], row["escape"], row["null"], row["group"]) == \
        ("\t", "", "", "\\N", "group")
    assert str(row["active"]) == "1:00:00" and str(row["repeat"]) == "0:00:00"
    assert row["owner"] == "postgres" and row["parent"] is None
    assert row["hash"] == db.value("SELECT hash FROM task WHERE id = %s", [task_id])


def test_hash_groups_by_group_and_remote(db):
    a = db.insert("SELECT 1", group="g")
    b = db.insert("SELECT 1", group="g")
    c = db.insert("SELECT 1", group="g", remote="dbname=other")
    d = db.insert("SELECT 1", group="h")
    hashes = {i: db.task(i)["hash"] for i in (a, b, c, d)}
    assert hashes[a] == hashes[b]
    assert len({hashes[a], hashes[c], hashes[d]}) == 3


def test_session_setting_changes_the_next_default(db):
    db.sql("SET pg_task.max = 2")
    db.sql('SET pg_task."group" = \'reports\'')
    db.sql("SET pg_task.timeout = '5 min'")
    row = db.task(db.insert("SELECT 1"))
    assert (row["max"], row["group"], str(row["timeout"])) == (2, "reports", "0:05:00")
    db.sql("RESET pg_task.max")
    assert db.task(db.insert("SELECT 1"))["max"] == 0


def test_pg_task_id_is_the_parent_and_a_bad_one_is_named(db):
    """pg_task.id (a task's session has it) is the parent of what the task inserts; a value that
    is no id is an error naming the setting, as the other settings' are (it was the bare
    `invalid input syntax for type bigint`)."""
    db.sql("SET pg_task.id = '12'")
    assert db.task(db.insert("SELECT 1"))["parent"] == 12
    db.sql("SET pg_task.id = ''")
    assert db.task(db.insert("SELECT 1"))["parent"] is None
    db.sql("SET pg_task.id = 'abc'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='invalid value for setting "pg_task.id": "abc"'):
        db.insert("SELECT 1")


def test_empty_setting_and_any_search_path_give_the_default(db):
    """The defaults read the settings the same under an inserter's search_path that holds nothing,
    or one where a lookalike operator comes first; an empty setting is no setting."""
    table = db.value("SELECT 'task'::regclass::oid")
    db.sql("CREATE SCHEMA lookalike")
    db.sql("CREATE FUNCTION lookalike.never(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false'")
    db.sql("CREATE OPERATOR lookalike.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = lookalike.never)")
    db.sql("CREATE OPERATOR lookalike.= (LEFTARG = text, RIGHTARG = text, FUNCTION = lookalike.never)")
    db.sql("CREATE FUNCTION lookalike.other(text, text) RETURNS text LANGUAGE sql AS $$SELECT 'pg_task.timeout'$$")
    db.sql("CREATE OPERATOR lookalike.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = lookalike.other)")
    db.sql("SET pg_task.max = ''")
    db.sql("SET pg_task.timeout = '7 s'")
    for search_path in ("''", "lookalike, pg_catalog"):
        db.sql(f"SET search_path = {search_path}")
        try:
            name = db.value("SELECT %s::oid::regclass::text", [table])  # (qualified: nothing is on the path)
            row = db.sql(f"INSERT INTO {name} (input) VALUES ('SELECT 1') RETURNING max, timeout::text")[0]
        finally:
            db.sql("RESET search_path")
        assert row == (0, "00:00:07"), search_path


def test_role_and_database_settings_most_specific_first(db, cluster):
    db.sql("CREATE ROLE setting_user LOGIN")
    db.sql("GRANT INSERT, SELECT ON task TO setting_user")
    db.sql("GRANT USAGE ON SEQUENCE task_id_seq TO setting_user")
    db.sql(f"ALTER DATABASE {db.name} SET pg_task.max = 3")
    db.sql(f"ALTER DATABASE {db.name} SET pg_task.drift = on")
    db.sql("ALTER ROLE setting_user SET pg_task.max = 4")
    try:
        with cluster.connect(db.name, "setting_user") as conn:
            row = conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING max, drift").fetchone()
            assert row == (4, True)  # role beats database; database applies where the role is silent
            conn.execute("SET pg_task.max = 5")
            assert conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING max").fetchone() == (5,)
    finally:
        db.sql("DROP OWNED BY setting_user")
        db.sql("DROP ROLE setting_user")


def test_bad_setting_value_names_the_setting(db):
    db.sql("SET pg_task.max = 'lots'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='setting "pg_task.max": "lots"'):
        db.insert("SELECT 1")


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("repeat", "-1 second", "task.repeat must not be negative"),
        ("timeout", "-1 second", "task.timeout must not be negative"),
        ("live", "-1 second", "task.live must not be negative"),
        ("count", -1, "task.count must not be negative"),
        ("active", "0 seconds", "task.active must be a positive interval"),
        ("delimiter", "ab", "task.delimiter must be exactly one character"),
        ("quote", "ab", "task.quote must be at most one character"),
        ("escape", "ab", "task.escape must be at most one character"),
        ("null", "x" * 1001, "task.null must be at most 1000 characters"),
    ],
)
def test_impossible_values_are_rejected_naming_the_column(db, column, value, message):
    with pytest.raises(psycopg.errors.CheckViolation, match=message) as error:
        db.insert("SELECT 1", **{column: value})
    # The error a CHECK constraint of that name would raise: clients can match either.
    assert str(error.value).startswith(f'new row for relation "task" violates check constraint "{message}"')
    assert error.value.diag.constraint_name == message
    assert error.value.diag.table_name == "task"
    assert db.value("SELECT count(*) FROM task") == 0


def test_a_null_text_longer_than_1000_characters_is_refused_on_update_too(db):
    """`null` had no bound: each NULL of a row is written as it, and 500 NULLs of a 1 MB null took
    the worker to 474 MB before the output limit stopped the task (a probe)."""
    task_id = db.insert("SELECT NULL::int", state="STOP", null="x" * 1000)
    with pytest.raises(psycopg.errors.CheckViolation, match="task.null must be at most 1000 characters"):
        db.sql('UPDATE task SET "null" = repeat(\'y\', 1001) WHERE id = %s', [task_id])
    assert db.value('SELECT length("null") FROM task WHERE id = %s', [task_id]) == 1000


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("delimiter", ";;", "task.delimiter must be exactly one character"),
        ("count", "-1", "task.count must not be negative"),
        ("tz", "Mars/Olympus", 'invalid task.tz "Mars/Olympus"'),
    ],
)
def test_a_setting_that_breaks_its_columns_rule_is_named_in_the_hint(db, setting, value, message):
    """A value that parses but breaks the rule fails with the rule, as a column's value would, and
    the HINT names the setting it came from: the INSERT itself gave no such value."""
    db.sql("SELECT set_config(%s, %s, false)", [f"pg_task.{setting}", value])
    db.sql("SET pg_task.max = 3")  # (set, but not named by the rule: not in the HINT)
    with pytest.raises(psycopg.errors.CheckViolation, match=message) as error:
        db.insert("SELECT 1")
    assert f"The INSERT took its default from pg_task.{setting} = '{value}' " in error.value.diag.message_hint
    assert "pg_task.max" not in error.value.diag.message_hint
    # A value given in the INSERT breaks the same rule; the HINT still says where the default was set.
    with pytest.raises(psycopg.errors.CheckViolation, match=message):
        db.insert("SELECT 1", **{setting: value})
    db.sql(f"RESET pg_task.{setting}")
    with pytest.raises(psycopg.errors.CheckViolation, match=message) as error:
        db.insert("SELECT 1", **{setting: value})
    assert "pg_task." not in (error.value.diag.message_hint or "")
    assert db.value("SELECT count(*) FROM task") == 0


def test_impossible_values_are_rejected_by_update_too(db):
    task = db.insert("SELECT 1", plan=db.value("SELECT now() + interval '1 hour'"))
    with pytest.raises(psycopg.errors.CheckViolation, match="task.count must not be negative"):
        db.sql("UPDATE task SET count = -1 WHERE id = %s", [task])
    with pytest.raises(psycopg.errors.CheckViolation, match="task.input must not be empty"):
        db.sql("UPDATE task SET input = ' ; ' WHERE id = %s", [task])
    assert db.sql("SELECT count, input FROM task WHERE id = %s", [task]) == [(0, "SELECT 1")]


@pytest.mark.parametrize("input", ["", "   ", " ; ", " ;\t\r\n" * 100])
def test_empty_input_is_rejected(db, input):
    with pytest.raises(psycopg.errors.CheckViolation, match="task.input must not be empty"):
        db.insert(input)



@pytest.mark.parametrize("remote", ["", "  ", "\t\n"])
def test_an_empty_remote_is_rejected(db, remote):
    """libpq's defaults filled an empty conninfo in: the task ran in the database named after its
    role, not here (a probe)."""
    with pytest.raises(psycopg.errors.CheckViolation,
                       match=r"task.remote must not be empty \(NULL: the task runs here\)"):
        db.insert("SELECT current_database()", remote=remote)
    with pytest.raises(psycopg.errors.CheckViolation, match="task.remote must not be empty"):
        db.value("SELECT task_schedule('where', '1 seconds', 'SELECT 1', remote => %s)", [remote])
    assert db.value("SELECT count(*) FROM task") == 0

@pytest.mark.parametrize("input", [" " * 200 + "SELECT 1", ";" * 200 + "SELECT 'é'"])
def test_an_input_after_a_long_blank_start_is_kept(db, input):
    assert db.value("SELECT input FROM task WHERE id = %s", [db.insert(input)]) == input


def test_a_huge_input_is_inserted_and_a_huge_cron_rejected_without_an_internal_error(db):
    """The emptiness check took 12 bytes a character: an input of 134,217,728 characters or more
    failed with `invalid memory alloc request size` (XX000), and so did a cron of 200 MB."""
    huge = "/* " + "é" * 140_000_000 + " */ SELECT 1"
    task = db.insert(huge)
    assert db.value("SELECT char_length(input) FROM task WHERE id = %s", [task]) == len(huge)
    with pytest.raises(psycopg.errors.CheckViolation, match="task.cron must not be over 1000 bytes"):
        db.insert("SELECT 1", cron="* " * 100_000_000)


def test_hash_cannot_be_set(db):
    with pytest.raises(psycopg.errors.GeneratedAlways):
        db.insert("SELECT 1", hash=1)


def test_pg_dump_keeps_users_tasks(db):
    db.insert("SELECT 'kept by pg_dump'")
    dump = subprocess.run(
        [str(PG_BIN / "pg_dump"), "--data-only", "-d", db.dsn], check=True, capture_output=True, text=True
    ).stdout
    assert "SELECT 'kept by pg_dump'" in dump
    assert "task_id_seq" in dump


def test_insert_notifies_the_launchers(db, cluster):
    with cluster.connect(db.name) as listener:
        listener.execute("LISTEN pg_task_py")
        db.insert("SELECT 1")
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["pg_task_py"]
