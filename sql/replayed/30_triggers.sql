-- The table's row checks and the wake-up of launchers.  Replayed by every
-- upgrade script (sql/build.py): functions and triggers only.

-- Rejects what a task row cannot hold, with the error a CHECK constraint of that
-- name would raise (SQLSTATE 23514), so the name says what is wrong.  A trigger
-- rather than constraints: CHECK constraints are prepared again by every UPDATE
-- statement, the scheduler's too, which never touches these columns; this
-- trigger fires only when they are written.
--
-- The bounds keep every computation of the scheduler in range (plan + active,
-- plan + k * repeat, -max ms, statement_timeout), so that no row can make a
-- launcher's turn fail for everyone.  An interval must not mix signs
-- ('1 mon -30 days' is zero or less on some dates and more on others).
-- An interval the scheduler can add to any plan: at most 1000 years, and no
-- part (months, days, time) negative.
CREATE FUNCTION pgtaskpy.interval_is_sane(value interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT value <= interval '1000 years'
       AND pg_catalog.date_part('year', value) >= 0 AND pg_catalog.date_part('month', value) >= 0
       AND pg_catalog.date_part('day', value) >= 0
       AND pg_catalog.date_part('hour', value) * 3600 + pg_catalog.date_part('minute', value) * 60
           + pg_catalog.date_part('second', value) >= 0
$$;

-- retry_on: five-character SQLSTATEs, two-character classes, or '*' (every error).
-- STABLE, as array_to_string is: a function declared IMMUTABLE over a STABLE
-- body is not inlined, and its body was parsed and planned again on every
-- insert (0.1 ms of a lone task's 0.45 ms insert).
CREATE FUNCTION pgtaskpy.retry_on_is_valid(codes text[]) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN pg_catalog.array_ndims(codes) > 1 THEN false  -- (array_position refuses those)
                ELSE pg_catalog.array_position(codes, NULL) IS NULL
                     AND NOT EXISTS (SELECT FROM pg_catalog.unnest(codes) AS c(code)  -- (each: '{"22,22012"}' is one)
                                     WHERE c.code OPERATOR(pg_catalog.!~) E'^([0-9A-Z]{2}|[0-9A-Z]{5}|\\*)$')
           END
$$;

-- The first of the rules for a task's values that row t breaks (its words name the column, as a
-- CHECK constraint's name would), or NULL.  check_task's; and the update's from a version before,
-- which refuses such rows (sql/upgrade/1.2--1.3.after.sql): one the update let through could not be
-- changed after it, its series not ended, nor a dump of the table restored (a review).  No SET
-- clause: inlined into check_task, whose search_path it runs with.
CREATE FUNCTION pgtaskpy.violated_rule(t @extschema@.task) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN NOT (isfinite(t.plan) AND t.plan >= timestamptz '1900-01-01 00:00+00'
                  AND t.plan < timestamptz '10000-01-01 00:00+00')
            THEN 'task.plan must be a finite time from 1900 to 9999'
        WHEN NOT t.active > interval '0' THEN 'task.active must be a positive interval'
        WHEN NOT (t.paused >= interval '0' AND t.paused < t.active AND pgtaskpy.interval_is_sane(t.paused))
            THEN 'task.paused must be from 0 to less than active'  -- (nor mix signs: a series' next runs
                                                                   -- get active - paused, which would)
        WHEN NOT t.live >= interval '0' THEN 'task.live must not be negative'
        WHEN NOT t.repeat >= interval '0' THEN 'task.repeat must not be negative'
        WHEN t.cron IS NOT NULL AND t.repeat > interval '0' THEN 'task.cron and task.repeat must not both be set'
        WHEN NOT t.timeout >= interval '0' THEN 'task.timeout must not be negative'
        WHEN NOT (pgtaskpy.interval_is_sane(t.active) AND pgtaskpy.interval_is_sane(t.live)
                  AND pgtaskpy.interval_is_sane(t.repeat))
            THEN 'task.active, live and repeat must be at most 1000 years, without negative parts'
        WHEN NOT (pgtaskpy.interval_is_sane(t.timeout) AND t.timeout <= interval '2147483.647 seconds')
            THEN 'task.timeout must be at most 2147483.647 seconds (statement_timeout), without negative parts'
        WHEN NOT t.count >= 0 THEN 'task.count must not be negative'
        WHEN NOT t.max > -2147483648 THEN 'task.max must be at least -2147483647'
        -- (btrim of a text in a multibyte encoding takes 12 bytes a character: an input of 128
        -- million characters passed the server's 1 GB allocation limit, an internal error.  Its
        -- bytes, then: the trimmed characters are ASCII, which no other character's bytes hold.)
        WHEN NOT (btrim(left(t.input, 100), E' \t\r\n;') <> ''
                  OR btrim(convert_to(t.input, current_setting('server_encoding')), E'\\x090a0d203b'::bytea) <> ''::bytea)
            THEN 'task.input must not be empty'
        -- (a longer key fails the unique index of waiting keys with the server's raw message)
        WHEN NOT (t.key <> '' AND octet_length(t.key) <= 1000) THEN 'task.key must not be empty nor over 1000 bytes'
        -- (the group is a key of the counters, pauses and rate limits: a longer one failed the
        -- counters' index at the task's end, and with it every launcher turn of the database)
        WHEN NOT octet_length(t."group") <= 1000 THEN 'task.group must not be over 1000 bytes'
        WHEN NOT length(t.delimiter) = 1 THEN 'task.delimiter must be exactly one character'
        WHEN NOT length(t.quote) <= 1 THEN 'task.quote must be at most one character'
        WHEN NOT length(t.escape) <= 1 THEN 'task.escape must be at most one character'
        -- (each NULL of a row is written so: 1,000 NULLs of a 1 MB null took the task's worker to
        -- 474 MB before the output limit could stop it, a probe)
        WHEN NOT length(t."null") <= 1000 THEN 'task.null must be at most 1000 characters'
        WHEN NOT t.retry BETWEEN 0 AND 2147483646 THEN 'task.retry must be from 0 to 2147483646'
        -- (an administrator's: 0 or less gave a task more retries than retry says)
        WHEN NOT t.attempt >= 1 THEN 'task.attempt must be at least 1'
        WHEN NOT (t.retry_delay >= interval '0' AND t.retry_max >= interval '0'
                  AND pgtaskpy.interval_is_sane(t.retry_delay) AND pgtaskpy.interval_is_sane(t.retry_max))
            THEN 'task.retry_delay and retry_max must be at most 1000 years, without negative parts'
        WHEN NOT pgtaskpy.retry_on_is_valid(t.retry_on)
            THEN 'task.retry_on must hold SQLSTATEs (40001, 40P01: upper case), classes (08) or *'
        WHEN NOT (t.target IS NULL OR (t.target = 'standby' AND t.remote IS NULL))
            THEN 'task.target must be NULL or ''standby'', and NULL for a remote task'
        -- (libpq's defaults filled an empty one in: the task ran in the database named after its
        -- role, on the socket's server, not here)
        WHEN NOT btrim(t.remote, E' \t\r\n') <> '' THEN 'task.remote must not be empty (NULL: the task runs here)'
    END
$$;

CREATE FUNCTION pgtaskpy.check_task() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    violated text;
    problem text;
BEGIN
    -- Said here, naming the column set: NOT NULL, checked once the generated columns are
    -- computed, named the hash that the group makes ('null value in column "hash"').
    IF NEW."group" IS NULL THEN
        RAISE EXCEPTION 'null value in column "group" of relation "%" violates not-null constraint', TG_TABLE_NAME
            USING ERRCODE = 'not_null_violation', COLUMN = 'group', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    -- A cron task takes no repeat from pg_task.repeat: the column's default, not its author,
    -- set both (ALTER ROLE ... SET pg_task.repeat failed every cron insert of the role).
    IF TG_OP = 'INSERT' AND NEW.cron IS NOT NULL AND NEW.repeat > interval '0'
       AND NEW.repeat = pgtaskpy.setting_default('repeat', interval '0 sec') THEN
        NEW.repeat := interval '0';
    END IF;
    -- cron and tz: the error names the field and the token that cannot be
    -- read.  A cron task whose plan is left at its default (now()) waits for
    -- the first match; so does a waiting one whose cron or tz changes while
    -- its plan does not.
    IF NEW.tz IS DISTINCT FROM 'UTC' THEN  -- (the default needs no check)
        problem := pgtaskpy.tz_problem(NEW.tz);
        -- (a name the session reads otherwise than the scheduler, where its author names it: not
        -- in a copy of a task, a next run, a retry or task_retry's, nor in an UPDATE that leaves tz
        -- as it was: a task_cancel of a series' waiting run, a task_retry, were refused.  Not told
        -- by `parent` alone, which an author, and pg_task.id, sets: a review)
        IF problem IS NULL AND current_setting('timezone_abbreviations') <> 'Default'
           AND (TG_OP = 'INSERT' AND current_setting('pgtaskpy.next_run', true) IS DISTINCT FROM 'on'
                AND (NEW.parent IS NULL OR current_setting('pgtaskpy.copied_task', true) IS DISTINCT FROM NEW.parent::text)
                OR TG_OP = 'UPDATE' AND NEW.tz IS DISTINCT FROM OLD.tz) THEN
            problem := pgtaskpy.abbreviation_read_otherwise(NEW.tz);
        END IF;
        IF problem IS NOT NULL THEN
            violated := 'task.tz must be a time zone PostgreSQL knows';
            RAISE EXCEPTION 'invalid task.tz "%": %', NEW.tz, problem
                USING ERRCODE = 'check_violation', CONSTRAINT = violated, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                      HINT = concat_ws(' ', 'Use a region''s name of pg_timezone_names, such as ''Europe/Berlin'', or ''UTC''.',
                                       CASE WHEN TG_OP = 'INSERT' THEN pgtaskpy.settings_behind(violated, TG_RELID) END);
        END IF;
    END IF;
    IF NEW.cron IS NOT NULL THEN
        -- (read character by character: one of 200 MB was an internal error, out of memory)
        IF octet_length(NEW.cron) > 1000 THEN
            violated := 'task.cron must not be over 1000 bytes';
            RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, violated
                USING ERRCODE = 'check_violation', CONSTRAINT = violated, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
        END IF;
        IF pgtaskpy.cron_parse(NEW.cron, false) IS NULL THEN
            violated := 'task.cron must be a cron expression that matches';
            RAISE EXCEPTION 'invalid task.cron "%": %', NEW.cron, pgtaskpy.cron_problem(NEW.cron)
                USING ERRCODE = 'check_violation', CONSTRAINT = violated, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                      HINT = 'Five fields (minute hour day-of-month month day-of-week), a macro such as @daily, '
                             'or ''N seconds''; try one with task_next_runs(cron).';
        END IF;
        IF NEW.state = 'PLAN'
           AND ((TG_OP = 'INSERT' AND NEW.plan = now())
                OR (TG_OP = 'UPDATE' AND NEW.plan = OLD.plan AND (NEW.cron, NEW.tz) IS DISTINCT FROM (OLD.cron, OLD.tz))) THEN
            NEW.plan := pgtaskpy.cron_next(NEW.cron, NEW.tz, clock_timestamp());
        END IF;
    END IF;
    -- A one-off task under the key of a series whose run is running (no run waits: the key is
    -- free) would take the key from the series' next run, which that run's end then gives up
    -- (follow_task): the series ended without a word.  So would a waiting task's key changed to
    -- it; a STOP row waits for nothing.
    IF NEW.state = 'PLAN' AND (TG_OP = 'INSERT' OR NEW.key IS DISTINCT FROM OLD.key)
       AND NEW.key IS NOT NULL AND NEW.cron IS NULL AND NEW.repeat = interval '0'
       AND EXISTS (SELECT FROM @extschema@.task AS s
                   WHERE s.owner = NEW.owner AND s.key = NEW.key AND s.state IN ('TAKE', 'WORK')
                     AND (s.cron IS NOT NULL OR s.repeat > interval '0'))
       AND NOT EXISTS (SELECT FROM @extschema@.task AS w
                       WHERE w.owner = NEW.owner AND w.key = NEW.key AND w.state = 'PLAN') THEN
        RAISE EXCEPTION 'key "%" names a series of %: a task without cron or repeat cannot take it', NEW.key, NEW.owner
            USING ERRCODE = 'unique_violation',
                  HINT = 'Give the task another key; run the series now with UPDATE task SET plan = now() '
                         'WHERE key = ... AND state = ''PLAN''.';
    END IF;
    -- (NULL passes, as in a CHECK constraint: NOT NULL rejects it.)
    violated := pgtaskpy.violated_rule(NEW);
    -- (a default of pg_task.<column>: the rule names the column, its HINT the setting)
    problem := CASE WHEN TG_OP = 'INSERT' AND violated IS NOT NULL THEN pgtaskpy.settings_behind(violated, TG_RELID) END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, violated
            USING ERRCODE = 'check_violation', CONSTRAINT = violated,
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, HINT = problem;
    ELSIF violated IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, violated
            USING ERRCODE = 'check_violation', CONSTRAINT = violated,
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    -- An exclusive task holds back every role's tasks: an administrator's tool.  (A run
    -- again of an exclusive task an administrator gave the owner, task_retry's, stays one.)
    IF NEW.exclusive AND (TG_OP = 'INSERT' OR NOT OLD.exclusive)
       AND NOT pg_has_role('pgtaskpy_admin', 'MEMBER')  -- (true for superusers)
       -- (task_retry's copy of an ended exclusive task: its input, where and how it runs, one at a
       -- time.  Any row naming such a parent was let through: an author inserted exclusive tasks
       -- of any input, as many as it liked, once an admin had made one of its tasks exclusive.
       -- The next regular run of a series is no run again: it refused the copy of its failed run.)
       AND NOT (TG_OP = 'INSERT' AND EXISTS (
                    SELECT FROM @extschema@.task AS p
                    WHERE p.id = NEW.parent AND p.owner = NEW.owner AND p.exclusive
                      AND p.state IN ('FAIL', 'GONE', 'STOP') AND p.input = NEW.input
                      AND p.remote IS NOT DISTINCT FROM NEW.remote AND p.target IS NOT DISTINCT FROM NEW.target
                      -- (one run, as long and as often retried as the admin's: a series of the copy
                      -- held back every role's tasks again and again)
                      AND NEW.repeat <= interval '0' AND NEW.cron IS NULL
                      AND (NEW.timeout, NEW.retry, NEW.retry_delay, NEW.retry_max, NEW.retry_on)
                          IS NOT DISTINCT FROM (p.timeout, p.retry, p.retry_delay, p.retry_max, p.retry_on))
                AND pgtaskpy.run_again_to_come(NEW.parent) IS NULL) THEN
        RAISE EXCEPTION 'permission denied to make a task exclusive'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An exclusive task holds back every role''s tasks: superusers and members of '
                         'pgtaskpy_admin may insert one.';
    END IF;
    -- Nor what an exclusive task runs, nor the parent that makes a copy task_retry's: an author
    -- changed a copy's input (a sleep of days held back every role's tasks), cleared its parent,
    -- and inserted another copy, as many as it liked.  Nor how often or how long it runs: an
    -- author made one a series of a millisecond's repeat, and every role's tasks waited (a probe).
    -- Ending its series (repeat 0, cron NULL), as README tells a run to, stays the author's.
    IF TG_OP = 'UPDATE' AND OLD.exclusive AND NEW.exclusive
       AND ((NEW.input, NEW.remote, NEW.target, NEW.parent, NEW.timeout,
             NEW.retry, NEW.retry_delay, NEW.retry_max, NEW.retry_on)
            IS DISTINCT FROM (OLD.input, OLD.remote, OLD.target, OLD.parent, OLD.timeout,
                              OLD.retry, OLD.retry_delay, OLD.retry_max, OLD.retry_on)
            OR ((NEW.repeat, NEW.cron) IS DISTINCT FROM (OLD.repeat, OLD.cron)
                AND NOT (NEW.repeat = interval '0' AND NEW.cron IS NULL)))
       AND NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to change what exclusive task % runs', OLD.id
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Its input, remote, target, parent, repeat, cron, timeout and retries are as an '
                           'administrator made them.',
                  HINT = 'An exclusive task holds back every role''s tasks: superusers and members of '
                         'pgtaskpy_admin may change it.';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.owner IS NOT DISTINCT FROM OLD.owner THEN
        RETURN NEW;
    END IF;
    -- A task runs as its owner, so naming another role would borrow its privileges; and
    -- row-level security lets a role write only its own tasks, unless it is an admin.  (Said
    -- here: the policy's own error does not say why.)
    IF NEW.owner IS DISTINCT FROM current_user
       AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT (pg_has_role('pgtaskpy_admin', 'MEMBER')
                AND EXISTS (SELECT FROM pg_roles WHERE rolname = NEW.owner)
                AND pg_has_role(current_user, NEW.owner, 'MEMBER')) THEN
        RAISE EXCEPTION 'permission denied to set task.owner to "%"', NEW.owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Leave owner at its default (current_user), or SET ROLE to that role first. Only '
                         'superusers, and members of pgtaskpy_admin who are members of that role, may name another.';
    END IF;
    IF TG_OP = 'UPDATE' AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'permission denied to change task.owner'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

-- Whether current_user is a superuser now, in the WHEN of task_check and task_guard_update:
-- has_table_privilege('pg_catalog.pg_authid'::pg_catalog.regclass, 'UPDATE').  The setting
-- is_superuser is what the session logged in as, and stays 'on' after ALTER ROLE ... NOSUPERUSER (a
-- session that trusted it rewrote task rows past every check).  A superuser's rights to update a
-- system catalog are checked against the role as it is (no GRANT gives them to another).  Written
-- out, not a SQL function's call: each statement that fires a trigger prepares its WHEN, and an
-- inlined function's body is parsed again each time (12 us of each update of a task's state;
-- bench/RESULTS.md).

-- The next run or retry the scheduler inserts (follow_task marks its insert
-- with pgtaskpy.next_run) copies a row that passed these checks, with a plan
-- of its own computing: it skips them (a cron expression is parsed again by
-- every check).  Only in a superuser's session, as that superuser: anyone can
-- set the mark.  (A function of a task author that a superuser called, SECURITY
-- DEFINER, skipped every check while the session's is_superuser decided: it
-- inserted an exclusive task, and set its author's ended task back to PLAN to
-- run it again.  Wherever current_user is not session_user, the checks run and
-- read current_user's rights.)
CREATE TRIGGER task_check
    BEFORE INSERT OR UPDATE OF plan, active, live, repeat, timeout, count, max, input, delimiter, quote, escape, "null", owner,
        cron, tz, retry, retry_delay, retry_max, retry_on, target, remote, paused, key, exclusive, "group", parent,
        attempt
    ON @extschema@.task
    FOR EACH ROW
    WHEN (NOT pg_catalog.has_table_privilege('pg_catalog.pg_authid'::pg_catalog.regclass, 'UPDATE')
          OR CURRENT_USER <> SESSION_USER
          OR pg_catalog.current_setting('pgtaskpy.next_run', true) IS NULL
          -- ('' too: what a setting made for the transaction is once the transaction has ended)
          OR pg_catalog.current_setting('pgtaskpy.next_run', true) OPERATOR(pg_catalog.=) ANY (ARRAY['off', '']))
    EXECUTE FUNCTION pgtaskpy.check_task();

-- The columns the scheduler keeps (state, start, stop, pid, worker, output,
-- error, notice, sqlstate, attempt) are its own: a task author who could write them could make a
-- task run twice (WORK back to PLAN), hide a running one (DONE), or point
-- task_cancel at somebody else's backend.  A task author inserts a task in
-- PLAN or STOP, stops it while it waits (PLAN -> STOP), and changes its
-- definition while it is not running; a running task is cancelled through
-- task_cancel, not deleted (its run would go on, with no end recorded, no
-- retry, and its dependents stopped as if it had never run).  Superusers and members of pgtaskpy_admin may write anything,
-- to repair rows by hand, but a running task's STOP, which would not stop its run.  Whoever sets STOP, stop is stamped, so that
-- retention sees the row.
CREATE FUNCTION pgtaskpy.guard_task() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    written text;
    rewritten boolean;  -- what the task runs, or how often
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN
            RAISE EXCEPTION 'task % is running: it cannot be deleted', OLD.id
                USING ERRCODE = 'object_in_use',
                      HINT = format('Cancel it with task_cancel(%s); delete it when it has ended.', OLD.id);
        END IF;
        -- (an admin's repair: allowed, but said, as deleting a series' run is how pg_cron and
        -- TimescaleDB users end a job, and the run went on unseen)
        -- (and what it held is free at the commit: a probe's after_any clean-up step ran beside the
        -- run it was to follow, and a second task of its group, key or an exclusive one beside it)
        RAISE WARNING 'task % was running: its run goes on, and its end, retry and next run will not be written', OLD.id
            USING DETAIL = 'What it holds is free from the commit on: its group''s place, its key, an exclusive '
                           'task''s hold; its dependents follow the deletion (after_any ones start).',
                  HINT = format('Cancel a running task with task_cancel(%s, true), and delete it when it has ended.',
                                OLD.id);
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'WORK' AND NEW.state = 'STOP' THEN
        -- (whoever: a superuser's STOP, as pg_task users stop tasks, was taken, and the run went on,
        -- committed its work, and its end was never recorded)
        RAISE EXCEPTION 'task % is running: a STOP does not stop it', OLD.id
            USING ERRCODE = 'object_in_use',
                  HINT = format('Cancel it with task_cancel(%s) (it ends FAIL); task_cancel(%s, true) ends its '
                                'series too.  A run whose worker is gone ends by itself, FAIL.', OLD.id, OLD.id);
    END IF;
    -- A task runs as its owner: an admin who is not a member of that role steers its tasks
    -- (STOP, task_cancel, a pause) and repairs their ends, but may not change what they run,
    -- which would then run as that role (an admin made a superuser's waiting task ALTER ROLE
    -- ... SUPERUSER, and it ran), nor make them run again and again (repeat, cron: a
    -- superuser's statement replayed every second; retries: a task of another role's ran four
    -- times, a probe, and retry_unsafe ran again a lost run that may have committed), nor start
    -- them: set back to waiting, a
    -- superuser's finished task ran again as that superuser, and with a pid of its choosing on
    -- a task set running, task_cancel signalled any backend of the owner's (a superuser's query).
    IF TG_OP = 'UPDATE' AND OLD.owner IS DISTINCT FROM current_user THEN
        -- (attempt too: the retry of attempt n runs while n <= retry, and an attempt written back
        -- to 1 ran a failed task again and again, a review's probe)
        rewritten := (NEW.input, NEW.remote, NEW.target, NEW.repeat, NEW.cron,
                      NEW.retry, NEW.retry_delay, NEW.retry_max, NEW.retry_on, NEW.retry_unsafe, NEW.attempt)
                     IS DISTINCT FROM (OLD.input, OLD.remote, OLD.target, OLD.repeat, OLD.cron,
                                       OLD.retry, OLD.retry_delay, OLD.retry_max, OLD.retry_on, OLD.retry_unsafe,
                                       OLD.attempt);
        IF (rewritten OR NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('PLAN', 'TAKE', 'WORK')
                OR (NEW.pid, NEW.worker, NEW.start) IS DISTINCT FROM (OLD.pid, OLD.worker, OLD.start))
           AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           AND NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = OLD.owner)
                    AND pg_has_role(current_user, OLD.owner, 'MEMBER')) THEN
            IF rewritten THEN
                RAISE EXCEPTION 'permission denied to change what task % of role "%" runs', OLD.id, OLD.owner
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'A task runs as its owner: only superusers and members of that role may change '
                                 'its input, remote, target, repeat, cron, retries or attempt.';
            END IF;
            RAISE EXCEPTION 'permission denied to run task % of role "%"', OLD.id, OLD.owner
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = 'Its state, pid, worker and start were to change: a task runs as its owner.',
                      HINT = 'Only superusers and members of that role may set its task waiting or running again.';
        END IF;
    END IF;
    IF NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN  -- (true for superusers)
        IF TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id THEN
            RAISE EXCEPTION 'permission denied to change task.id'
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = 'A task''s dependents, next runs and retries name it by its id.';
        END IF;
        -- An id ahead of the sequence is one the sequence gives later: the scheduler's insert of
        -- another role's next run or retry then failed on it, and ended that run FAIL.
        IF TG_OP = 'INSERT' AND NEW.id > pgtaskpy.task_ids_given() THEN
            RAISE EXCEPTION 'permission denied to choose task.id %', NEW.id
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = 'Ids ahead of the sequence task_id_seq are its to give: another task would get it.',
                      HINT = 'Leave id to its default.';
        END IF;
        -- (but its series may end, repeat 0 and cron NULL, as README tells a run to end its own:
        -- an author's run was refused, and its series went on failing at every run)
        IF TG_OP = 'UPDATE' AND OLD.state IN ('TAKE', 'WORK')
           AND ((to_jsonb(NEW) - '{data,hash}'::text[]) IS DISTINCT FROM (to_jsonb(OLD) - '{data,hash}'::text[]))
           AND NOT ((to_jsonb(NEW) - '{data,hash,repeat,cron}'::text[])
                    IS NOT DISTINCT FROM (to_jsonb(OLD) - '{data,hash,repeat,cron}'::text[])
                    -- (as text: '30 days' = '1 mon' and '24 hours' = '1 day' as intervals)
                    AND (NEW.repeat::text = OLD.repeat::text OR NEW.repeat = interval '0')
                    AND (NEW.cron IS NOT DISTINCT FROM OLD.cron OR NEW.cron IS NULL)) THEN
            RAISE EXCEPTION 'task % is running: only its data can change', OLD.id
                USING ERRCODE = 'object_in_use',
                      HINT = format('Cancel it with task_cancel(%s); change it when it has ended.', OLD.id);
        END IF;
        IF NEW.state IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.state ELSE 'PLAN' END)
           AND NOT (NEW.state = 'STOP' AND (TG_OP = 'INSERT' OR OLD.state = 'PLAN')) THEN
            RAISE EXCEPTION 'permission denied to set task.state to %', NEW.state
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = 'The scheduler moves a task through its states.',
                      HINT = 'A task author inserts a task in PLAN or STOP and stops a waiting one with '
                             'state = ''STOP''; task_cancel(id) cancels a running one.';
        END IF;
        written := CASE
            WHEN NEW.start IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.start END) THEN 'start'
            WHEN NEW.stop IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.stop END) THEN 'stop'
            WHEN NEW.pid IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.pid END) THEN 'pid'
            WHEN NEW.worker IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.worker END) THEN 'worker'
            WHEN NEW.output IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.output END) THEN 'output'
            WHEN NEW.error IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.error END) THEN 'error'
            WHEN NEW.notice IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.notice END) THEN 'notice'
            WHEN NEW.sqlstate IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.sqlstate END) THEN 'sqlstate'
            WHEN NEW.attempt IS DISTINCT FROM (CASE TG_OP WHEN 'UPDATE' THEN OLD.attempt ELSE 1 END) THEN 'attempt'
            WHEN TG_OP = 'UPDATE' AND NEW.waiting_for IS DISTINCT FROM OLD.waiting_for THEN 'waiting_for'
        END;
        IF written IS NOT NULL THEN
            RAISE EXCEPTION 'permission denied to write task.%', written
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = format('%s is written by the scheduler.', written),
                      HINT = 'Superusers and members of pgtaskpy_admin may repair rows by hand.';
        END IF;
    END IF;
    IF NEW.state = 'STOP' AND NEW.stop IS NULL THEN
        NEW.stop := clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;

