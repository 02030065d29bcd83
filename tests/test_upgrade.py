"""Versioned scripts: the generated ones match their sources, and ALTER EXTENSION
pg_task_py UPDATE from every released version gives what a fresh install gives."""

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from pg_task_py_testing import (
    PG_BIN,
    Cluster,
    Launcher,
    extension_version,
    new_database,
    throwaway_cluster,
    wait_until,
)
from pg_task_py_testing.database import drop_database
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent
CURRENT = extension_version(REPO / "pg_task_py.control")  # the version in development
RELEASED = ["1.0", "1.1", "1.2"]

# Everything an extension consists of, as text: routines with their code and
# grants, the table's columns, constraints, indexes, triggers and policies, event triggers, the
# enum's labels, the dump configuration.  Two databases with equal snapshots
# behave the same.
SNAPSHOT = """
WITH members AS (
    SELECT d.classid, d.objid FROM pg_depend AS d
    JOIN pg_extension AS e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
    WHERE e.extname = 'pg_task_py' AND d.deptype = 'e'
)
SELECT 'routine ' || p.oid::regprocedure || E'\n' || pg_get_functiondef(p.oid)
       || E'\nacl ' || coalesce(p.proacl::text, 'default')
FROM members AS m JOIN pg_proc AS p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
       || coalesce(' generated ' || nullif(a.attgenerated::text, ''), '')
FROM members AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef AS ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || co.conname || ' ' || pg_get_constraintdef(co.oid)
FROM members AS m JOIN pg_constraint AS co ON m.classid = 'pg_class'::regclass AND co.conrelid = m.objid
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM members AS m JOIN pg_index AS i ON m.classid = 'pg_class'::regclass AND i.indrelid = m.objid
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM members AS m JOIN pg_trigger AS t ON m.classid = 'pg_class'::regclass AND t.tgrelid = m.objid
WHERE NOT t.tgisinternal
UNION ALL
SELECT 'policy ' || po.tablename || '.' || po.policyname || ' ' || po.cmd || ' ' || po.roles::text || ' '
       || coalesce(po.qual, '') || ' ' || coalesce(po.with_check, '')
FROM members AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_policies AS po ON po.schemaname = n.nspname AND po.tablename = c.relname
UNION ALL
SELECT 'table ' || c.relname || ' rls ' || c.relrowsecurity || ' acl ' || coalesce(c.relacl::text, 'default')
       || ' replica identity ' || c.relreplident::text
FROM members AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
UNION ALL
SELECT 'enum ' || t.typname || ' ' || string_agg(en.enumlabel, ',' ORDER BY en.enumsortorder)
FROM members AS m JOIN pg_type AS t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
JOIN pg_enum AS en ON en.enumtypid = t.oid GROUP BY t.typname
UNION ALL
SELECT 'schema ' || n.nspname || ' acl ' || coalesce(n.nspacl::text, 'default')
FROM members AS m JOIN pg_namespace AS n ON m.classid = 'pg_namespace'::regclass AND n.oid = m.objid
UNION ALL
SELECT 'event trigger ' || et.evtname || ' ' || et.evtevent || ' ' || et.evtfoid::regprocedure::text || ' '
       || coalesce(et.evttags::text, '') || ' ' || et.evtenabled::text
FROM members AS m JOIN pg_event_trigger AS et ON m.classid = 'pg_event_trigger'::regclass AND et.oid = m.objid
UNION ALL
SELECT 'dump ' || extconfig::regclass[]::text || ' ' || coalesce(array_to_string(extcondition, ';'), '')
FROM pg_extension WHERE extname = 'pg_task_py'
ORDER BY 1
"""


def snapshot(database) -> list[str]:
    return [row[0] for row in database.sql(SNAPSHOT)]


def build(*args: str) -> str:
    return subprocess.run([sys.executable, str(REPO / "sql" / "build.py"), *args], check=True,
                          capture_output=True, text=True).stdout


