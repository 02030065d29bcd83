-- Operating a database's tasks: counters and the view task_stats, the event
-- of a task's end (NOTIFY pg_task_py_done), pausing a group, rate limits.
-- The scheduling functions (40_scheduling.sql) call in here with one line each:
-- finish_task (task_ended), the claims (group_paused, rate_room,
-- rate_has_room, take_start_slot), start_task (note_start) and
-- expire_inactive_tasks (group_paused).  The tables are in
-- sql/created_once/36_operating.sql.

-- --- Counters ---------------------------------------------------------------

-- Count one row of (owner, group) that became `state` at `at`: a change that
-- fold_group_counts adds to the counters.  (PL/pgSQL: it keeps the INSERT's
-- plan for the session, where an SQL function with SET plans it on every call.)
-- No SET clause: its callers, task_ended and count_finished_task, set the
-- search path (see notify_done).
CREATE FUNCTION pgtaskpy.count_end(task_owner name, task_group text, end_state @extschema@.state,
                                   at timestamptz, error text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgtaskpy.group_count_changes (owner, "group", state, n, at, error)
    VALUES (task_owner, task_group, end_state, 1, at, CASE WHEN end_state = 'FAIL' THEN left(error, 2000) END);
END
$$;

-- `success` when it is later than `failure` (or there is none), else NULL: a
-- success that resets a group's failures in a row (fold_group_counts,
-- group_stats).  Plain SQL, inlined into its callers.
CREATE FUNCTION pgtaskpy.newer_success(success timestamptz, failure timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN success > COALESCE(failure, '-infinity') THEN success END $$;

-- Whether the owner's group has a task waiting or running (fold_group_counts: a streak of
-- failures whose last failed rows have just gone).  Each from a partial index: its local waiting
-- tasks by the group's hash, its named series (remote ones too) by the owner's keys, and the
-- tasks waiting for prerequisites and the running ones, which are few.  One scan of the table
-- a group made a fold of retention's deletions take seconds, holding every claim back (a review).
-- (A remote group's unnamed series, waiting, is not seen: its streak ends with its failed rows.)
CREATE FUNCTION pgtaskpy.group_has_tasks_to_run(task_owner name, task_group text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off
AS $$
    SELECT EXISTS (SELECT FROM @extschema@.task AS t
                   WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.hash = hashtext(task_group || E'\x1f')
                     AND t.owner = task_owner AND t."group" = task_group)
        OR EXISTS (SELECT FROM @extschema@.task AS t
                   WHERE t.state = 'PLAN' AND t.key IS NOT NULL AND t.owner = task_owner AND t."group" = task_group)
        OR EXISTS (SELECT FROM @extschema@.task AS t
                   WHERE t.state = 'PLAN' AND t.waiting_for > 0 AND t.owner = task_owner AND t."group" = task_group)
        OR EXISTS (SELECT FROM @extschema@.task AS t
                   WHERE t.state IN ('TAKE', 'WORK') AND t.owner = task_owner AND t."group" = task_group)
$$;

-- Add changes to the counters (fold_group_counts, in the launcher's housekeeping,
-- chooses them: `changes`, their ctids), read and deleted in one statement; returns
-- how many.  Failures in a row: those of the changes after the group's last success (the counters' or
-- the changes'), added to the counters' own unless the changes hold a newer
-- success (group_stats reads the changes not yet folded the same way).  A
-- success of the changes older than the counters' last failure (an end that
-- committed late) resets nothing: the failures after it are not known one by one.
-- The changes' failures before it are not after it, all the same (moved in with it: a review).
CREATE FUNCTION pgtaskpy.fold_changes(changes tid[]) RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    WITH folded AS (
        DELETE FROM pgtaskpy.group_count_changes AS d
        WHERE d.ctid = ANY (changes)
        RETURNING d.*
    ), beside_success AS (
        SELECT f.*, greatest(max(f.at) FILTER (WHERE f.state = 'DONE' AND f.n > 0) OVER (PARTITION BY f.owner, f."group"),
                             k.last_success) AS success,
               k.owner IS NULL AS first_counted  -- (the group has no counters yet: inserted below)
        FROM folded AS f LEFT JOIN pgtaskpy.group_counts AS k ON k.owner = f.owner AND k."group" = f."group"
    ), counted AS (
        INSERT INTO pgtaskpy.group_counts AS c (owner, "group", done, fail, gone, stop, last_success, last_failure, last_error,
                                               consecutive_failures)
        SELECT f.owner, f."group",
               COALESCE(sum(f.n) FILTER (WHERE f.state = 'DONE'), 0), COALESCE(sum(f.n) FILTER (WHERE f.state = 'FAIL'), 0),
               COALESCE(sum(f.n) FILTER (WHERE f.state = 'GONE'), 0), COALESCE(sum(f.n) FILTER (WHERE f.state = 'STOP'), 0),
               max(f.at) FILTER (WHERE f.state = 'DONE' AND f.n > 0), max(f.at) FILTER (WHERE f.state = 'FAIL' AND f.n > 0),
               (array_agg(f.error ORDER BY f.at DESC) FILTER (WHERE f.state = 'FAIL' AND f.n > 0))[1],
               -- (a group's first counters: a streak whose failed rows are gone already, in a group
               -- with no task to run, is over, as below; stored as 1, it came back with the group's
               -- next task, where two folds of the same ends stored 0: a review)
               CASE WHEN bool_and(f.first_counted) AND COALESCE(sum(f.n) FILTER (WHERE f.state = 'FAIL'), 0) <= 0
                         AND count(*) FILTER (WHERE f.state = 'FAIL' AND f.n > 0
                                              AND f.at > COALESCE(f.success, '-infinity')) > 0
                         AND NOT pgtaskpy.group_has_tasks_to_run(f.owner, f."group") THEN 0
                    ELSE count(*) FILTER (WHERE f.state = 'FAIL' AND f.n > 0 AND f.at > COALESCE(f.success, '-infinity'))
               END
        FROM beside_success AS f
        GROUP BY f.owner, f."group"
        ON CONFLICT (owner, "group") DO UPDATE
        SET done = c.done + excluded.done, fail = c.fail + excluded.fail, gone = c.gone + excluded.gone,
            stop = c.stop + excluded.stop,
            last_success = greatest(excluded.last_success, c.last_success),
            last_failure = greatest(excluded.last_failure, c.last_failure),
            last_error = CASE WHEN excluded.last_failure >= c.last_failure OR c.last_failure IS NULL
                              THEN COALESCE(excluded.last_error, c.last_error) ELSE c.last_error END,
            -- (a streak whose last failed rows go, in a group with no task to run, is over, and stored
            -- so: a removed series' streak does not come back with the group's next task.  A series
            -- whose failed rows retention deletes between its runs has its next run waiting, and goes
            -- on.  Asked of such a streak only: not of every group whose finished rows retention deletes)
            consecutive_failures = CASE
                WHEN c.fail + excluded.fail <= 0 AND c.consecutive_failures + excluded.consecutive_failures > 0
                     AND NOT pgtaskpy.group_has_tasks_to_run(c.owner, c."group") THEN 0
                ELSE excluded.consecutive_failures
                     + CASE WHEN pgtaskpy.newer_success(excluded.last_success, greatest(c.last_success, c.last_failure))
                                 IS NOT NULL THEN 0 ELSE c.consecutive_failures END END
        RETURNING 1
    )
    SELECT count(*) FROM folded
$$;

-- A batch of the changes, read and deleted in one statement: whole groups, in
-- the order of their key, as many as `most` changes hold (at least one), so that a
-- group's ends are added up together, as the failures in a row need: `folded`, how many;
-- `more`, whether more may wait (the launcher goes on at its next turns while they do).
-- All of them in one call held the scheduling lock, and every role's claims, for as
-- long as a task author's bulk took: 12 s after an INSERT of 1,000,000 finished rows,
-- 22 s after their DELETE (a probe).  Batches of `most` as they lay split a group's
-- ends out of order (its failures in a row went wrong), and updated the same counters
-- again at each batch, which an old snapshot made slower at each (a review).  A
-- group of more than `most` changes is added up `most` at a time, in the order of its ends.
CREATE FUNCTION pgtaskpy.fold_group_counts(most integer DEFAULT 5000, OUT folded bigint, OUT more boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owners name[];
    groups text[];
    changes tid[];
    n integer;
BEGIN
    SELECT array_agg(c.owner), array_agg(c."group"), array_agg(c.ctid), count(*)
    INTO owners, groups, changes, n
    FROM (SELECT c.owner, c."group", c.ctid FROM pgtaskpy.group_count_changes AS c
          ORDER BY c.owner, c."group" LIMIT most + 1) AS c;
    more := n > most;
    IF NOT more THEN
        folded := pgtaskpy.fold_changes(changes);
        RETURN;
    END IF;
    -- The last group read may have more changes than were read: it is left for the next batch.
    changes := ARRAY(SELECT c.ctid FROM unnest(owners, groups, changes) AS c(owner, "group", ctid)
                     WHERE (c.owner, c."group") IS DISTINCT FROM (owners[n], groups[n]));
    IF cardinality(changes) > 0 THEN
        folded := pgtaskpy.fold_changes(changes);
        RETURN;
    END IF;
    -- One group of more than `most` changes (an author's bulk of its own finished rows, inserted
    -- or moved into it): its first `most` in the order of their ends, those of no end (a move's or
    -- a delete's minus) last, as a drain of them a second at a time would have added them up.
    -- (Whole, a move of 200,000 failed rows held every role's claims 3 s: a review.)  A DONE
    -- before a FAIL of the same moment, as one call counts them (the FAIL not after the DONE):
    -- a batch that ended between a FAIL and the DONE after it resets nothing (a review).
    folded := pgtaskpy.fold_changes(ARRAY(
        SELECT c.ctid FROM pgtaskpy.group_count_changes AS c
        WHERE c.owner = owners[1] AND c."group" = groups[1]
        ORDER BY c.owner, c."group", c.at, c.state LIMIT most));
END
$$;

-- finish_task's hook, in the transaction that ends the task: count it, and
-- tell the applications that LISTEN (pg_task_py.notify_done).  Also the
-- trigger's for the ends no scheduler function makes (count_finished_task).
CREATE FUNCTION pgtaskpy.task_ended(t @extschema@.task) RETURNS void
LANGUAGE plpgsql  -- (no SET clause: see notify_done)
AS $$
BEGIN
    PERFORM pgtaskpy.count_end(t.owner, t."group", t.state, t.stop, t.error);
    IF pgtaskpy.notify_done(t.owner) THEN
        -- (a payload is at most 8000 bytes: a long group name is cut)
        PERFORM pg_notify(pgtaskpy.name_of('done channel'),
                          json_build_object('id', t.id, 'state', t.state, 'group', left(t."group", 1000),
                                            'owner', t.owner)::text);
    END IF;
END
$$;

-- A task author stops a waiting task with an UPDATE (or task_cancel does, or
-- a failed prerequisite stops its dependents), or inserts a row that has
-- ended already (STOP, or a copy restored by hand): no scheduler function sees
-- that, so a trigger counts it and tells the applications that LISTEN, as
-- finish_task's hook does.  SECURITY DEFINER: the author may not write the
-- counters.
CREATE FUNCTION pgtaskpy.count_finished_task() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgtaskpy.task_ended(NEW);
    RETURN NULL;
END
$$;

-- Deleted finished rows leave the counters (retention, keep_runs, a task that
-- produced nothing, a user's DELETE): one change a group and state, not a row.
CREATE FUNCTION pgtaskpy.uncount_deleted_tasks() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgtaskpy.group_count_changes (owner, "group", state, n)
    SELECT o.owner, o."group", o.state, -count(*)
    FROM deleted_tasks AS o
    WHERE o.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
    GROUP BY o.owner, o."group", o.state
    UNION ALL
    -- (a waiting or running task deleted from a group whose streak of failures has no failed row
    -- left: a change of nothing, so that the fold looks again whether the streak is over, as
    -- after a removed series' last run; else it came back with the group's next task)
    SELECT o.owner, o."group", 'FAIL', 0
    FROM deleted_tasks AS o
    WHERE o.state IN ('PLAN', 'TAKE', 'WORK')
      AND EXISTS (SELECT FROM pgtaskpy.group_counts AS k
                  WHERE k.owner = o.owner AND k."group" = o."group" AND k.consecutive_failures > 0 AND k.fail <= 0)
    GROUP BY o.owner, o."group";
    RETURN NULL;
END
$$;

-- A finished row changed by hand: moved to another group (its author may
-- change a task's definition while it is not running) or owner, set waiting
-- again to run once more, or set to another end (an admin's repair).  Its old
-- count goes; its new one comes, as an end at its `stop` (with its error), but
-- for a new STOP, which count_finished_task counts as an end.  (Uncounted, a
-- moved row left its count with the old group, and deleted there drove the
-- new group's below zero.)  Not finish_task's own turn of its DONE into FAIL
-- when what follows the task fails (it counts that end itself): it names the
-- task in pgtaskpy.ending_task for that UPDATE.
CREATE FUNCTION pgtaskpy.recount_changed_task() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgtaskpy.group_count_changes (owner, "group", state, n) VALUES (OLD.owner, OLD."group", OLD.state, -1);
    IF NEW.state IN ('DONE', 'FAIL', 'GONE') OR (NEW.state = 'STOP' AND OLD.state = 'STOP') THEN
        PERFORM pgtaskpy.count_end(NEW.owner, NEW."group", NEW.state, NEW.stop, NEW.error);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION pgtaskpy.uncount_truncated_tasks() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgtaskpy.group_count_changes;
    UPDATE pgtaskpy.group_counts SET done = 0, fail = 0, gone = 0, stop = 0, consecutive_failures = 0;
    RETURN NULL;
END
$$;

-- (WHEN: a task inserted to wait, as nearly all are, queues no trigger call)
CREATE TRIGGER task_count_finished_insert
    AFTER INSERT ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state IN ('DONE', 'FAIL', 'GONE', 'STOP'))
    EXECUTE FUNCTION pgtaskpy.count_finished_task();

CREATE TRIGGER task_count_stopped_update
    AFTER UPDATE OF state ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state = 'STOP' AND OLD.state <> 'STOP')
    EXECUTE FUNCTION pgtaskpy.count_finished_task();

-- An end that the scheduler's finish_task and end_waiting_tasks did not write
-- (they count theirs, and say so in pgtaskpy.counting_ends): an admin's end
-- of a waiting or running task by hand, and an end an older version's
-- finish_task wrote (one under way as ALTER EXTENSION ... UPDATE ran waited
-- for the update's lock on the table, then went on in its old code, which
-- counted nothing).  Uncounted, each drove the totals below zero once deleted.
CREATE TRIGGER task_count_other_end_update
    AFTER UPDATE OF state ON @extschema@.task
    FOR EACH ROW WHEN (OLD.state IN ('PLAN', 'TAKE', 'WORK') AND NEW.state IN ('DONE', 'FAIL', 'GONE')
                       AND current_setting('pgtaskpy.counting_ends', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION pgtaskpy.count_finished_task();

CREATE TRIGGER task_recount_changed_update
    AFTER UPDATE OF owner, "group", state ON @extschema@.task
    FOR EACH ROW WHEN (OLD.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
                       AND ((OLD.owner, OLD."group") IS DISTINCT FROM (NEW.owner, NEW."group")
                            OR (NEW.state <> OLD.state
                                -- (any session may set it: it spares that change only, to FAIL in
                                -- place, which only admins and superusers may make by hand)
                                AND NOT (NEW.state = 'FAIL'
                                         AND current_setting('pgtaskpy.ending_task', true) IS NOT DISTINCT FROM NEW.id::text))))
    EXECUTE FUNCTION pgtaskpy.recount_changed_task();

CREATE TRIGGER task_count_deleted
    AFTER DELETE ON @extschema@.task
    REFERENCING OLD TABLE AS deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskpy.uncount_deleted_tasks();

CREATE TRIGGER task_count_truncated
    AFTER TRUNCATE ON @extschema@.task
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskpy.uncount_truncated_tasks();

-- --- Events -----------------------------------------------------------------

-- pg_task_py.notify_done for the tasks of `owner`: ALTER ROLE owner [IN
-- DATABASE] SET first, then the database's and the server's (scheduler_setting).
-- Read from the catalog (the owner's settings are not this session's), at
-- most once a second per session and owner: this runs at every task's end,
-- and the reading costs more than the rest of the hook.  No SET clause, as
-- task_ended and count_end have none: they run with the search_path of
-- finish_task, the hook's one caller (a SET clause sets the search path again
-- at every call: a few microseconds of each end).
CREATE FUNCTION pgtaskpy.notify_done(owner name) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    last_read text := current_setting('pgtaskpy.notify_done_read', true);  -- 'epoch|t|owner' or 'epoch|f|owner'
    now_s double precision := extract(epoch FROM clock_timestamp());
    bar integer := strpos(last_read, '|');
    setting text;
    role_database oid;  -- where the owner's own setting is: 0 every database, else this one
    notify boolean := false;
BEGIN
    IF bar > 0 AND substr(last_read, bar + 3) = owner
       AND now_s - substr(last_read, 1, bar - 1)::double precision BETWEEN 0 AND 1 THEN
        RETURN substr(last_read, bar + 1, 1) = 't';
    END IF;
    SELECT substr(c, length('pg_task_py.notify_done=') + 1), s.setdatabase INTO setting, role_database
    FROM pg_db_role_setting AS s CROSS JOIN unnest(s.setconfig) AS c
    WHERE s.setrole = to_regrole(quote_ident(owner))
      AND s.setdatabase IN (0, (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()))
      AND starts_with(c, 'pg_task_py.notify_done=')
    ORDER BY s.setdatabase DESC LIMIT 1;
    IF role_database IS NULL THEN
        setting := pgtaskpy.scheduler_setting('pg_task_py.notify_done');
    END IF;
    IF setting IS NOT NULL AND setting <> '' THEN
        BEGIN
            notify := setting::boolean;
        EXCEPTION WHEN data_exception THEN
            PERFORM pgtaskpy.warn_ignored_setting(
                'pg_task_py.notify_done', setting,
                CASE WHEN role_database = 0 THEN format('for role %I', owner)
                     WHEN role_database IS NOT NULL THEN format('for role %I in database %I', owner, current_database())
                     ELSE 'of ' || pgtaskpy.scheduler_setting_source('pg_task_py.notify_done') END,
                'not a boolean');
        END;
    END IF;
    PERFORM set_config('pgtaskpy.notify_done_read', now_s::text || '|' || (CASE WHEN notify THEN 't' ELSE 'f' END)
                                                     || '|' || owner, false);
    RETURN notify;
END
$$;

-- --- Pausing ----------------------------------------------------------------

-- Whether the owner's group is paused (the claims start none of its tasks,
-- expiry leaves them waiting).  PL/pgSQL, which keeps the plan for the
-- session: an SQL function with a subquery is not inlined, and is planned
-- again by every query that calls it (about 40 us a claim).  No SET clause: it
-- names its schema and operators.
--
-- The parameters with their columns' collations (here and in the rate limit's lookups
-- below): a parameter takes the call's collation, an index serves a comparison of its own
-- collation only, and the lookup was a scan of every pause (90 us a call beside 3,000
-- pauses; a claim beside 15,000 paused groups with due tasks, 6 s: every role's tasks
-- waited that long).
CREATE FUNCTION pgtaskpy.group_paused(task_owner name, task_group text) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM pgtaskpy.group_pause AS p
                   WHERE p.owner OPERATOR(pg_catalog.=) (task_owner COLLATE pg_catalog."C")
                     AND p."group" OPERATOR(pg_catalog.=) (task_group COLLATE pg_catalog."default"));
END
$$;

-- The owner whose group a caller may steer: the caller's own, another's only
-- for members of pgtaskpy_admin (and superusers).  `lifts`: the call only
-- removes a pause or a limit, which an admin may do for a role dropped since,
-- so that its rows do not stay for good (they hold nothing, but task_stats
-- shows them).
CREATE FUNCTION pgtaskpy.steered_owner(task_group text, task_owner name, what text, lifts boolean) RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF task_group IS NULL THEN
        RAISE EXCEPTION '%: the group must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    ELSIF octet_length(task_group) > 1000 THEN  -- (no task's group is: a pause or limit of it would hold nothing)
        RAISE EXCEPTION '%: the group must not be over 1000 bytes', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF task_owner IS NOT NULL AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.rolname = task_owner)
       AND NOT (lifts AND pg_has_role('pgtaskpy_admin', 'MEMBER')) THEN
        RAISE EXCEPTION '%: role "%" does not exist', what, task_owner USING ERRCODE = 'undefined_object';
    END IF;
    IF COALESCE(task_owner, current_user) <> current_user AND NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to %(%) of role "%"', what, quote_literal(task_group), task_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'A role steers its own groups; members of pgtaskpy_admin steer everyone''s.';
    END IF;
    RETURN COALESCE(task_owner, current_user);
END
$$;

-- Pause the owner's group (default: the caller's): none of its tasks starts
-- until task_resume; running ones finish.  False when it was paused already.
CREATE FUNCTION @extschema@.task_pause("group" text, owner name DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    whose name := pgtaskpy.steered_owner(task_pause."group", task_pause.owner, 'task_pause', false);
BEGIN
    INSERT INTO pgtaskpy.group_pause AS p (owner, "group") VALUES (whose, task_pause."group")
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION @extschema@.task_pause IS 'start none of the group''s tasks until task_resume (admins: any owner''s)';

-- Resume a paused group.  Its waiting tasks get the time they were paused
-- added to `active`, so that a pause never makes a task GONE, and to `paused`,
-- so that a series' next run takes its `active` without it (follow_task).
-- False when it was not paused.
CREATE FUNCTION @extschema@.task_resume("group" text, owner name DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    whose name := pgtaskpy.steered_owner(task_resume."group", task_resume.owner, 'task_resume', true);
    paused_since timestamptz;
BEGIN
    DELETE FROM pgtaskpy.group_pause AS p WHERE p.owner = whose AND p."group" = task_resume."group"
    RETURNING p.since INTO paused_since;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- (Read from the indexes of waiting tasks, ready and blocked: not a scan of the finished rows.
    -- `active` stays within its bound of 1000 years, and `paused` grows by what `active` grew.)
    UPDATE @extschema@.task AS t
    SET active = least(t.active + greatest(now() - greatest(t.plan, paused_since), interval '0'), interval '1000 years'),
        paused = t.paused + (least(t.active + greatest(now() - greatest(t.plan, paused_since), interval '0'),
                                   interval '1000 years') - t.active)
    WHERE t.id IN (SELECT w.id FROM @extschema@.task AS w
                   WHERE w.state = 'PLAN' AND w.waiting_for = 0 AND w.plan < now()
                     AND w.owner = whose AND w."group" = task_resume."group"
                   UNION ALL
                   SELECT b.id FROM @extschema@.task AS b
                   WHERE b.state = 'PLAN' AND b.waiting_for > 0 AND b.plan < now()
                     AND b.owner = whose AND b."group" = task_resume."group")
      AND t.state = 'PLAN';
    PERFORM pgtaskpy.wake_launchers();
    RETURN true;
END
$$;
COMMENT ON FUNCTION @extschema@.task_resume IS 'let a paused group''s tasks start again (admins: any owner''s)';

-- --- Rate limits ------------------------------------------------------------

-- A limit counts starts, the times in the task's `start` column, so that any
-- `per` of them holds at most `starts`: a claim sees the group's starts in the
-- window (pgtaskpy.limited_start) and its claimed tasks not started yet (TAKE),
-- each of which will start inside any window that holds a later claim's start.

-- How many more of the owner's group's tasks may start now (NULL: no limit;
-- 0 or less: none): `starts`, less the group's starts in the window and its
-- claimed tasks not started yet.  The count reads every start in the window:
-- a claim computes it once a group (claim_due_tasks), not once a due task,
-- which made a role's full window of many starts, with due tasks of as many
-- remotes, slow every role's claims.  The clock, not now(): a worker's claim
-- may come late in a long transaction.  PL/pgSQL without SET (every name
-- qualified), so that the plan is kept for the session: an SQL function with
-- a subquery is not inlined, and was planned again on every call (80 us).
CREATE FUNCTION pgtaskpy.rate_room(task_owner name, task_group text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN (
        SELECT l.starts
               OPERATOR(pg_catalog.-) (SELECT pg_catalog.count(*) FROM pgtaskpy.limited_start AS s
                                       WHERE s.owner OPERATOR(pg_catalog.=) (task_owner COLLATE pg_catalog."C")
                                         AND s."group" OPERATOR(pg_catalog.=) (task_group COLLATE pg_catalog."default")
                                         AND s.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp()
                                                                          OPERATOR(pg_catalog.-) l.per))
               -- (OPERATOR(...) binds left to right: starts - window, then - claimed)
               OPERATOR(pg_catalog.-) (SELECT pg_catalog.count(*) FROM @extschema@.task AS t  -- (task_hash_running)
                                       WHERE t.state OPERATOR(pg_catalog.=) 'TAKE'
                                         AND t.owner OPERATOR(pg_catalog.=) (task_owner COLLATE pg_catalog."C")
                                         AND t."group" OPERATOR(pg_catalog.=) (task_group COLLATE pg_catalog."default"))
        FROM pgtaskpy.group_limit AS l
        WHERE l.owner OPERATOR(pg_catalog.=) (task_owner COLLATE pg_catalog."C") AND l."group" OPERATOR(pg_catalog.=) (task_group COLLATE pg_catalog."default"));
END
$$;

-- Whether the owner's group may start its rank-th due task now (rank 1: the
-- next), for the claims of one task (claim_exclusive_task, take_start_slot).
CREATE FUNCTION pgtaskpy.rate_has_room(task_owner name, task_group text, rank bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN rank OPERATOR(pg_catalog.<=) COALESCE(pgtaskpy.rate_room(task_owner, task_group), rank);
END
$$;

-- When the owner's group has room again, as far as its window tells (NULL:
-- no start in it): its oldest start leaves the window.  Claims that left the
-- group's due tasks for the limit note it (note_rate_room_returns), and the
-- launcher's turn ends then (seconds_to_next_plan).  It waited for its next
-- housekeeping, up to a second later: 50 tasks under a limit of 5 a second
-- took 12.9 s to start, not 9, and 18 s as remote tasks, which only the
-- launcher claims.  (VOLATILE, as rate_room: the clock.)
CREATE FUNCTION pgtaskpy.rate_room_returns(task_owner name, task_group text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN (SELECT s.at OPERATOR(pg_catalog.+) l.per
            FROM pgtaskpy.group_limit AS l
            JOIN pgtaskpy.limited_start AS s ON s.owner OPERATOR(pg_catalog.=) l.owner
                                            AND s."group" OPERATOR(pg_catalog.=) l."group"
            WHERE l.owner OPERATOR(pg_catalog.=) (task_owner COLLATE pg_catalog."C") AND l."group" OPERATOR(pg_catalog.=) (task_group COLLATE pg_catalog."default")
              AND s.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) l.per)
            ORDER BY s.at LIMIT 1);
END
$$;

-- The earliest of the times noted in this transaction (as seconds since the
-- epoch: a timestamp's text depends on the session's DateStyle).
CREATE FUNCTION pgtaskpy.note_rate_room_returns(returns timestamptz) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
SELECT set_config('pgtaskpy.rate_room_returns',
                  least(extract(epoch FROM returns)::double precision,
                        nullif(current_setting('pgtaskpy.rate_room_returns', true), '')::double precision)::text,
                  true)
$$;

-- start_task's start counts in its group's window, if the group has a limit;
-- the group's starts out of the window go.  (SKIP LOCKED: two workers, each
-- starting several tasks in one transaction, would wait for each other's
-- deletes; what one leaves, a later start deletes.)
CREATE FUNCTION pgtaskpy.note_start(started @extschema@.task) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    per interval := (SELECT l.per FROM pgtaskpy.group_limit AS l
                     WHERE l.owner = started.owner AND l."group" = started."group");
