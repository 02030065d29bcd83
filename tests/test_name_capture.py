"""A role that can create objects in the extension's schema (a database's owner owns `public`)
must not get its functions or operators run as someone else by the extension: not by the
scripts of CREATE and ALTER EXTENSION (a superuser's), not by what they bind for good into
indexes, triggers and constraints, not by the scheduler."""

import signal
import subprocess

import psycopg
import pytest
from pg_task_py_testing import LAUNCHER, Cluster, new_database, wait_until
from psycopg import sql
from test_upgrade import RELEASED

ROLE = "capturer"

# What the role leaves in `public`: every call writes who ran it.  Of types that pg_catalog
# matches only polymorphically (anyarray, anyenum), so that these are the exact matches; IMMUTABLE,
# so that an index's predicate may take them.
LOG = """
CREATE TABLE public.capture_log (what text, cu name, su name, app text);
GRANT INSERT ON public.capture_log TO PUBLIC;
CREATE FUNCTION public.note(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.capture_log
    VALUES (what, current_user, session_user, pg_catalog.current_setting('application_name'));
END $$;
CREATE FUNCTION public.cardinality(a timestamptz[]) RETURNS integer LANGUAGE plpgsql IMMUTABLE AS
    $$ BEGIN PERFORM public.note('cardinality'); RETURN pg_catalog.cardinality(a); END $$;
CREATE FUNCTION public.array_eq(a bigint[], b bigint[]) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
    $$ BEGIN PERFORM public.note('=(bigint[])'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR public.= (LEFTARG = bigint[], RIGHTARG = bigint[], FUNCTION = public.array_eq);
"""
STATE_OPERATORS = """
CREATE FUNCTION public.state_eq(a state, b state) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
    $$ BEGIN PERFORM public.note('=(state)'); RETURN a::text OPERATOR(pg_catalog.=) b::text; END $$;
CREATE FUNCTION public.state_ne(a state, b state) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
    $$ BEGIN PERFORM public.note('<>(state)'); RETURN a::text OPERATOR(pg_catalog.<>) b::text; END $$;
CREATE OPERATOR public.= (LEFTARG = state, RIGHTARG = state, FUNCTION = public.state_eq);
CREATE OPERATOR public.<> (LEFTARG = state, RIGHTARG = state, FUNCTION = public.state_ne);
"""

# The extension's objects that depend on a function or operator of the role.
BOUND = f"""
SELECT d.classid::regclass::text || ' ' || pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend AS d
WHERE d.classid <> 'pg_operator'::regclass AND d.classid <> 'pg_proc'::regclass
  AND ((d.refclassid = 'pg_proc'::regclass
        AND d.refobjid IN (SELECT oid FROM pg_proc WHERE proowner = '{ROLE}'::regrole))
       OR (d.refclassid = 'pg_operator'::regclass
           AND d.refobjid IN (SELECT oid FROM pg_operator WHERE oprowner = '{ROLE}'::regrole)))
"""


@pytest.fixture
def capturer(cluster: Cluster):
    with cluster.connect() as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN")
    try:
        yield ROLE
    finally:
        with cluster.connect() as conn:
            conn.execute(f"DROP ROLE {ROLE}")


def plant(db, what: str) -> None:
    with db.connect(ROLE) as conn:
        conn.execute(what)
        conn.commit()


def captured(db, by_the_scheduler: bool = False) -> list[tuple]:
    """What ran as another role than its own; by_the_scheduler: in the scheduler's sessions only
    (a test's own query of `state = ...` with `public` on its search_path runs the role's `=`, as
    any superuser's would: PostgreSQL's warning about schemas others can create in)."""
    return db.sql("SELECT what, cu, su, app FROM public.capture_log WHERE cu <> %s"
                  " AND (NOT %s OR app LIKE 'pg_task_py%%')", [ROLE, by_the_scheduler])


