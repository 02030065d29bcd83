-- 1.2 -> 1.3: what CREATE OR REPLACE cannot do.  sql/build.py appends every
-- function, procedure and trigger of 1.3 after this, as CREATE OR REPLACE.

-- task_cancel checks the running task's real backend itself (SECURITY
-- DEFINER pgtaskpy.cancel_running_task); the old helper trusted the row.
DROP FUNCTION pgtaskpy.cancel_remote_task(bigint);

-- STOP rows get their stop time (retention deletes by it); finished rows do
-- not keep the worker that ran them.
UPDATE @extschema@.task SET stop = now() WHERE state = 'STOP' AND stop IS NULL;
UPDATE @extschema@.task SET worker = NULL WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND worker IS NOT NULL;