-- The last id the sequence of task ids gave (0 before its first): an id above it is one it gives
-- later.  (pg_sequence_last_value needs only USAGE, which a task author has for the default.)
-- (Written out in the WHEN of task_guard_insert: see task_guard_update.)
CREATE FUNCTION pgtaskpy.task_ids_given() RETURNS bigint
LANGUAGE sql STABLE
AS $$ SELECT coalesce(pg_catalog.pg_sequence_last_value('@extschema@.task_id_seq'::pg_catalog.regclass), 0) $$;

-- Inserts with only user columns (the scheduler's repeats, most users' rows)
-- and the scheduler's own updates (superuser sessions) skip the call.  (Wherever
-- current_user is not session_user, a SECURITY DEFINER function's, the function
-- runs and finds current_user's rights itself; see task_check.)
CREATE TRIGGER task_guard_insert
    BEFORE INSERT ON @extschema@.task
    FOR EACH ROW
    WHEN (NEW.state <> 'PLAN' OR NEW.start IS NOT NULL OR NEW.stop IS NOT NULL OR NEW.pid IS NOT NULL
          OR NEW.worker IS NOT NULL OR NEW.output IS NOT NULL OR NEW.error IS NOT NULL OR NEW.notice IS NOT NULL
          OR NEW.sqlstate IS NOT NULL OR NEW.attempt <> 1
          OR NEW.id > coalesce(pg_catalog.pg_sequence_last_value('@extschema@.task_id_seq'::pg_catalog.regclass), 0))
    EXECUTE FUNCTION pgtaskpy.guard_task();