BEGIN
    IF per IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO pgtaskpy.limited_start (owner, "group", at) VALUES (started.owner, started."group", started.start);
    DELETE FROM pgtaskpy.limited_start AS s
    WHERE s.ctid = ANY (ARRAY(SELECT o.ctid FROM pgtaskpy.limited_start AS o
                              WHERE o.owner = started.owner AND o."group" = started."group"
                                AND o.at <= clock_timestamp() - per
                              FOR UPDATE SKIP LOCKED));
END
$$;

-- A row of group_pause or group_limit its owner writes by hand (row-level
-- security) gets the checks task_pause and task_limit make, which the tables'
-- CHECKs do not: a `per` with a negative part ('1000000 years -359999000
-- days' is above zero and under 1000 years) failed each start of the group,
-- "timestamp out of range", and a group over 1000 bytes names no task's.
CREATE FUNCTION pgtaskpy.check_group_row() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF octet_length(NEW."group") > 1000 THEN
        RAISE EXCEPTION '%: the group must not be over 1000 bytes', TG_TABLE_NAME USING ERRCODE = 'check_violation';
    END IF;
    IF TG_TABLE_NAME = 'group_limit' THEN  -- (NEW.per, in an expression of its own: group_pause has none)
        IF NOT pgtaskpy.interval_is_sane(NEW.per) THEN
            RAISE EXCEPTION 'group_limit: per must be an interval greater than zero, at most 1000 years and with no negative part, not %',
                NEW.per USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER group_limit_checked
    BEFORE INSERT OR UPDATE ON pgtaskpy.group_limit
    FOR EACH ROW EXECUTE FUNCTION pgtaskpy.check_group_row();

CREATE TRIGGER group_pause_checked
    BEFORE INSERT OR UPDATE ON pgtaskpy.group_pause
    FOR EACH ROW EXECUTE FUNCTION pgtaskpy.check_group_row();

-- A limit removed (task_limit 0, or its row deleted or renamed by hand) takes
-- its group's starts along: no start notes them any more.  A limit made (or
-- renamed to) starts with none: a start whose transaction read the limit just
-- before it went notes its start after it went.  SECURITY DEFINER: the author
-- may not write them.
CREATE FUNCTION pgtaskpy.forget_limited_starts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM pgtaskpy.limited_start AS s WHERE s.owner = OLD.owner AND s."group" = OLD."group";
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        DELETE FROM pgtaskpy.limited_start AS s WHERE s.owner = NEW.owner AND s."group" = NEW."group";
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER group_limit_made_or_removed
    AFTER INSERT OR DELETE ON pgtaskpy.group_limit
    FOR EACH ROW EXECUTE FUNCTION pgtaskpy.forget_limited_starts();