def test_released_scripts_never_change():
    """A released version's scripts are frozen: databases on it were made by exactly these bytes.
    (The version in development is built by make and not committed.)"""
    recorded = dict(line.split()[::-1] for line in (REPO / "sql" / "released.sha256").read_text().splitlines())
    released = {f"pg_task_py--{v}.sql" for v in RELEASED}
    released |= {f"pg_task_py--{a}--{b}.sql" for a, b in zip(RELEASED, RELEASED[1:])}
    assert set(recorded) == released, "record every released script in sql/released.sha256"
    for name, digest in recorded.items():
        assert hashlib.sha256((REPO / "sql" / name).read_bytes()).hexdigest() == digest, \
            f"{name} is released: add an upgrade script instead of editing it"


def test_development_scripts_are_built_from_their_sources():
    """make builds the install and upgrade scripts that make install copies; a stale copy would install old code."""
    assert build("install") == (REPO / "sql" / f"pg_task_py--{CURRENT}.sql").read_text(), "run make"
    upgrade = REPO / "sql" / f"pg_task_py--{RELEASED[-1]}--{CURRENT}.sql"
    assert build("upgrade", RELEASED[-1], CURRENT) == upgrade.read_text(), "run make"
    for old in RELEASED[:-1]:  # straight to CURRENT, the released steps inside (sql/build.py)
        direct = REPO / "sql" / f"pg_task_py--{old}--{CURRENT}.sql"
        assert build("upgrade", old, RELEASED[-1], CURRENT) == direct.read_text(), "run make"


def test_default_version_is_the_one_in_development(db):
    assert db.value("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'") == CURRENT


@pytest.mark.parametrize("old", [None, *RELEASED])
def test_several_databases_create_or_update_the_extension_at_once(old):
    """The roles pgtaskpy_admin and pgtaskpy_user are the cluster's: each database's script
    makes them when missing.  Run at once in several databases of a cluster that had none, every
    script found one missing, and all CREATE ROLEs but the first failed on pg_authid's key: all
    the CREATE EXTENSIONs (or updates from 1.0, 1.1, 1.2, which had no pgtaskpy_user) but one."""
    names = ["d1", "d2", "d3", "d4"]
    with throwaway_cluster() as server:
        for name in names:
            server.create_database(name, extension=False)
            if old is not None:
                with server.connect(name) as conn:
                    conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {} CASCADE").format(sql.Literal(old)))
        conns = [server.connect(name) for name in names]
        start, failures = threading.Barrier(len(conns)), []

        def create_or_update(conn: psycopg.Connection) -> None:
            start.wait()
            try:
                conn.execute("CREATE EXTENSION pg_task_py CASCADE" if old is None
                             else "ALTER EXTENSION pg_task_py UPDATE")
            except psycopg.Error as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=create_or_update, args=(conn,)) for conn in conns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        versions = [conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'").fetchone()
                    for conn in conns]
        for conn in conns:
            conn.close()
    assert failures == []
    assert versions == [(CURRENT,)] * len(names)


@pytest.mark.parametrize("old", RELEASED)
def test_update_gives_what_a_fresh_install_gives(cluster: Cluster, db, old):
    with new_database(cluster) as upgraded:
        upgraded.sql("DROP EXTENSION pg_task_py")
        upgraded.conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {}").format(sql.Literal(old)))
        assert upgraded.value("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'") == old
        launcher = upgraded.launcher()  # the update happens under a running launcher
        assert upgraded.wait_done(upgraded.insert("SELECT 'old'"))["output"] == "old"
        waiting = upgraded.insert("SELECT 40 + 2", plan=upgraded.value("SELECT now() + interval '1 s'"))
        upgraded.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert upgraded.value("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'") == CURRENT
        assert snapshot(upgraded) == snapshot(db)
        # The launcher goes on with the new code, in the same session: the task
        # waiting across the update and a new one run.
        after = upgraded.insert("SELECT 'after'")
        assert upgraded.wait_done(waiting)["output"] == "42"
        assert upgraded.wait_done(after)["output"] == "after"
        assert launcher.output().count("scheduling (active)") == 1, launcher.output()
        # One warning, at connect: the extension is older than the launcher.
        log = launcher.output().splitlines()
        assert sum("ALTER EXTENSION pg_task_py UPDATE" in line for line in log) == 1, launcher.output()
        rest = [line for line in log if "ALTER EXTENSION pg_task_py UPDATE" not in line]
        assert not any("WARNING" in line or "ERROR" in line for line in rest), launcher.output()