def run_every_kind_of_task(db) -> None:
    """Tasks of the role through a launcher: a group with a rate limit (its CHECK constraint),
    prerequisites, a series stopped, a cancel."""
    db.sql(f"GRANT pgtaskpy_user TO {ROLE}")
    db.launcher()
    with db.connect(ROLE) as conn:
        conn.autocommit = True
        conn.execute("SELECT task_limit('limited', 5, interval '1 minute')")
        first = conn.execute("INSERT INTO task (\"group\", input) VALUES ('limited', 'SELECT 1') RETURNING id"
                             ).fetchone()[0]
        second = conn.execute("SELECT task_enqueue('SELECT 2', after => ARRAY[%s]::bigint[])", [first]).fetchone()[0]
        series = conn.execute("INSERT INTO task (input, repeat) VALUES ('SELECT 3', '1 s') RETURNING id"
                              ).fetchone()[0]
        long = conn.execute("INSERT INTO task (input) VALUES ('SELECT pg_sleep(30)') RETURNING id").fetchone()[0]
        wait_until(lambda: db.value("SELECT state::text FROM task WHERE id = %s", [long]) == "WORK", 20, 0.05,
                   "the long task running")
        assert conn.execute("SELECT task_cancel(%s)", [long]).fetchone()[0]
        wait_until(lambda: db.value("SELECT count(*) FROM task WHERE parent = %s", [series]) > 0, 20, 0.05,
                   "the series' second run")
        # (before the stop of what waits: on a busy machine the step after `first` still waited)
        wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE' AND id IN (%s, %s)",
                                    [first, second]) == 2, 20, 0.05, "the rate-limited task and its dependent to end")
        conn.execute("SELECT task_cancel(id, stop_series => true) FROM task WHERE state = 'PLAN'")
    db.wait_all_done()
    assert db.value("SELECT count(*) FROM task WHERE state = 'DONE'") >= 3, db.sql("SELECT * FROM task")


def test_a_fresh_install_binds_and_runs_nothing_of_a_role_that_creates_in_its_schema(cluster: Cluster, capturer):
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py")
        db.sql(f"GRANT CREATE ON SCHEMA public TO {ROLE}")
        plant(db, LOG)
        db.sql("CREATE EXTENSION pg_task_py")
        plant(db, STATE_OPERATORS)
        assert db.sql(BOUND) == []
        run_every_kind_of_task(db)
        assert captured(db, by_the_scheduler=True) == []


@pytest.mark.parametrize("old", RELEASED)
def test_an_update_binds_and_runs_nothing_of_a_role_that_creates_in_its_schema(cluster: Cluster, capturer, old):
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py")
        db.sql(f"GRANT CREATE ON SCHEMA public TO {ROLE}")
        plant(db, LOG)
        db.conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {}").format(sql.Literal(old)))
        plant(db, STATE_OPERATORS)
        db.sql("INSERT INTO task (input) VALUES ('SELECT 1')")
        db.sql("ALTER EXTENSION pg_task_py UPDATE")
        assert captured(db) == []
        assert db.sql(BOUND) == []
        run_every_kind_of_task(db)
        assert captured(db, by_the_scheduler=True) == []


@pytest.mark.parametrize("old", RELEASED)
def test_every_step_of_an_update_runs_with_pg_catalog_alone_on_the_search_path(cluster: Cluster, old):
    """The released steps of 1.0 and 1.1 ran with the search_path the server gives an extension's
    script (its schema first), where README says every update runs with pg_catalog alone (an
    audit): an update from them takes one script of this version's, which sets it first."""
    with new_database(cluster) as db:
        db.sql("DROP EXTENSION pg_task_py")
        db.conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {}").format(sql.Literal(old)))
        db.sql("CREATE TABLE public.update_paths (tag text, path text)")
        db.sql("CREATE FUNCTION public.note_path() RETURNS event_trigger LANGUAGE plpgsql AS"
               " $$ BEGIN INSERT INTO public.update_paths VALUES (tg_tag, current_setting('search_path')); END $$")
        db.sql("CREATE EVENT TRIGGER note_path ON ddl_command_end EXECUTE FUNCTION public.note_path()")
        try:
            db.sql("ALTER EXTENSION pg_task_py UPDATE")
        finally:
            db.sql("DROP EVENT TRIGGER note_path")
        # (the ALTER EXTENSION itself ends after its script, with the session's own path)
        assert db.sql("SELECT path, count(*) > 100 FROM public.update_paths WHERE tag <> 'ALTER EXTENSION'"
                      " GROUP BY path") == [("pg_catalog, pg_temp", True)]


