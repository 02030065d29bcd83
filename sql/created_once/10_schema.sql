-- The schema of the internals and the task's state type.  Created once: a
-- change here needs a hand-written step in sql/upgrade/.

CREATE SCHEMA pgtaskpy;
COMMENT ON SCHEMA pgtaskpy IS 'pg_task_py internals: scheduling functions called by the launcher';

CREATE TYPE @extschema@.state AS ENUM ('PLAN', 'TAKE', 'WORK', 'DONE', 'FAIL', 'STOP', 'GONE');
COMMENT ON TYPE @extschema@.state IS
    'PLAN waiting, TAKE claimed, WORK running, DONE ok, FAIL error, STOP stopped by a user, GONE not started within active';