CREATE TRIGGER group_limit_renamed
    AFTER UPDATE OF owner, "group" ON pgtaskpy.group_limit
    FOR EACH ROW WHEN ((OLD.owner, OLD."group") IS DISTINCT FROM (NEW.owner, NEW."group"))
    EXECUTE FUNCTION pgtaskpy.forget_limited_starts();

-- claim_next_task's claim of one task of a limited group: whether the window
-- has room for it.  The row lock makes two workers of the group look one
-- after the other (each sees the other's claim, TAKE or started); a row
-- another transaction holds (its role's, an open task_limit) is no room now,
-- and the worker leaves the task to a launcher rather than wait holding the
-- scheduling lock.
CREATE FUNCTION pgtaskpy.take_start_slot(task_owner name, task_group text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM FROM pgtaskpy.group_limit AS l
    WHERE l.owner = (task_owner COLLATE "C") AND l."group" = (task_group COLLATE "default")  -- (see group_paused)
    FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN  -- no limit, or a row held
        RETURN NOT EXISTS (SELECT FROM pgtaskpy.group_limit AS l
                           WHERE l.owner = (task_owner COLLATE "C") AND l."group" = (task_group COLLATE "default"));
    END IF;
    RETURN pgtaskpy.rate_has_room(task_owner, task_group, 1);  -- (a statement after the lock: the other's claim seen)
END
$$;

-- At most `starts` starts of the owner's group (default: the caller's) in any
-- `per`, across all launchers; tasks over it wait, in order.  starts NULL or
-- 0 removes the limit.
CREATE FUNCTION @extschema@.task_limit("group" text, starts integer, per interval DEFAULT interval '1 second',
                                       owner name DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    whose name := pgtaskpy.steered_owner(task_limit."group", task_limit.owner, 'task_limit',
                                         COALESCE(task_limit.starts, 0) = 0);  -- (0 lifts the limit)
BEGIN
    IF COALESCE(task_limit.starts, 0) = 0 THEN
        DELETE FROM pgtaskpy.group_limit AS l WHERE l.owner = whose AND l."group" = task_limit."group";
        PERFORM pgtaskpy.wake_launchers();
        RETURN;
    END IF;
    IF task_limit.starts NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'task_limit: starts must be from 1 to 100000 (0 or NULL removes the limit), not %', task_limit.starts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF task_limit.per IS NULL OR task_limit.per <= interval '0' OR NOT pgtaskpy.interval_is_sane(task_limit.per) THEN
        RAISE EXCEPTION 'task_limit: per must be an interval greater than zero, at most 1000 years and with no negative part, not %', COALESCE(task_limit.per::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example task_limit(''mail'', 5, ''1 second'').';
    END IF;
    INSERT INTO pgtaskpy.group_limit AS l (owner, "group", starts, per)
    VALUES (whose, task_limit."group", task_limit.starts, task_limit.per)
    ON CONFLICT ON CONSTRAINT group_limit_pkey DO UPDATE
    SET starts = excluded.starts, per = excluded.per;  -- (the window's starts count in the new limit)
    PERFORM pgtaskpy.wake_launchers();
END
$$;
COMMENT ON FUNCTION @extschema@.task_limit IS 'at most starts starts of the group in any per (0 or NULL: no limit)';

-- --- Bounded history --------------------------------------------------------

-- pg_task_py.keep_runs: each series keeps its newest N finished runs (a named
-- series by owner and key; a repeating task's runs by owner, group, remote,
-- cron and input: the index task_series_finished).  delete_old_tasks calls it
-- in housekeeping: it looks at up to 100 series a call, going on after the
-- last one it looked at (kept in this session), and deletes at most `batch`
-- rows, so that its share of the scheduling lock stays small however many
-- series there are.  Runs that other tables reference are kept, and tried
-- again each time their series comes (delete_finished).
CREATE FUNCTION pgtaskpy.delete_surplus_runs(batch integer) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := NULLIF(pgtaskpy.scheduler_setting('pg_task_py.keep_runs'), '');
    resume_after json := NULLIF(current_setting('pgtaskpy.keep_runs_after', true), '')::json;
    series record;
    last_series text := '';
    looked integer := 0;
    ids bigint[];
    deleted integer := 0;
BEGIN
    IF setting IS NULL OR batch <= 0 THEN
        RETURN 0;
    ELSIF setting !~ E'^\\s*[0-9]+\\s*$' THEN
        PERFORM pgtaskpy.warn_ignored_setting('pg_task_py.keep_runs', setting,
                                              'of ' || pgtaskpy.scheduler_setting_source('pg_task_py.keep_runs'),
                                              'not a whole number of runs');
        RETURN 0;
    END IF;
    FOR series IN
        WITH RECURSIVE s AS (  -- the next series after `resume_after`, one index probe each
            (SELECT f.owner, COALESCE('k' || f.key, 'r' || f.hash::text || md5(COALESCE(f.cron, '') || f.input)) AS id
             FROM @extschema@.task AS f
             WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
               AND (f.key IS NOT NULL OR f.repeat > interval '0' OR f.cron IS NOT NULL)
               AND (f.owner, COALESCE('k' || f.key, 'r' || f.hash::text || md5(COALESCE(f.cron, '') || f.input)))
                   > (COALESCE(resume_after ->> 0, '')::name, COALESCE(resume_after ->> 1, ''))
             ORDER BY 1, 2 LIMIT 1)
            UNION ALL
            SELECT n.owner, n.id FROM s CROSS JOIN LATERAL (
                SELECT f.owner, COALESCE('k' || f.key, 'r' || f.hash::text || md5(COALESCE(f.cron, '') || f.input)) AS id
                FROM @extschema@.task AS f
                WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
                  AND (f.key IS NOT NULL OR f.repeat > interval '0' OR f.cron IS NOT NULL)
                  AND (f.owner, COALESCE('k' || f.key, 'r' || f.hash::text || md5(COALESCE(f.cron, '') || f.input)))
                      > (s.owner, s.id)
                ORDER BY 1, 2 LIMIT 1) AS n
        )
        SELECT s.owner, s.id FROM s LIMIT 100
    LOOP
        looked := looked + 1;
        last_series := json_build_array(series.owner, series.id)::text;
        ids := ARRAY(SELECT f.id FROM @extschema@.task AS f
                     WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
                       AND (f.key IS NOT NULL OR f.repeat > interval '0' OR f.cron IS NOT NULL)
                       AND f.owner = series.owner
                       AND COALESCE('k' || f.key, 'r' || f.hash::text || md5(COALESCE(f.cron, '') || f.input)) = series.id
                       AND NOT (f.state = 'FAIL' AND f.attempt <= f.retry  -- (retry_pending, 40_scheduling.sql)
                                AND pgtaskpy.retry_pending(f.id, f.attempt, f.owner))
                     ORDER BY f.stop DESC OFFSET least(setting::numeric, 2147483647)::integer LIMIT batch - deleted
                     FOR UPDATE SKIP LOCKED);
        IF cardinality(ids) > 0 THEN  -- (runs that other tables reference are kept: delete_finished)
            deleted := deleted + (pgtaskpy.delete_finished(ids)).deleted;
        END IF;
        EXIT WHEN deleted >= batch;
    END LOOP;
    -- Next time: on after this one, or from the start when the last series was reached.
    PERFORM set_config('pgtaskpy.keep_runs_after',
                       CASE WHEN looked = 100 OR deleted >= batch THEN last_series ELSE '' END, false);
    RETURN deleted;
END
$$;

-- --- The launcher's metrics ------------------------------------------------

-- What the launcher's --metrics reads once a second besides dispatch()'s
-- events: waiting due tasks by owner and group with the lateness of the
-- oldest, the start lags of the tasks that ended after `since` and 2 s ago
-- or before, the database's worker backends, the paused groups, and the time
-- to pass as `since` next time.  (2 s: a worker stamps a task's stop before its
-- end commits, up to 50 ms before, longer on busy cores, and ends read up to
-- the snapshot's now() missed those that committed after it: 7-15 of 200.)
-- The due tasks are read in plan order, sorts off: from the plan index alone, up to now.  Planned
-- on a table whose indexes looked empty (before PostgreSQL 15.20, never analyzed since a load:
-- see claim_due_tasks), it read every waiting task, 100-160 ms a second with 100,000 planned
-- ahead.  jit off, as there.
--
-- Any task author may pause groups and give tasks groups by the thousand, and each is a
-- labelled series, read in the scheduler's turn: 50,000 pauses made a 9.6 MB scrape, 141 ms
-- of every turn a second, and every role's starts waited (a probe).  So `most` groups of each
-- kind are labelled, the latest due and the longest paused, a tenth of them at most of one
-- owner (a role's 100 groups a year late hid another's late group from its alert: a review),
-- and the groups of each kind are counted.  Each role's pauses are read from their (owner,
-- since) index, a role at a time.  The ends are read 10,000 at a time at
-- most, in stop order, and `at` stops at the last one read (with every end of that moment), so
-- that the next snapshot reads on where this one stopped: a cut at 10,000 dropped the rest.
CREATE FUNCTION pgtaskpy.metrics_snapshot(since timestamptz, most integer DEFAULT 100) RETURNS json
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off SET jit = off
AS $$
    WITH due AS (
        SELECT w.owner, w."group", count(*) AS due, extract(epoch FROM now() - min(w.plan))::float8 AS oldest
        FROM (SELECT t.owner, t."group", t.plan FROM @extschema@.task AS t
              WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.plan <= now()
                AND NOT (t.max < 0 AND EXISTS (SELECT FROM pgtaskpy.group_spacing AS s  -- (held: pause_group)
                                               WHERE s.owner = t.owner AND s.hash = t.hash AND s.until > now()))
              ORDER BY t.plan) AS w
        GROUP BY w.owner, w."group"
    ), ended_up_to AS (  -- (the 10,000th end's stop, when there are more; else 2 s ago)
        SELECT least(now() - interval '2 s',
                     (SELECT e.stop FROM @extschema@.task AS e
                      WHERE e.state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND e.stop > since
                        AND e.stop <= now() - interval '2 s'
                      ORDER BY e.stop OFFSET 9999 LIMIT 1)) AS bound
    )
    SELECT json_build_object(
        'groups', (SELECT COALESCE(json_agg(json_build_array(d.owner, d."group", d.due, d.oldest)), '[]')
                   FROM (SELECT r.owner, r."group", r.due, r.oldest
                         FROM (SELECT due.*,
                                      row_number() OVER (PARTITION BY due.owner ORDER BY due.oldest DESC) AS rank
                               FROM due) AS r
                         WHERE r.rank <= greatest(most / 10, 1)
                         ORDER BY r.oldest DESC, r.owner, r."group" LIMIT most) AS d),
        'due_groups', (SELECT count(*) FROM due),
        'lags', (SELECT COALESCE(json_agg(extract(epoch FROM f.start - f.plan)::float8), '[]')
                 FROM @extschema@.task AS f, ended_up_to AS u
                 WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND f.stop > since AND f.stop <= u.bound
                   AND f.start IS NOT NULL),
        'workers', (SELECT count(*) FROM pg_stat_activity AS a
                    WHERE a.datname = current_database() AND a.application_name = pgtaskpy.name_of('worker')),
        'paused', (SELECT COALESCE(json_agg(json_build_array(p.owner, p."group",
                                                             greatest(extract(epoch FROM now() - p.since)::float8, 0))),
                            '[]')  -- (a since in the future, written by hand: 0)
                   FROM (SELECT g.owner, g."group", g.since
                         FROM (WITH RECURSIVE owners AS (  -- (each owner of a pause once, read from the
                                   -- index: not pg_roles, which a renamed or dropped owner has left)
                                   (SELECT o.owner FROM pgtaskpy.group_pause AS o ORDER BY o.owner LIMIT 1)
                                   UNION ALL
                                   SELECT (SELECT o.owner FROM pgtaskpy.group_pause AS o
                                           WHERE o.owner > w.owner ORDER BY o.owner LIMIT 1)
                                   FROM owners AS w WHERE w.owner IS NOT NULL)
                               SELECT w.owner FROM owners AS w WHERE w.owner IS NOT NULL) AS a
                         CROSS JOIN LATERAL (SELECT o.owner, o."group", o.since FROM pgtaskpy.group_pause AS o
                                             WHERE o.owner = a.owner
                                             ORDER BY o.since LIMIT greatest(most / 10, 1)) AS g
                         ORDER BY g.since, g.owner, g."group" LIMIT most) AS p),
        'paused_groups', (SELECT count(*) FROM pgtaskpy.group_pause),
        'at', (SELECT u.bound FROM ended_up_to AS u))
$$;

-- --- The view ---------------------------------------------------------------

-- One row a (owner, group) the caller may see (SECURITY INVOKER: row-level
-- security applies to every table read).  Waiting and running tasks are read
-- from their small indexes, the last hour's ends from the stop index, totals
-- from group_counts and the changes not yet added to it: the cost does not
-- grow with the finished rows kept.  Groups are compared byte by byte
-- (COLLATE "C"): sorting and hashing a thousand group names by the
-- database's collation cost more than the rest.
--
-- A function behind the view, for its settings: under row-level security
-- the planner may not use the task table's statistics (enum_eq is not
-- leakproof), guesses a hundred thousand rows where there are a thousand,
-- and would compile the query (JIT: 70 ms) or start parallel workers, either
-- costing more than the whole answer.  PL/pgSQL keeps the plan for the
-- session.
CREATE FUNCTION pgtaskpy.group_stats()
RETURNS TABLE (
    owner name, "group" text, due bigint, later bigint, running bigint,
    done_1h bigint, fail_1h bigint, gone_1h bigint, stop_1h bigint,
    done_total bigint, fail_total bigint, gone_total bigint, stop_total bigint,
    oldest_due_lateness interval, run_time_p50 interval, run_time_p95 interval,
    start_lag_p50 interval, start_lag_p95 interval,
    last_success timestamptz, last_failure timestamptz, last_error text, consecutive_failures bigint,
    paused boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp SET jit = off SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH active AS (
    SELECT a.owner, a."group",
           count(*) FILTER (WHERE a.state = 'PLAN' AND a.runnable AND a.plan <= now()) AS due,
           count(*) FILTER (WHERE a.state = 'PLAN' AND NOT (a.runnable AND a.plan <= now())) AS later,
           count(*) FILTER (WHERE a.state <> 'PLAN') AS running,
           now() - min(a.plan) FILTER (WHERE a.state = 'PLAN' AND a.runnable AND a.plan <= now()) AS oldest_due_lateness
    -- (three parts, each read from its partial index; a task waiting for
    -- prerequisites is never due, whatever its plan: it counts as later, and so
    -- does one its group's pause after a run holds, max < 0: pause_group)
    FROM (SELECT w.owner, w."group" COLLATE "C" AS "group", w.state, w.plan,
                 NOT (w.max < 0 AND EXISTS (SELECT FROM pgtaskpy.group_spacing AS s
                                            WHERE s.owner = w.owner AND s.hash = w.hash AND s.until > now())) AS runnable
          FROM @extschema@.task AS w WHERE w.state = 'PLAN' AND w.waiting_for = 0
          UNION ALL
          SELECT b.owner, b."group" COLLATE "C", b.state, b.plan, false
          FROM @extschema@.task AS b WHERE b.state = 'PLAN' AND b.waiting_for > 0
          UNION ALL
          SELECT r.owner, r."group" COLLATE "C", r.state, r.plan, true
          FROM pgtaskpy.running_tasks() AS r) AS a
    GROUP BY a.owner, a."group"
), hour AS (
    -- Nearest-rank percentiles (percentile_disc: the value at rank ceil(p n)
    -- of the ones that ran; NULLs are left out).  A group's few rows sort
    -- quicker apart than in window sorts over the hour's rows (about 1 ms of
    -- 3.4 with 1,000 groups).
    SELECT e.owner, e."group",
           count(*) FILTER (WHERE e.state = 'DONE') AS done_1h, count(*) FILTER (WHERE e.state = 'FAIL') AS fail_1h,
           count(*) FILTER (WHERE e.state = 'GONE') AS gone_1h, count(*) FILTER (WHERE e.state = 'STOP') AS stop_1h,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY e.run_time) AS run_time_p50,
           percentile_disc(0.95) WITHIN GROUP (ORDER BY e.run_time) AS run_time_p95,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY e.start_lag) AS start_lag_p50,
           percentile_disc(0.95) WITHIN GROUP (ORDER BY e.start_lag) AS start_lag_p95
    FROM (SELECT f.owner, f."group" COLLATE "C" AS "group", f.state,
                 f.stop - f.start AS run_time, f.start - f.plan AS start_lag
          FROM @extschema@.task AS f
          WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND f.stop > now() - interval '1 hour') AS e
    GROUP BY e.owner, e."group"
), pending AS (  -- changes not yet added to group_counts (at most about a second's), as fold_group_counts adds them
    SELECT p.owner, p."group" COLLATE "C" AS "group",
           sum(p.n) FILTER (WHERE p.state = 'DONE') AS done, sum(p.n) FILTER (WHERE p.state = 'FAIL') AS fail,
           sum(p.n) FILTER (WHERE p.state = 'GONE') AS gone, sum(p.n) FILTER (WHERE p.state = 'STOP') AS stop,
           max(p.at) FILTER (WHERE p.state = 'DONE' AND p.n > 0) AS last_success,
           max(p.at) FILTER (WHERE p.state = 'FAIL' AND p.n > 0) AS last_failure,
           (array_agg(p.error ORDER BY p.at DESC) FILTER (WHERE p.state = 'FAIL' AND p.n > 0))[1] AS last_error,
           count(*) FILTER (WHERE p.state = 'FAIL' AND p.n > 0 AND p.at > COALESCE(p.success, '-infinity'))
               AS failures_after_success
    FROM (SELECT q.*, greatest(max(q.at) FILTER (WHERE q.state = 'DONE' AND q.n > 0) OVER (PARTITION BY q.owner, q."group"),
                               k.last_success) AS success
          FROM pgtaskpy.group_count_changes AS q
          LEFT JOIN pgtaskpy.group_counts AS k ON k.owner = q.owner AND k."group" = q."group") AS p
    GROUP BY p.owner, p."group" COLLATE "C"
), counts AS (
    SELECT c.owner, c."group" COLLATE "C" AS "group", c.done, c.fail, c.gone, c.stop,
           c.last_success, c.last_failure, c.last_error, c.consecutive_failures
    FROM pgtaskpy.group_counts AS c
), pauses AS (
    SELECT p.owner, p."group" COLLATE "C" AS "group", true AS paused FROM pgtaskpy.group_pause AS p
)
SELECT owner, "group" COLLATE "default" AS "group",
       COALESCE(a.due, 0) AS due, COALESCE(a.later, 0) AS later, COALESCE(a.running, 0) AS running,
       COALESCE(h.done_1h, 0) AS done_1h, COALESCE(h.fail_1h, 0) AS fail_1h,
       COALESCE(h.gone_1h, 0) AS gone_1h, COALESCE(h.stop_1h, 0) AS stop_1h,
       (COALESCE(c.done, 0) + COALESCE(d.done, 0))::bigint AS done_total,
       (COALESCE(c.fail, 0) + COALESCE(d.fail, 0))::bigint AS fail_total,
       (COALESCE(c.gone, 0) + COALESCE(d.gone, 0))::bigint AS gone_total,
       (COALESCE(c.stop, 0) + COALESCE(d.stop, 0))::bigint AS stop_total,
       a.oldest_due_lateness, h.run_time_p50, h.run_time_p95, h.start_lag_p50, h.start_lag_p95,
       greatest(c.last_success, d.last_success) AS last_success,
       greatest(c.last_failure, d.last_failure) AS last_failure,
       CASE WHEN d.last_failure >= c.last_failure OR c.last_failure IS NULL
            THEN COALESCE(d.last_error, c.last_error) ELSE c.last_error END AS last_error,
       -- (whatever retention or keep_runs leaves of the failed rows: at most those, with keep_runs 3
       -- a series failing for good showed 2, and an alert on more never fired.  0 while none is
       -- left and the group has no task to run, as fold_group_counts stores it: a removed series')
       CASE WHEN COALESCE(c.fail, 0) + COALESCE(d.fail, 0) <= 0
                 AND COALESCE(a.due, 0) + COALESCE(a.later, 0) + COALESCE(a.running, 0) = 0 THEN 0
            ELSE COALESCE(d.failures_after_success, 0)
                 + CASE WHEN pgtaskpy.newer_success(d.last_success, greatest(c.last_success, c.last_failure)) IS NOT NULL
                        THEN 0
                        ELSE COALESCE(c.consecutive_failures, 0) END
       END::bigint AS consecutive_failures,
       COALESCE(p.paused, false) AS paused
FROM counts AS c
FULL JOIN active AS a USING (owner, "group")
FULL JOIN hour AS h USING (owner, "group")
FULL JOIN pending AS d USING (owner, "group")
FULL JOIN pauses AS p USING (owner, "group");
END
$$;

CREATE OR REPLACE VIEW @extschema@.task_stats WITH (security_invoker = true) AS
SELECT * FROM pgtaskpy.group_stats();
COMMENT ON VIEW @extschema@.task_stats IS 'one row per (owner, group) of the caller''s tasks: waiting, running, ends, lateness, paused';

REVOKE ALL ON FUNCTION pgtaskpy.count_end(name, text, @extschema@.state, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.task_ended(@extschema@.task) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.notify_done(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.fold_group_counts(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.fold_changes(tid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.group_has_tasks_to_run(name, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.count_finished_task() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.recount_changed_task() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.uncount_deleted_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.uncount_truncated_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.note_start(@extschema@.task) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.rate_room_returns(name, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.note_rate_room_returns(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.forget_limited_starts() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.check_group_row() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.take_start_slot(name, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.delete_surplus_runs(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.metrics_snapshot(timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.task_pause(text, name), @extschema@.task_resume(text, name),
    @extschema@.task_limit(text, integer, interval, name) TO pgtaskpy_user;
REVOKE ALL ON FUNCTION pgtaskpy.group_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtaskpy.group_stats() TO pgtaskpy_user;
GRANT SELECT ON @extschema@.task_stats TO pgtaskpy_user;