def test_modules_compiled_by_another_python_run_from_their_source_until_compiled_again(db):
    """The extension's Python is compiled by its script, for the server's Python (sql/build.py).
    A server whose Python has changed since (a distribution upgrade: another bytecode) runs the
    modules from their source, and a superuser's install_python_modules() compiles them again."""
    magic = "SELECT array_agg(DISTINCT magic) FROM pgtaskpy.python_modules()"
    server_magic = db.value(magic)
    assert len(server_magic) == 1
    db.sql("CREATE OR REPLACE FUNCTION pgtaskpy.python_modules(OUT name text, OUT magic bytea, OUT code text)"
           " RETURNS SETOF record LANGUAGE sql IMMUTABLE"
           " AS $$ SELECT s.name, '\\x00000d0a'::bytea, 'not bytecode' FROM pgtaskpy.python_sources() AS s $$")
    launcher = db.launcher()
    assert db.wait_done(db.insert("SELECT 'from source'", delete=False))["output"] == "from source"
    launcher.stop()
    role = f"{db.name}_author"
    db.sql(sql.SQL("CREATE ROLE {} IN ROLE pgtaskpy_user").format(sql.Identifier(role)))
    try:
        with db.connect() as author:
            author.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                author.execute("SELECT pgtaskpy.install_python_modules()")
    finally:
        db.sql(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    db.sql("SELECT pgtaskpy.install_python_modules()")
    assert db.value(magic) == server_magic
    assert db.value("SELECT count(*) FROM pgtaskpy.python_modules() WHERE code = 'not bytecode'") == 0
    db.launcher()
    assert db.wait_done(db.insert("SELECT 'compiled'", delete=False))["output"] == "compiled"


def test_a_dump_restored_with_the_tables_triggers_off_is_the_same_database(cluster: Cluster, db, tmp_path):
    """pg_dump dumps `task` and the scheduler's tables (pg_extension_config_dump).  Restored with
    the triggers off (README, Backup and restore), every row comes back as it was: with them on,
    a dependent whose prerequisite had been deleted at its end (or came later in the table's
    order) failed the whole COPY of `task`, and the counters of task_stats counted each finished
    row twice.  The restored database then runs on: a waiting dependent after its prerequisite."""
    chain = db.value("SELECT task_chain(ARRAY['SELECT 1 WHERE false', 'SELECT ''step 2'''])")
    failed = db.insert("SELECT 1/0", group="other")
    launcher = db.launcher()
    db.wait_done(chain[1])
    db.wait_done(failed)
    assert launcher.stop() == 0
    assert db.task(chain[0]) is None  # (deleted at its end: it produced nothing)
    prerequisite = db.insert("SELECT 'p'", plan=db.value("SELECT now() + interval '1 hour'"), delete=False)
    dependent = db.insert("SELECT 'd'", after=[prerequisite], delete=False)
    rows = "SELECT id, state::text, after, waiting_for, output, error FROM task ORDER BY id"
    stats = 'SELECT "group", done_total, fail_total FROM task_stats ORDER BY 1'
    dump = tmp_path / "database.dump"
    subprocess.run([str(PG_BIN / "pg_dump"), "-Fc", "-f", str(dump), "-d", db.dsn], check=True, timeout=120)
    name = f"{db.name}_restored"
    with cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    try:
        subprocess.run([str(PG_BIN / "pg_restore"), "-d", cluster.dsn(name), str(dump)], check=True, timeout=120,
                       env={**os.environ, "PGOPTIONS": "-c session_replication_role=replica"})
        with cluster.connect(name) as restored:
            for query in (rows, stats, "SELECT * FROM pgtaskpy.pending_prerequisite",
                          "SELECT last_value FROM task_id_seq"):
                assert restored.execute(query).fetchall() == db.sql(query), query
            restored.execute("UPDATE task SET plan = now() WHERE id = %s", [prerequisite])
            restored_launcher = Launcher(cluster.dsn(name)).start()
            try:
                wait_until(lambda: restored.execute("SELECT state::text, output FROM task WHERE id = %s",
                                                    [dependent]).fetchone() == ("DONE", "d"),
                           30, 0.05, "the restored dependent to run")
            finally:
                assert restored_launcher.stop() == 0
    finally:
        drop_database(cluster, name)


def test_a_dump_of_an_older_version_restored_as_readme_says_is_updated(cluster: Cluster, tmp_path):
    """The dump's CREATE EXTENSION names no version: restored alone, it installed the newest, whose
    update steps never ran on the restored rows (task_stats counted nothing, then went negative as
    retention deleted them; STOP rows kept no stop time, and retention never deleted them).
    README: create the dump's version first (the dump's CREATE EXTENSION IF NOT EXISTS keeps it),
    restore, then update."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop)"
               " SELECT 'SELECT 1', 'old', s::state, t, t, CASE WHEN s <> 'STOP' THEN t END"
               " FROM unnest('{DONE,FAIL,DONE,STOP}'::text[]) WITH ORDINALITY AS u(s, i),"
               " LATERAL (SELECT now() - (10 - i) * interval '1 min') AS p(t)")
        dump = tmp_path / "old.dump"
        subprocess.run([str(PG_BIN / "pg_dump"), "-Fc", "-f", str(dump), "-d", db.dsn], check=True, timeout=120)
    name = "restored_from_1_2"
    with cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    try:
        with cluster.connect(name) as restored:
            restored.execute("CREATE EXTENSION pg_task_py VERSION '1.2' CASCADE")
            subprocess.run([str(PG_BIN / "pg_restore"), "-d", cluster.dsn(name), str(dump)], check=True,
                           timeout=120, env={**os.environ, "PGOPTIONS": "-c session_replication_role=replica"})
            restored.execute("ALTER EXTENSION pg_task_py UPDATE")
            assert restored.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'"
                                    ).fetchone() == (CURRENT,)
            assert restored.execute("SELECT done_total, fail_total, stop_total FROM task_stats"
                                    " WHERE \"group\" = 'old'").fetchall() == [(2, 1, 1)]
            assert restored.execute("SELECT count(*) FROM task WHERE stop IS NULL").fetchone() == (0,)
    finally:
        drop_database(cluster, name)


def test_the_counters_of_an_updated_database_start_from_its_finished_rows(cluster: Cluster):
    """The 1.3 update fills task_stats' counters from the rows already there, failures in a row too."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        db.sql("INSERT INTO task (input, \"group\", state, plan, start, stop)"
               " SELECT 'SELECT 1', 'old', s::state, t, t, t"
               " FROM unnest('{DONE,FAIL,DONE,FAIL,STOP,FAIL}'::text[]) WITH ORDINALITY AS u(s, i),"
               " LATERAL (SELECT now() - (10 - i) * interval '1 min') AS p(t)")
        db.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert db.sql("SELECT done_total, fail_total, stop_total, consecutive_failures FROM task_stats"
                      " WHERE \"group\" = 'old'") == [(2, 3, 1, 2)]


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_the_update_refuses_rows_whose_group_1_3_refuses_naming_them(cluster: Cluster, version):
    """1.0-1.2 took a group of any length; 1.3 refuses one over 1000 bytes, a key of its counters'
    indexes (2,704 bytes at most).  A finished row with a group of 3 kB failed the update with
    `index row size 3224 exceeds btree version 4 maximum 2704`, and a waiting one went through,
    ran, and could never be written ended (a probe).  The update names them first and changes
    nothing; once they are shortened it goes through, and their tasks run and end."""
    with new_database(cluster) as db:
        db.sql(f"DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '{version}'")
        long_group = "g" * 3000
        done = db.value("INSERT INTO task (input, \"group\", state, start, stop, delete)"
                        " VALUES ('SELECT 1', %s, 'DONE', now(), now(), false) RETURNING id", [long_group])
        waiting = db.value("INSERT INTO task (input, \"group\", delete) VALUES ('SELECT 2', %s, false) RETURNING id",
                           [long_group])
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            db.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert str(refused.value).startswith(f"cannot update pg_task_py to 1.3: tasks {done}, {waiting} have a group"
                                             " over 1000 bytes, which 1.3 refuses"), refused.value
        assert "UPDATE task SET \"group\" = md5(\"group\")" in refused.value.diag.message_hint
        assert db.value("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'") == version
        db.sql("UPDATE task SET \"group\" = md5(\"group\") WHERE octet_length(\"group\") > 1000")
        # And a null over 1000 characters: it passed, and then its series could not be ended, nor
        # the task retried, nor a dump of the table restored (a review).
        long_null = db.value("INSERT INTO task (input, \"null\", repeat, delete) VALUES ('SELECT NULL', %s,"
                             " '1 hour', false) RETURNING id", ["n" * 1500])
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            db.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert refused.value.diag.message_primary == \
            f"cannot update pg_task_py to 1.3: task {long_null} has values that 1.3 refuses"
        assert refused.value.diag.message_detail == f"Task {long_null}: task.null must be at most 1000 characters."
        db.sql("UPDATE task SET \"null\" = 'NULL' WHERE id = %s", [long_null])
        db.sql("ALTER EXTENSION pg_task_py UPDATE")
        db.launcher()
        assert db.wait_done(waiting)["state"] == "DONE"
        db.sql("UPDATE task SET repeat = '0' WHERE id = %s", [long_null])  # (its series ends)


