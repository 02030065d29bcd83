-- 1.2 -> 1.3: what CREATE OR REPLACE cannot do.  sql/build.py appends every
-- function, procedure and trigger of 1.3 after this, as CREATE OR REPLACE.

-- 1.3 refuses a group over 1000 bytes (30_triggers.sql): the group is a key of the counters,
-- pauses and rate limits, whose indexes take 2,704 bytes at most.  A row of before with a longer
-- one failed this update with the index's words, or, waiting, ran and could never be written
-- ended (a probe).  Said first, naming the rows, before anything has changed (the rows that
-- break 1.3's other rules: sql/upgrade/1.2--1.3.after.sql).
DO $$
DECLARE
    long_groups bigint[] := ARRAY(SELECT t.id FROM @extschema@.task AS t
                                  WHERE octet_length(t."group") > 1000 ORDER BY t.id LIMIT 11);
BEGIN
    IF cardinality(long_groups) > 0 THEN
        RAISE EXCEPTION 'cannot update pg_task_py to 1.3: task% % % a group over 1000 bytes, which 1.3 refuses',
                        CASE WHEN cardinality(long_groups) > 1 THEN 's' ELSE '' END,
                        CASE WHEN cardinality(long_groups) > 10
                             THEN array_to_string(long_groups[1:10], ', ') || ' and more'
                             ELSE array_to_string(long_groups, ', ') END,
                        CASE WHEN cardinality(long_groups) > 1 THEN 'have' ELSE 'has' END
            USING ERRCODE = 'check_violation',
                  HINT = 'Give them a shorter group first, e.g. UPDATE task SET "group" = md5("group") WHERE'
                         ' octet_length("group") > 1000 AND state NOT IN (''TAKE'', ''WORK''), once those running have'
                         ' ended; then update again.';
    END IF;
END
$$;

-- task_cancel checks the running task's real backend itself (SECURITY
-- DEFINER pgtaskpy.cancel_running_task); the old helper trusted the row.
DROP FUNCTION pgtaskpy.cancel_remote_task(bigint);

-- STOP rows get their stop time (retention deletes by it); finished rows do
-- not keep the worker that ran them.
UPDATE @extschema@.task SET stop = now() WHERE state = 'STOP' AND stop IS NULL;
UPDATE @extschema@.task SET worker = NULL WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND worker IS NOT NULL;

-- parent's default: a pg_task.id that is no id is an error naming the setting
-- (sql/created_once/20_table.sql).
ALTER TABLE @extschema@.task ALTER COLUMN parent SET DEFAULT
    CASE WHEN pgtaskpy.setting('id') ~ '^[0-9]{1,18}$' THEN pgtaskpy.setting('id')::bigint
         ELSE pgtaskpy.setting_default('id', NULL::bigint) END;

