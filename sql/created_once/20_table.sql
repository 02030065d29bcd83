-- The task table: pg_task's columns, names, types and defaults, plus `owner`
-- (whom the task runs as), `save`, `worker` and `notice`; its indexes.
-- Created once: a change here needs a hand-written step in sql/upgrade/.

CREATE TABLE @extschema@.task (
    id          bigserial PRIMARY KEY,
    -- (pg_task.id: the scheduler sets it in a task's session; a value that is no id is an
    -- error naming the setting, as the other defaults' are, not the bare bigint error)
    parent      bigint DEFAULT CASE WHEN pgtaskpy.setting('id') ~ '^[0-9]{1,18}$' THEN pgtaskpy.setting('id')::bigint
                                ELSE pgtaskpy.setting_default('id', NULL::bigint) END,
    plan        timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    start       timestamptz,
    stop        timestamptz,
    active      interval NOT NULL DEFAULT pgtaskpy.setting_default('active', interval '1 hour'),
    live        interval NOT NULL DEFAULT pgtaskpy.setting_default('live', interval '0 sec'),
    repeat      interval NOT NULL DEFAULT pgtaskpy.setting_default('repeat', interval '0 sec'),
    timeout     interval NOT NULL DEFAULT pgtaskpy.setting_default('timeout', interval '0 sec'),
    count       integer NOT NULL DEFAULT pgtaskpy.setting_default('count', 0),
    hash        integer NOT NULL GENERATED ALWAYS AS (hashtext("group" || E'\x1f' || COALESCE(remote, ''))) STORED,
    max         integer NOT NULL DEFAULT pgtaskpy.setting_default('max', 0),
    pid         integer,
    state       @extschema@.state NOT NULL DEFAULT 'PLAN',
    delete      boolean NOT NULL DEFAULT pgtaskpy.setting_default('delete', true),
    drift       boolean NOT NULL DEFAULT pgtaskpy.setting_default('drift', false),
    header      boolean NOT NULL DEFAULT pgtaskpy.setting_default('header', true),
    string      boolean NOT NULL DEFAULT pgtaskpy.setting_default('string', true),
    delimiter   text NOT NULL DEFAULT pgtaskpy.setting_default('delimiter', E'\t'::text),
    escape      text NOT NULL DEFAULT pgtaskpy.setting_default('escape', ''::text),
    quote       text NOT NULL DEFAULT pgtaskpy.setting_default('quote', ''::text),
    data        text,
    error       text,
    "group"     text NOT NULL DEFAULT pgtaskpy.setting_default('group', 'group'::text),
    input       text NOT NULL,
    "null"      text NOT NULL DEFAULT pgtaskpy.setting_default('null', E'\\N'::text),
    output      text,
    remote      text,
    save        boolean NOT NULL DEFAULT pgtaskpy.setting_default('save', false),
    owner       name NOT NULL DEFAULT current_user,
    worker      integer,
    notice      text,
    cron        text,
    tz          text NOT NULL DEFAULT pgtaskpy.setting_default('tz', 'UTC'::text),
    key         text,
    retry       integer NOT NULL DEFAULT pgtaskpy.setting_default('retry', 0),
    retry_delay interval NOT NULL DEFAULT pgtaskpy.setting_default('retry_delay', interval '10 s'),
    retry_max   interval NOT NULL DEFAULT pgtaskpy.setting_default('retry_max', interval '1 hour'),
    retry_on    text[] NOT NULL DEFAULT pgtaskpy.setting_default('retry_on', '{40001,40P01,55P03,08}'::text[]),
    retry_unsafe boolean NOT NULL DEFAULT pgtaskpy.setting_default('retry_unsafe', false),
    attempt     integer NOT NULL DEFAULT 1,
    sqlstate    text,
    after       bigint[],
    after_any   boolean NOT NULL DEFAULT false,
    waiting_for integer NOT NULL DEFAULT 0,
    exclusive   boolean NOT NULL DEFAULT false,
    target      text,
    paused      interval NOT NULL DEFAULT interval '0'
    -- Impossible values are rejected by the trigger task_check (sql/replayed/30_triggers.sql).
);

COMMENT ON TABLE @extschema@.task IS 'pg_task_py: insert SQL into input, read output/error/state back';
COMMENT ON COLUMN @extschema@.task.owner IS 'role the task runs as (its session logs in as this role)';
COMMENT ON COLUMN @extschema@.task.worker IS 'pid of the local backend that claimed (TAKE) or supervises (WORK) the task';
COMMENT ON COLUMN @extschema@.task.notice IS 'NOTICE and WARNING messages the task raised, one a line';
COMMENT ON COLUMN @extschema@.task.save IS 'keep session state (temp tables, SET) for the next task of a reused worker session';
COMMENT ON COLUMN @extschema@.task.cron IS 'cron expression (pg_cron syntax): each run''s end inserts the next run at its next match';
COMMENT ON COLUMN @extschema@.task.tz IS 'the time zone cron is read in, and repeat''s days, months and years are counted in';
COMMENT ON COLUMN @extschema@.task.key IS 'a series'' name: at most one waiting task per owner and key (task_schedule)';
COMMENT ON COLUMN @extschema@.task.retry IS 'most further attempts after a failure whose SQLSTATE retry_on names';
COMMENT ON COLUMN @extschema@.task.attempt IS '1 for a first run, n + 1 for the retry of attempt n (set by the scheduler)';
COMMENT ON COLUMN @extschema@.task.sqlstate IS 'the SQLSTATE of a FAIL''s error';
COMMENT ON COLUMN @extschema@.task.after IS 'ids of the prerequisites: the task runs once every one has ended DONE';
COMMENT ON COLUMN @extschema@.task.after_any IS 'run once every prerequisite has ended, whatever its end state';
COMMENT ON COLUMN @extschema@.task.waiting_for IS 'how many prerequisites have not ended yet (the scheduler counts them down)';
COMMENT ON COLUMN @extschema@.task.exclusive IS 'start only when no other task of the database runs, and let none start while it runs';
COMMENT ON COLUMN @extschema@.task.target IS 'where the task runs: NULL here, ''standby'' a read-only session on the launcher''s standby';
COMMENT ON COLUMN @extschema@.task.paused IS 'how long task_pause held the waiting task: added to its active, not to its next run''s';

-- Finding due work stays cheap however many finished rows the table holds:
-- every scheduling index covers only the few rows that are waiting or running.
-- The claim's indexes leave out tasks still waiting for prerequisites
-- (waiting_for > 0): however many there are, a claim never reads them.
CREATE INDEX task_plan_waiting ON @extschema@.task (plan) WHERE state = 'PLAN' AND waiting_for = 0;
-- A group's waiting tasks in priority order; plan last (the order is id's): a
-- group's scans for due tasks check it in the index, so that tasks planned ahead
-- of them cost an index entry each, not a row each (claim_due_tasks).
CREATE INDEX task_hash_waiting ON @extschema@.task (hash, max DESC, id, plan) WHERE state = 'PLAN' AND waiting_for = 0;
CREATE INDEX task_hash_plan_waiting ON @extschema@.task (hash, plan) WHERE state = 'PLAN' AND waiting_for = 0;
-- Waiting tasks in priority order across groups: a claim looks at the groups
-- of the first ones only, however many groups wait (claim_candidate_groups).
CREATE INDEX task_priority_waiting ON @extschema@.task (max DESC, id) WHERE state = 'PLAN' AND waiting_for = 0;
-- Tasks waiting for prerequisites, by id: for resolve_dependents and task_stats
-- (no claim reads them).
CREATE INDEX task_blocked ON @extschema@.task (id) WHERE state = 'PLAN' AND waiting_for > 0;
CREATE INDEX task_hash_running ON @extschema@.task (hash) WHERE state IN ('TAKE', 'WORK');
CREATE INDEX task_parent ON @extschema@.task (parent) WHERE parent IS NOT NULL;
CREATE INDEX task_stop_finished ON @extschema@.task (stop) WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP');
-- Named series: one waiting run per owner and key, and its running run found
-- at once (a series' runs never overlap).
CREATE UNIQUE INDEX task_key_waiting ON @extschema@.task (owner, key) WHERE state = 'PLAN' AND key IS NOT NULL;
CREATE INDEX task_key_running ON @extschema@.task (owner, key) WHERE state IN ('TAKE', 'WORK') AND key IS NOT NULL;
-- Exclusive tasks waiting or running: each claim looks (an empty index, mostly),
-- at those running and at those due (by state, then plan), not at those planned ahead.
CREATE INDEX task_exclusive_pending ON @extschema@.task (state, plan) WHERE exclusive AND state IN ('PLAN', 'TAKE', 'WORK');

-- pg_dump keeps users' tasks (the extension's objects are recreated by CREATE EXTENSION).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.task', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.task_id_seq', '');
