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

-- Cron schedules and named series: columns cron, tz, key and their indexes
-- (sql/created_once/20_table.sql).  Existing tasks get no cron, tz UTC and no key.
ALTER TABLE @extschema@.task
    ADD COLUMN cron text,
    ADD COLUMN tz text NOT NULL DEFAULT pgtaskpy.setting_default('tz', 'UTC'::text),
    ADD COLUMN key text;
COMMENT ON COLUMN @extschema@.task.cron IS 'cron expression (pg_cron syntax): each run''s end inserts the next run at its next match';
COMMENT ON COLUMN @extschema@.task.tz IS 'the time zone cron is read in';
COMMENT ON COLUMN @extschema@.task.key IS 'a series'' name: at most one waiting task per owner and key (task_schedule)';
CREATE UNIQUE INDEX task_key_waiting ON @extschema@.task (owner, key) WHERE state = 'PLAN' AND key IS NOT NULL;
CREATE INDEX task_key_running ON @extschema@.task (owner, key) WHERE state IN ('TAKE', 'WORK') AND key IS NOT NULL;

-- Tasks that ask for a standby (column target, sql/created_once/20_table.sql).
ALTER TABLE @extschema@.task ADD COLUMN target text;
COMMENT ON COLUMN @extschema@.task.target IS 'where the task runs: NULL here, ''standby'' a read-only session on the launcher''s standby';
