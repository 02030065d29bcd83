-- Standbys.  dispatch() answers "standby" and does nothing while the database
-- is in recovery (sql/plpython/dispatch.py); a task of target 'standby' runs in
-- a session on the launcher's standby (sql/plpython/sessions.py, open_standby).

-- pg_task_py.standby_max_lag (ALTER DATABASE ... SET or postgresql.conf,
-- default 10 s), in seconds: how far a standby may be behind the primary and
-- still run a task of target 'standby'.  A value that is not an interval of
-- zero or more is ignored with a warning (the default applies): a bad value
-- must not stop reporting tasks, which then run where they always could.
CREATE FUNCTION pgtaskpy.standby_max_lag() RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    value text := NULLIF(pgtaskpy.scheduler_setting('pg_task_py.standby_max_lag'), '');
    lag interval;
BEGIN
    BEGIN
        lag := value::interval;
    EXCEPTION WHEN data_exception THEN
        lag := interval '-1 s';
    END;
    IF lag < interval '0' THEN
        PERFORM pgtaskpy.warn_ignored_setting('pg_task_py.standby_max_lag', value,
                                              'of ' || pgtaskpy.scheduler_setting_source('pg_task_py.standby_max_lag'),
                                              'not an interval of zero or more');
        lag := NULL;
    END IF;
    RETURN extract(epoch FROM COALESCE(lag, interval '10 s'))::double precision;
END
$$;

-- After a failover, the new primary has the old one's claims (TAKE) with pids
-- of the old primary's backends.  recover_orphaned_tasks sends them back to
-- PLAN, unless a pid is by chance that of a live scheduler backend here (the
-- pids of two machines, or of two containers, overlap): then only that
-- backend can tell.  The launcher `claimer` knows its own claims, the tasks it
-- handed to its workers (`handed`), and its idle workers (`idle_workers`) have
-- none: any other TAKE row with one of those pids is not theirs, back to PLAN.
-- Called in the launcher's housekeeping, under the scheduling lock.
CREATE FUNCTION pgtaskpy.unclaim_strays(claimer integer, handed bigint[], idle_workers integer[]) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pgtaskpy.unclaim_tasks(ARRAY(
        SELECT t.id FROM @extschema@.task AS t
        WHERE t.state = 'TAKE'
          AND ((t.worker = claimer AND t.id <> ALL (handed)) OR t.worker = ANY (idle_workers))), NULL)
$$;

REVOKE ALL ON FUNCTION pgtaskpy.standby_max_lag() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.unclaim_strays(integer, bigint[], integer[]) FROM PUBLIC;

-- Logical replication.  The enabled subscription that copies the task table
-- into this database, if any (a blue/green copy, a reporting replica): its
-- rows are the publisher's, and so are their runs.  A launcher here runs
-- nothing while it is enabled, as on a standby (dispatch.py): each task
-- planned ahead ran on both sides, and each series' run twice.
CREATE FUNCTION pgtaskpy.subscription_of_tasks() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.subname FROM pg_subscription_rel AS r JOIN pg_subscription AS s ON s.oid = r.srsubid
    WHERE r.srrelid = '@extschema@.task'::regclass AND s.subenabled
    ORDER BY s.subname LIMIT 1
$$;

-- Logical replication copies rows, not sequences: on a copy taken over (its
-- subscription disabled or dropped), task_id_seq is behind the ids it
-- received, and every insert failed ("duplicate key value violates unique
-- constraint task_pkey"), each series' next run too.  Moves it past the
-- largest id; returns that id, or NULL when it was not behind.  (Read, then
-- set: an insert of a client in between that took an id past the largest
-- would see it taken again.  Called where a copy starts to be scheduled, and
-- when a launcher starts.)
CREATE FUNCTION pgtaskpy.advance_task_ids() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids regclass := pg_get_serial_sequence('@extschema@.task', 'id')::regclass;
    largest bigint := (SELECT max(t.id) FROM @extschema@.task AS t);
BEGIN
    IF ids IS NULL OR largest IS NULL OR coalesce(pg_sequence_last_value(ids), 0) >= largest THEN
        RETURN NULL;
    END IF;
    PERFORM setval(ids, largest);
    RETURN largest;
END
$$;

REVOKE ALL ON FUNCTION pgtaskpy.subscription_of_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.advance_task_ids() FROM PUBLIC;