-- pgtaskpy_user: what a task author needs, in one role (sql/created_once/35_security.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgtaskpy_user') THEN
        BEGIN
            CREATE ROLE pgtaskpy_user NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN  -- (another database's update at once)
            NULL;
        END;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA @extschema@ TO pgtaskpy_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.task TO pgtaskpy_user;
GRANT USAGE ON SEQUENCE @extschema@.task_id_seq TO pgtaskpy_user;
DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('pgtaskpy_admin', 'pgtaskpy_user', 'MEMBER') THEN
        GRANT pgtaskpy_user TO pgtaskpy_admin;  -- (sql/created_once/35_security.sql)
    END IF;
END
$$;

-- Cron schedules and named series: columns cron, tz, key and their indexes
-- (sql/created_once/20_table.sql).  Existing tasks get no cron, tz UTC and no key: UTC as a
-- constant first, then the setting's default for new rows (the updating session's pg_task.tz
-- went into every existing row, a zone nobody chose for their repeats, or none the server knows).
ALTER TABLE @extschema@.task
    ADD COLUMN cron text,
    ADD COLUMN tz text NOT NULL DEFAULT 'UTC',
    ADD COLUMN key text;
ALTER TABLE @extschema@.task ALTER COLUMN tz SET DEFAULT pgtaskpy.setting_default('tz', 'UTC'::text);
COMMENT ON COLUMN @extschema@.task.cron IS 'cron expression (pg_cron syntax): each run''s end inserts the next run at its next match';
COMMENT ON COLUMN @extschema@.task.tz IS 'the time zone cron is read in, and repeat''s days, months and years are counted in';
COMMENT ON COLUMN @extschema@.task.key IS 'a series'' name: at most one waiting task per owner and key (task_schedule)';
CREATE UNIQUE INDEX task_key_waiting ON @extschema@.task (owner, key) WHERE state = 'PLAN' AND key IS NOT NULL;
CREATE INDEX task_key_running ON @extschema@.task (owner, key) WHERE state IN ('TAKE', 'WORK') AND key IS NOT NULL;

-- Retries (sql/created_once/20_table.sql): existing tasks are not retried
-- (retry 0, whatever pg_task.retry says now) and count as first attempts;
-- their errors keep no SQLSTATE.
ALTER TABLE @extschema@.task
    ADD COLUMN retry integer NOT NULL DEFAULT 0,
    ADD COLUMN retry_delay interval NOT NULL DEFAULT interval '10 s',
    ADD COLUMN retry_max interval NOT NULL DEFAULT interval '1 hour',
    ADD COLUMN retry_on text[] NOT NULL DEFAULT '{40001,40P01,55P03,08}'::text[],
    ADD COLUMN retry_unsafe boolean NOT NULL DEFAULT false,
    ADD COLUMN attempt integer NOT NULL DEFAULT 1,
    ADD COLUMN sqlstate text;
ALTER TABLE @extschema@.task
    ALTER COLUMN retry SET DEFAULT pgtaskpy.setting_default('retry', 0),
    ALTER COLUMN retry_delay SET DEFAULT pgtaskpy.setting_default('retry_delay', interval '10 s'),
    ALTER COLUMN retry_max SET DEFAULT pgtaskpy.setting_default('retry_max', interval '1 hour'),
    ALTER COLUMN retry_on SET DEFAULT pgtaskpy.setting_default('retry_on', '{40001,40P01,55P03,08}'::text[]),
    ALTER COLUMN retry_unsafe SET DEFAULT pgtaskpy.setting_default('retry_unsafe', false);
COMMENT ON COLUMN @extschema@.task.retry IS 'most further attempts after a failure whose SQLSTATE retry_on names';
COMMENT ON COLUMN @extschema@.task.attempt IS '1 for a first run, n + 1 for the retry of attempt n (set by the scheduler)';
COMMENT ON COLUMN @extschema@.task.sqlstate IS 'the SQLSTATE of a FAIL''s error';

-- claim_due_tasks leaves out the tasks its launcher holds back (`held`: their sessions were
-- refused a moment ago).
DROP FUNCTION pgtaskpy.claim_due_tasks(integer, integer);
-- finish_task takes the error's SQLSTATE.
DROP FUNCTION pgtaskpy.finish_task(bigint, @extschema@.state, text, text, @extschema@.state[], text, boolean);
-- claim_next_task takes the task whose settings the offered session started
-- with (a 1.2 worker's call, without it, finds the new one by its defaults).
DROP FUNCTION pgtaskpy.claim_next_task(integer, integer, integer, name, text, integer, interval);
-- Workflows: columns after, after_any, waiting_for, exclusive; the claim's
-- indexes leave out tasks waiting for prerequisites; the edges table
-- (sql/created_once/20_table.sql, 25_prerequisites.sql).  Existing tasks wait
-- for nothing and are not exclusive.
ALTER TABLE @extschema@.task
    ADD COLUMN after bigint[],
    ADD COLUMN after_any boolean NOT NULL DEFAULT false,
    ADD COLUMN waiting_for integer NOT NULL DEFAULT 0,
    ADD COLUMN exclusive boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN @extschema@.task.after IS 'ids of the prerequisites: the task runs once every one has ended DONE';
COMMENT ON COLUMN @extschema@.task.after_any IS 'run once every prerequisite has ended, whatever its end state';
COMMENT ON COLUMN @extschema@.task.waiting_for IS 'how many prerequisites have not ended yet (the scheduler counts them down)';
COMMENT ON COLUMN @extschema@.task.exclusive IS 'start only when no other task of the database runs, and let none start while it runs';
DROP INDEX @extschema@.task_plan_waiting, @extschema@.task_hash_waiting, @extschema@.task_hash_plan_waiting;
CREATE INDEX task_plan_waiting ON @extschema@.task (plan) WHERE state = 'PLAN' AND waiting_for = 0;
CREATE INDEX task_hash_waiting ON @extschema@.task (hash, max DESC, id, plan) WHERE state = 'PLAN' AND waiting_for = 0;
CREATE INDEX task_hash_plan_waiting ON @extschema@.task (hash, plan) WHERE state = 'PLAN' AND waiting_for = 0;
CREATE INDEX task_priority_waiting ON @extschema@.task (max DESC, id) WHERE state = 'PLAN' AND waiting_for = 0;
CREATE INDEX task_blocked ON @extschema@.task (id) WHERE state = 'PLAN' AND waiting_for > 0;
CREATE INDEX task_exclusive_pending ON @extschema@.task (state, plan) WHERE exclusive AND state IN ('PLAN', 'TAKE', 'WORK');
CREATE TABLE pgtaskpy.pending_prerequisite (
    prerequisite bigint NOT NULL,
    dependent    bigint NOT NULL,
    PRIMARY KEY (prerequisite, dependent)
);
COMMENT ON TABLE pgtaskpy.pending_prerequisite IS 'edges prerequisite -> dependent of tasks that wait for prerequisites';
REVOKE ALL ON pgtaskpy.pending_prerequisite FROM PUBLIC;
CREATE INDEX pending_prerequisite_dependent ON pgtaskpy.pending_prerequisite (dependent);
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.pending_prerequisite', '');
-- task_enqueue gains after, after_any, exclusive, key and on_conflict.
DROP FUNCTION @extschema@.task_enqueue(text, timestamptz, text, integer, interval, interval, text, text);
-- Operating (sql/created_once/36_operating.sql): counters, paused groups, rate limits.

-- Finished rows in the table by state, kept by the scheduler as tasks end
-- (finish_task), are stopped, or are deleted, so that task_stats never counts
-- millions of finished rows; and the last success and failure.
CREATE TABLE pgtaskpy.group_counts (
    owner           name NOT NULL,
    "group"         text NOT NULL,
    done            bigint NOT NULL DEFAULT 0,
    fail            bigint NOT NULL DEFAULT 0,
    gone            bigint NOT NULL DEFAULT 0,
    stop            bigint NOT NULL DEFAULT 0,
    last_success    timestamptz,
    last_failure    timestamptz,
    last_error      text,
    -- FAIL ends after the last DONE (by stop): GONE and STOP neither count nor reset them
    consecutive_failures bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, "group")
);

-- Changes not yet added to group_counts: one row an end (+1), one a
-- statement's deleted rows of a group and state (minus their number).
-- Inserted by the transactions that end or delete tasks, so that concurrent
-- ends of one group never queue on its counters row; the launcher's
-- housekeeping adds them to group_counts once a second (fold_group_counts).
CREATE TABLE pgtaskpy.group_count_changes (
    owner           name NOT NULL,
    "group"         text NOT NULL,
    state           @extschema@.state NOT NULL,
    n               bigint NOT NULL,
    at              timestamptz,
    error           text
);
-- (No key: REPLICA IDENTITY FULL, so that a database published FOR ALL TABLES can delete
-- the rows the launcher folds; without it every turn failed, "cannot delete from table
-- group_count_changes because it does not have a replica identity", and nothing started.)
ALTER TABLE pgtaskpy.group_count_changes REPLICA IDENTITY FULL;
-- (the housekeeping adds a batch of whole groups up at a time, in this order, and a group's own
-- pile in the order of its ends, a DONE before a FAIL of the same moment: fold_group_counts)
CREATE INDEX group_count_changes_group ON pgtaskpy.group_count_changes (owner, "group", at, state);

-- Groups that start nothing until task_resume.
-- Their owners may write them directly (row-level security), so their checks
-- keep every value the scheduler computes with: a `per` of a hundred million
-- years, written by hand, failed every claim of every role with "timestamp out
-- of range".
CREATE TABLE pgtaskpy.group_pause (
    owner           name NOT NULL,
    "group"         text NOT NULL,
    since           timestamptz NOT NULL DEFAULT now() CHECK (isfinite(since)),
    PRIMARY KEY (owner, "group")
);
-- (the launcher's --metrics labels each role's longest paused: metrics_snapshot)
CREATE INDEX group_pause_owner_since ON pgtaskpy.group_pause (owner, since);

-- At most `starts` starts of the group in any `per` (a sliding window).
CREATE TABLE pgtaskpy.group_limit (
    owner           name NOT NULL,
    "group"         text NOT NULL,
    starts          integer NOT NULL CHECK (starts BETWEEN 1 AND 100000),
    per             interval NOT NULL CHECK (per > interval '0' AND per <= interval '1000 years'),
    PRIMARY KEY (owner, "group")
);

-- The start times of rate-limited groups' tasks, while they may count in a
-- window (pgtaskpy.note_start; at most `starts` a group, by the limit itself).
-- Inserted, never updated: a start waits for no other transaction's row.  The
-- scheduler's only, so that no role can hold a row the starts prune.
CREATE TABLE pgtaskpy.limited_start (
    owner           name NOT NULL,
    "group"         text NOT NULL,
    at              timestamptz NOT NULL
);
CREATE INDEX limited_start_group_at ON pgtaskpy.limited_start (owner, "group", at);
REVOKE ALL ON pgtaskpy.limited_start FROM PUBLIC;
ALTER TABLE pgtaskpy.limited_start REPLICA IDENTITY FULL;  -- (no key: as group_count_changes)

GRANT SELECT ON pgtaskpy.group_counts, pgtaskpy.group_count_changes TO pgtaskpy_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskpy.group_pause, pgtaskpy.group_limit TO pgtaskpy_user;
ALTER TABLE pgtaskpy.group_counts ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgtaskpy.group_count_changes ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgtaskpy.group_pause ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgtaskpy.group_limit ENABLE ROW LEVEL SECURITY;
CREATE POLICY group_owner_or_admin ON pgtaskpy.group_counts
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));
CREATE POLICY group_owner_or_admin ON pgtaskpy.group_count_changes
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));
CREATE POLICY group_owner_or_admin ON pgtaskpy.group_pause
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'))
    WITH CHECK (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));