CREATE TRIGGER task_guard_update
    BEFORE UPDATE ON @extschema@.task
    FOR EACH ROW
    WHEN (NOT pg_catalog.has_table_privilege('pg_catalog.pg_authid'::pg_catalog.regclass, 'UPDATE')
          OR CURRENT_USER <> SESSION_USER
          OR (NEW.state = 'STOP' AND (NEW.stop IS NULL OR OLD.state = 'WORK')))
    EXECUTE FUNCTION pgtaskpy.guard_task();

CREATE TRIGGER task_guard_delete
    BEFORE DELETE ON @extschema@.task
    FOR EACH ROW
    WHEN (OLD.state IN ('TAKE', 'WORK'))
    EXECUTE FUNCTION pgtaskpy.guard_task();

-- Launchers LISTEN on this channel: a new or re-planned task wakes them at once
-- instead of at the next poll.  Identical notifications of one transaction are
-- delivered once, so a bulk INSERT sends one.  The next run or retry that
-- follow_task inserts (it marks its insert with pgtaskpy.next_run) wakes
-- nobody when planned 2 s or more ahead ('on': a launcher looks at the table
-- at least once a second and plans its sleep by what it finds, and the
-- scheduler's transaction commits at once), nor when a worker inserts it
-- ('quiet': the worker wakes the launchers itself when it stops going on with
-- the group); a wake-up a run would cost more than the run (bench: cron, retry).
CREATE FUNCTION pgtaskpy.notify_launchers() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgtaskpy.wake_launchers();
    RETURN NULL;
END
$$;

CREATE TRIGGER task_notify_insert
    AFTER INSERT ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state = 'PLAN'
                       AND pg_catalog.current_setting('pgtaskpy.next_run', true) IS DISTINCT FROM 'quiet'
                       AND (NEW.plan < pg_catalog.clock_timestamp() + interval '2 s'
                            OR pg_catalog.current_setting('pgtaskpy.next_run', true) IS DISTINCT FROM 'on'))
    EXECUTE FUNCTION pgtaskpy.notify_launchers();

-- (cron and tz too: a change of either moves the plan in task_check, a BEFORE trigger, and an
-- UPDATE OF plan trigger does not fire for a column only a BEFORE trigger changed: a series
-- re-planned by task_schedule started at the launcher's next look, up to a second late)
CREATE TRIGGER task_notify_update
    AFTER UPDATE OF state, plan, cron, tz ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state = 'PLAN' AND (OLD.state <> 'PLAN' OR NEW.plan < OLD.plan))
    EXECUTE FUNCTION pgtaskpy.notify_launchers();