def test_the_update_refuses_rows_that_break_1_3s_rules_naming_them(cluster: Cluster):
    """1.2 took max = -2147483648, a timeout of 30 days, a plan of infinity, which 1.3 refuses:
    such a row of before ran after the update and could never be written ended (`integer out of
    range`, its pause's -max); let through, it could not be changed (its series not ended: the
    trigger checks the whole row), nor a dump of the table restored (a review).  The update names
    them and the first one's rule, and changes nothing; once they are changed it goes through."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        task = db.value("INSERT INTO task (input, \"group\", max, delete) VALUES ('SELECT ''ended''', 'lowest',"
                        " -2147483648, false) RETURNING id")
        series = db.value("INSERT INTO task (input, repeat, timeout, plan) VALUES ('SELECT 1', '1 hour', '30 days',"
                          " now() + interval '1 day') RETURNING id")
        never = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', 'infinity') RETURNING id")
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            db.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert refused.value.diag.message_primary == \
            f"cannot update pg_task_py to 1.3: tasks {task}, {series}, {never} have values that 1.3 refuses"
        assert refused.value.diag.message_detail == f"Task {task}: task.max must be at least -2147483647."
        assert db.value("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'") == "1.2"
        db.sql("UPDATE task SET max = -2147483647 WHERE id = %s", [task])
        db.sql("UPDATE task SET timeout = '1 day' WHERE id = %s", [series])
        db.sql("DELETE FROM task WHERE id = %s", [never])
        db.sql("ALTER EXTENSION pg_task_py UPDATE")
        db.sql("UPDATE task SET repeat = '0' WHERE id = %s", [series])  # (its series ends)
        db.launcher()
        row = db.wait_done(task)
        assert (row["state"], row["output"]) == ("DONE", "ended"), row


def test_the_counters_count_the_ends_written_as_the_update_ran(cluster: Cluster):
    """A worker ending a task as ALTER EXTENSION ... UPDATE ran waits for the update's lock on the
    table, then writes the end in the old version's code, which counts nothing: task_stats missed
    an end for each such worker, for good, and went below zero once the rows were deleted (a probe)."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        db.launcher()
        db.sql("INSERT INTO task (input, \"group\", delete) SELECT 'SELECT pg_sleep(0.2)', 'g' || i % 4, false"
               " FROM generate_series(1, 40) AS i")
        wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 4, 20, 0.02,
                   message="a task of each group running")
        with psycopg.connect(db.dsn) as update:  # (held open while ends wait for it)
            update.execute("ALTER EXTENSION pg_task_py UPDATE")
            wait_until(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                        " AND application_name = 'pg_task_py worker'") == 4, 20, 0.05,
                       message="each group's worker's end waiting for the update")
        db.wait_all_done(60)
        assert db.sql("SELECT \"group\", done_total FROM task_stats ORDER BY 1") == db.sql(
            "SELECT \"group\", count(*) FROM task WHERE state = 'DONE' GROUP BY 1 ORDER BY 1") == [
            (f"g{i}", 10) for i in range(4)]