CREATE POLICY group_owner_or_admin ON pgtaskpy.group_limit
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'))
    WITH CHECK (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));

-- pg_dump keeps them with the tasks (the counters match the rows dumped beside them).
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.group_counts', '');
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.group_count_changes', '');
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.group_pause', '');
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.group_limit', '');

-- Running tasks task_cancel has cancelled (cancel_running_task): their end,
-- FAIL 57014 as a timeout's is, is not retried (retry_plan).  Rows of ended
-- tasks go with housekeeping (recover_orphaned_tasks).  The scheduler's only.
CREATE TABLE pgtaskpy.cancelled_run (
    task_id bigint PRIMARY KEY,
    by_stop boolean NOT NULL DEFAULT false  -- a launcher's stop past its --grace: retried as an error
);
REVOKE ALL ON pgtaskpy.cancelled_run FROM PUBLIC;

-- The end of the pause of a group after one of its tasks with a negative max ran (pause_group):
-- until then its owner's tasks of the group with a negative max wait, those that come due during
-- the pause too (inserted, released by a dependency, moved into the group), which claims pass
-- over.  A row a group; housekeeping deletes those that are over once no task of the group
-- runs (recover_orphaned_tasks: the next pause counts on from the end one of them waited for),
-- and claims read the first end by `until`.  The scheduler writes them; task_stats reads its
-- caller's, whose held tasks are not due.
CREATE TABLE pgtaskpy.group_spacing (
    owner name NOT NULL,
    hash integer NOT NULL,  -- (task.hash: the group's)
    until timestamptz NOT NULL,
    PRIMARY KEY (owner, hash)
);
CREATE INDEX group_spacing_until ON pgtaskpy.group_spacing (until);
REVOKE ALL ON pgtaskpy.group_spacing FROM PUBLIC;
ALTER TABLE pgtaskpy.group_spacing ENABLE ROW LEVEL SECURITY;
CREATE POLICY group_owner_or_admin ON pgtaskpy.group_spacing FOR SELECT
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));
GRANT SELECT ON pgtaskpy.group_spacing TO pgtaskpy_user;
-- (dumped with the tasks: a copy restored during a pause ran the tasks it held at once, a probe)
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.group_spacing', '');

