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