def test_the_update_gives_older_tasks_tz_utc_whatever_the_updating_sessions_pg_task_tz(cluster: Cluster):
    """The update filled `tz` of every existing row from the updating session's pg_task.tz: a zone
    nobody chose for those tasks' repeats, or one the server does not know, with which each
    series' next run failed and the series ended.  New rows still take the setting."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py; CREATE EXTENSION pg_task_py VERSION '1.2'")
        db.sql("INSERT INTO task (input, repeat, plan) VALUES ('SELECT 1', '1 day', now() + interval '1 hour')")
        with db.connect() as conn:
            conn.execute("SET pg_task.tz = 'Asia/Tokyo'")
            conn.execute("ALTER EXTENSION pg_task_py UPDATE")
            conn.execute("INSERT INTO task (input) VALUES ('SELECT 2')")
            assert conn.execute("SELECT input, tz FROM task ORDER BY id").fetchall() == [
                ("SELECT 1", "UTC"), ("SELECT 2", "Asia/Tokyo")]


PUBLIC_EXECUTE = """
SELECT p.oid::regprocedure::text, has_function_privilege('public', p.oid, 'EXECUTE')
FROM pg_depend AS d JOIN pg_extension AS e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
JOIN pg_proc AS p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
WHERE e.extname = 'pg_task_py' AND d.deptype = 'e' ORDER BY 1
"""


@pytest.mark.parametrize("version", [None, RELEASED[-1]])
def test_default_privileges_that_revoke_execute_from_public_change_no_routines_grants(cluster: Cluster, db, version):
    """A DBA's ALTER DEFAULT PRIVILEGES ... REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC left every
    routine of the extension without EXECUTE for PUBLIC: a task author's INSERT failed, `permission
    denied for function setting_default`.  Installed or updated so, the grants are a fresh install's."""
    with new_database(cluster) as hardened:
        hardened.sql("DROP EXTENSION pg_task_py")
        hardened.sql("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
        if version is None:
            hardened.sql("CREATE EXTENSION pg_task_py CASCADE")
        else:
            hardened.conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {}").format(sql.Literal(version)))
            hardened.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert hardened.sql(PUBLIC_EXECUTE) == db.sql(PUBLIC_EXECUTE)
        assert sum(not executable for _, executable in db.sql(PUBLIC_EXECUTE)) > 40  # (the private ones stay so)
        role = f"{hardened.name}_author"
        hardened.sql(sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgtaskpy_user").format(sql.Identifier(role)))
        try:
            with hardened.connect(role) as author:
                author.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + interval '1 day')")
                author.execute("SELECT task_enqueue('SELECT 2', plan => now() + interval '1 day')")
        finally:
            hardened.sql(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            hardened.sql(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("encoding", ["EUC_JP", "LATIN1"])
@pytest.mark.parametrize("old", [None, RELEASED[-1]])
def test_the_extension_installs_and_updates_in_a_database_of_any_server_encoding(cluster: Cluster, encoding, old):
    """PostgreSQL reads an extension's script in the database's encoding: a UTF-8 character in
    a comment of 1.3's failed CREATE EXTENSION and the update in an EUC_JP database (`invalid
    byte sequence for encoding "EUC_JP"`), and a literal's was three LATIN1 characters in a
    LATIN1 one.  Every script is ASCII (sql/build.py refuses to build one that is not)."""
    for script in (REPO / "sql").glob("pg_task_py--*.sql"):
        assert script.read_bytes().isascii(), script.name
    name = f"encoded_{encoding.lower()}"
    with cluster.connect() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
            sql.Identifier(name), sql.Literal(encoding)))
    try:
        with cluster.connect(name) as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE" + (f" VERSION '{old}'" if old else ""))
            if old:
                conn.execute("ALTER EXTENSION pg_task_py UPDATE")
            assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_task_py'").fetchone() == (
                CURRENT,)
            launcher = Launcher(cluster.dsn(name)).start()
            try:
                task = conn.execute("INSERT INTO task (input, remote, delete) VALUES ('SELECT 1',"
                                    " 'postgresql://app:SuperSecret6@[::1/b', false) RETURNING id").fetchone()[0]
                error = wait_until(lambda: conn.execute("SELECT error FROM task WHERE id = %s AND state = 'FAIL'",
                                                        [task]).fetchone(), 30, 0.05, "the task to fail")[0]
            finally:
                assert launcher.stop() == 0, launcher.output()
        assert 'looking for matching "]" in IPv6 host address in URI: "..."' in error, error
    finally:
        drop_database(cluster, name)