-- Retention by state (pg_task_py.retention_done, retention_fail): the rows of
-- one state in stop order, never reading those another state keeps longer.
CREATE INDEX task_state_stop_finished ON @extschema@.task (state, stop) WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP');
-- pg_task_py.keep_runs: the finished runs of each series, newest first.  A
-- series is a named one (owner, key), else the runs of a repeating task
-- (repeat or cron), which share owner, group, remote, cron and input.
CREATE INDEX task_series_finished ON @extschema@.task
    (owner, (COALESCE('k' || key, 'r' || hash::text || md5(COALESCE(cron, '') || input))), stop DESC)
    WHERE state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND (key IS NOT NULL OR repeat > interval '0' OR cron IS NOT NULL);

-- The counters start from the rows already there.
INSERT INTO pgtaskpy.group_counts (owner, "group", done, fail, gone, stop, last_success, last_failure, last_error,
                                   consecutive_failures)
SELECT t.owner, t."group",
       count(*) FILTER (WHERE t.state = 'DONE'), count(*) FILTER (WHERE t.state = 'FAIL'),
       count(*) FILTER (WHERE t.state = 'GONE'), count(*) FILTER (WHERE t.state = 'STOP'),
       max(t.stop) FILTER (WHERE t.state = 'DONE'), max(t.stop) FILTER (WHERE t.state = 'FAIL'),
       left((array_agg(t.error ORDER BY t.stop DESC) FILTER (WHERE t.state = 'FAIL'))[1], 2000),
       count(*) FILTER (WHERE t.state = 'FAIL' AND t.stop > COALESCE(t.group_success, '-infinity'))
