-- 1.1 -> 1.2: what CREATE OR REPLACE cannot do.  sql/build.py appends every
-- function, procedure and trigger of 1.2 after this, as CREATE OR REPLACE.
-- (claim_next_in_group keeps its 1.1 signature for workers running 1.1 code
-- during the update.)

-- The value checks moved from CHECK constraints into the trigger task_check,
-- which also checks the owner.
ALTER TABLE @extschema@.task
    DROP CONSTRAINT "task.active must be a positive interval",
    DROP CONSTRAINT "task.live must not be negative",
    DROP CONSTRAINT "task.repeat must not be negative",
    DROP CONSTRAINT "task.timeout must not be negative",
    DROP CONSTRAINT "task.count must not be negative",
    DROP CONSTRAINT "task.input must not be empty",
    DROP CONSTRAINT "task.delimiter must be exactly one character",
    DROP CONSTRAINT "task.quote must be at most one character",
    DROP CONSTRAINT "task.escape must be at most one character";
DROP TRIGGER task_check_owner ON @extschema@.task;
DROP FUNCTION pgtaskpy.check_owner();
