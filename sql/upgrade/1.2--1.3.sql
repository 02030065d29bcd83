-- 1.2 -> 1.3: what CREATE OR REPLACE cannot do.  sql/build.py appends every
-- function, procedure and trigger of 1.3 after this, as CREATE OR REPLACE.

-- task_cancel checks the running task's real backend itself (SECURITY
-- DEFINER pgtaskpy.cancel_running_task); the old helper trusted the row.
DROP FUNCTION pgtaskpy.cancel_remote_task(bigint);

-- STOP rows get their stop time (retention deletes by it); finished rows do
-- not keep the worker that ran them.
UPDATE @extschema@.task SET stop = now() WHERE state = 'STOP' AND stop IS NULL;
UPDATE @extschema@.task SET worker = NULL WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND worker IS NOT NULL;

-- pgtaskpy_user: what a task author needs, in one role (sql/created_once/35_security.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgtaskpy_user') THEN
        CREATE ROLE pgtaskpy_user NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA @extschema@ TO pgtaskpy_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.task TO pgtaskpy_user;
GRANT USAGE ON SEQUENCE @extschema@.task_id_seq TO pgtaskpy_user;