FROM (SELECT f.*, max(f.stop) FILTER (WHERE f.state = 'DONE') OVER (PARTITION BY f.owner, f."group") AS group_success
      FROM @extschema@.task AS f WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP')) AS t
GROUP BY t.owner, t."group";
-- Tasks that ask for a standby (column target, sql/created_once/20_table.sql).
ALTER TABLE @extschema@.task ADD COLUMN target text;
COMMENT ON COLUMN @extschema@.task.target IS 'where the task runs: NULL here, ''standby'' a read-only session on the launcher''s standby';
-- The time task_pause held a waiting task, which task_resume adds to its active
-- (column paused, sql/created_once/20_table.sql): the next run of a series
-- takes its active without it.
ALTER TABLE @extschema@.task ADD COLUMN paused interval NOT NULL DEFAULT interval '0';
COMMENT ON COLUMN @extschema@.task.paused IS 'how long task_pause held the waiting task: added to its active, not to its next run''s';

-- The proof of the caller's right to a task (sql/created_once/35_security.sql).
-- task_unschedule and a stopped series' next run.  There, current_user is their owner, and
-- session_user may be a superuser's session that called a task author's SECURITY DEFINER
-- function (which then acted on any role's tasks): neither is the calling role.  The public
-- half inserts a row here in the same transaction, which row-level security lets through
-- only for a task the calling role sees, or for that role's own name; the privileged half
-- takes it (pgtaskpy.take_steering_proof).  Nobody but the scheduler reads or deletes one.
CREATE TABLE pgtaskpy.steering_proof (
    xact xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    task_id bigint,
    owner name
);
CREATE INDEX steering_proof_xact ON pgtaskpy.steering_proof (xact);  -- (a role may insert millions)
ALTER TABLE pgtaskpy.steering_proof REPLICA IDENTITY FULL;  -- (no key: see group_count_changes')
ALTER TABLE pgtaskpy.steering_proof ENABLE ROW LEVEL SECURITY;
CREATE POLICY seen_by_the_caller ON pgtaskpy.steering_proof FOR INSERT
    WITH CHECK (xact = pg_catalog.pg_current_xact_id()
                AND (task_id IS NULL OR EXISTS (SELECT FROM @extschema@.task AS t WHERE t.id = task_id))
                AND (owner IS NULL OR owner = current_user));
GRANT INSERT ON pgtaskpy.steering_proof TO PUBLIC;  -- (task_cancel is any task author's, granted by hand too)

-- The scheduling lock moves from an advisory key, which every role may take, to a view no role
-- may lock (sql/created_once/26_locks.sql); an owner's lock is tried, never waited for.
CREATE VIEW pgtaskpy.scheduling_lock AS SELECT;
COMMENT ON VIEW pgtaskpy.scheduling_lock IS 'locked, never read: serializes the launchers'' claims';
REVOKE ALL ON pgtaskpy.scheduling_lock FROM PUBLIC;
DROP FUNCTION pgtaskpy.lock_owner(name);
