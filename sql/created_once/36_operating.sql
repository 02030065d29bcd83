-- What a DBA reads and steers per group (sql/replayed/70_operating.sql): the
-- counters behind the view task_stats, paused groups, rate limits.  One row a
-- (owner, group): a role pauses, limits and sees only its own groups, as it
-- sees only its own tasks (members of pgtaskpy_admin: everyone's).
-- Created once: a change here needs a hand-written step in sql/upgrade/.

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
-- FAIL 57014 as a timeout's is, is not retried (retry_plan), unless the
-- cancel was a launcher's stop (by_stop), which nobody asked of the task.  Rows of ended
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