def test_a_graceful_stop_cancels_past_grace_beside_a_task_cancel_of_a_role(cluster: Cluster, capturer):
    """The stop's own task_cancel call names both arguments: a role's task_cancel(bigint) in the
    extension's schema made a one-argument call ambiguous, and the stop failed on every turn."""
    with new_database(cluster) as db:
        db.sql(f"GRANT CREATE ON SCHEMA public TO {ROLE}")
        plant(db, "CREATE FUNCTION public.task_cancel(task_id bigint) RETURNS boolean LANGUAGE sql"
                  " AS $$ SELECT false $$")
        launcher = db.launcher("--grace", "0.5")
        task_id = db.insert("SELECT pg_sleep(60)", delete=False)
        wait_until(lambda: db.value("SELECT state::text FROM task WHERE id = %s", [task_id]) == "WORK", 20, 0.05,
                   "the task running")
        launcher.signal(signal.SIGTERM)
        assert launcher.process.wait(30) == 0, launcher.output()
        row = db.task(task_id)
        assert row["state"] == "FAIL", row
        assert row["error"].startswith("ERROR:  canceling statement due to user request"), row
        assert "not unique" not in launcher.output()


# Functions the launcher's and `status`'s own statements call, in a schema of the role's that a
# database's search_path names before pg_catalog.
CATALOG_LOOKALIKES = """
CREATE SCHEMA capt;
CREATE FUNCTION capt.pg_is_in_recovery() RETURNS boolean LANGUAGE plpgsql AS
    $$ BEGIN PERFORM public.note('pg_is_in_recovery'); RETURN pg_catalog.pg_is_in_recovery(); END $$;
CREATE FUNCTION capt.now() RETURNS timestamptz LANGUAGE plpgsql AS
    $$ BEGIN PERFORM public.note('now'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION capt.to_regprocedure(text) RETURNS regprocedure LANGUAGE plpgsql AS
    $$ BEGIN PERFORM public.note('to_regprocedure'); RETURN pg_catalog.to_regprocedure($1); END $$;
CREATE FUNCTION capt.split_part(text, text, integer) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN PERFORM public.note('split_part'); RETURN pg_catalog.split_part($1, $2, $3); END $$;
GRANT USAGE ON SCHEMA capt TO PUBLIC;
"""


def test_a_database_search_path_of_its_owner_runs_nothing_of_the_owners_in_the_launcher_or_status(
        cluster: Cluster, capturer):
    """A database's owner may set the database's search_path: the launcher's sessions and
    `status` set theirs to pg_catalog alone at login."""
    with new_database(cluster) as db:
        db.sql(f"ALTER DATABASE {db.name} OWNER TO {ROLE}")
        plant(db, LOG + CATALOG_LOOKALIKES)
        plant(db, f"ALTER DATABASE {db.name} SET search_path = capt, pg_catalog, public")
        with db.connect(ROLE) as conn:  # (the lookalikes are live: the owner's own session runs them)
            assert conn.execute("SELECT now() IS NOT NULL").fetchone()[0]
            assert conn.execute("SELECT count(*) FROM public.capture_log WHERE what = 'now'").fetchone()[0] == 1
        db.launcher()
        assert db.wait_done(db.insert("SELECT 'ran'", delete=False))["output"] == "ran"
        status = subprocess.run([str(LAUNCHER), "status", "--dsn", db.dsn], capture_output=True, text=True,
                                timeout=30)
        assert status.returncode == 0, status.stderr
        assert captured(db, by_the_scheduler=True) == []


def test_the_extensions_schemas_cannot_be_renamed(cluster: Cluster, capturer):
    """The extension's functions name its schema as text: a database's owner who renamed `public`
    and created a view `task` in a new `public` had the scheduler read it as superuser."""
    with new_database(cluster) as db:
        db.sql(f"ALTER DATABASE {db.name} OWNER TO {ROLE}")
        with db.connect(ROLE) as conn:
            with pytest.raises(psycopg.errors.DependentObjectsStillExist,
                               match='schema "public" cannot be renamed: the extension pg_task_py lives in it'):
                conn.execute("ALTER SCHEMA public RENAME TO public_real")
        with pytest.raises(psycopg.errors.DependentObjectsStillExist, match='schema "pgtaskpy" cannot be renamed'):
            db.sql("ALTER SCHEMA pgtaskpy RENAME TO elsewhere")  # (a superuser's too)
        assert db.value("SELECT count(*) FROM pg_namespace WHERE nspname IN ('public', 'pgtaskpy')") == 2
        db.sql(f"ALTER SCHEMA public OWNER TO {ROLE}")  # what does not rename is let through
        db.sql("CREATE SCHEMA other; ALTER SCHEMA other RENAME TO renamed")
        db.launcher()
        assert db.wait_done(db.insert("SELECT 'ran'", delete=False))["output"] == "ran"
