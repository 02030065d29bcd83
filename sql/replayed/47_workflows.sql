-- Workflows: dependencies between tasks (after, after_any) and exclusive
-- tasks.  The claims and finish_task call in here with a line each.
--
-- A task inserted with `after` waits in PLAN while waiting_for, the number of
-- its prerequisites that have not ended, is above zero: the claim's indexes
-- leave such rows out (sql/created_once/20_table.sql), so however many wait,
-- a claim never reads them.  The edges still waited on are rows of
-- pgtaskpy.pending_prerequisite; the end of a prerequisite takes its edges
-- and counts its dependents down, or stops them, in the transaction that ends
-- it (resolve_dependents).
--
-- The race between an INSERT naming a prerequisite and that prerequisite's
-- end, in READ COMMITTED: the INSERT reads the prerequisite's state, and an end
-- looks for edges, which it cannot see until the INSERT commits.  So the INSERT
-- reads the states again as it commits (settle_prerequisites, a deferred
-- constraint trigger) with each prerequisite's row locked FOR SHARE, which an
-- end's change of that row (its UPDATE, or a DELETE) waits for, and which waits
-- for such a change: either the end waits for that commit and finds the
-- edges, or the commit waits for the end and reads the prerequisite ended.
-- Held from the commit's check to the commit, unless the author fires the
-- trigger earlier (SET CONSTRAINTS ... IMMEDIATE): then only its own
-- prerequisites' ends wait, rows it may lock FOR SHARE itself.  (Keys of
-- task ids shared by every role, advisory locks and then rows of a table of
-- 1,024 keys, let such an open transaction hold up the ends of every role's
-- tasks.)  Until its commit, the INSERT locks each prerequisite still running
-- or waiting FOR KEY SHARE, as a foreign key does: no claim, start or end
-- waits for that, and the row is not deleted meanwhile (the end's DELETE of a
-- row that produced nothing skips it, and retention takes it later).  A
-- REPEATABLE READ transaction reads states as of its snapshot, so it locks the
-- rows FOR SHARE instead: that fails with a serialization error when the
-- prerequisite ended after the snapshot was taken, and holds back the
-- prerequisite's end until the commit.

-- enable_seqscan off: these functions look rows up by id, and keep their plans
-- for the backend's life; a plan made while the table was small (a bulk
-- INSERT into an empty table, a new worker) would scan the whole table on
-- every later call.  plan_cache_mode force_generic_plan: the generic plan of
-- a lookup by an array of ids looks dearer than a custom one (ten ids
-- guessed, not one), so without it PostgreSQL plans each statement again on
-- every call, which cost a link of a chain 0.7 ms (bench/RESULTS.md).

-- BEFORE INSERT of a task with `after`: every listed task must exist and be
-- visible to the inserting role (row-level security; so a task can only wait
-- for tasks inserted before it, and no cycle can be built), else the INSERT
-- fails naming the id.  waiting_for := the prerequisites not ended yet.  A
-- prerequisite that already ended FAIL, GONE or STOP makes the task STOP at
-- once (unless after_any), as its end would have.  Runs as the inserting role.
CREATE FUNCTION pgtaskpy.check_prerequisites() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    missing bigint;
    ended record;
    handed record;
BEGIN
    NEW.waiting_for := 0;
    IF NEW.after IS NULL THEN
        RETURN NEW;
    ELSIF array_ndims(NEW.after) > 1 THEN
        RAISE EXCEPTION 'task.after must be a one-dimensional array of task ids' USING ERRCODE = 'invalid_parameter_value';
    ELSIF array_position(NEW.after, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'task.after must not contain NULL' USING ERRCODE = 'not_null_violation';
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- (not deleted until this commits; its end, if it comes first, is settle_prerequisites')
        PERFORM FROM @extschema@.task AS t
        WHERE t.id = ANY (NEW.after) AND t.state IN ('PLAN', 'TAKE', 'WORK') ORDER BY t.id FOR KEY SHARE;
    ELSE
        PERFORM FROM @extschema@.task AS t WHERE t.id = ANY (NEW.after) ORDER BY t.id FOR SHARE;
    END IF;
    SELECT a.id INTO missing FROM unnest(NEW.after) AS a(id)
    WHERE NOT EXISTS (SELECT FROM @extschema@.task AS t WHERE t.id = a.id)
    ORDER BY a.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'prerequisite task % not found', missing
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = 'task.after lists tasks that exist and that the inserting role can see.',
                  HINT = CASE WHEN current_setting('row_security') = 'off'  -- (as pg_dump's scripts set it)
                              THEN 'Restoring a dump? Restore it with PGOPTIONS=''-c session_replication_role=replica'''
                                   ' (README: Backup and restore).'
                              ELSE 'Insert the prerequisites first (task_chain, or one transaction), under the same role.'
                         END;
    END IF;
    -- A prerequisite that failed and is tried again is waited for in its retry (attempt + 1, its
    -- owner's, naming it as parent), and so on, as the dependents inserted before the failure
    -- are (pass_dependents_on): one inserted a moment after it was stopped, though the retry
    -- ended DONE and the dependents inserted before it ran (a probe).
    LOOP
        SELECT p.id AS failed, r.id AS retry INTO handed
        FROM @extschema@.task AS p
        JOIN @extschema@.task AS r ON r.parent = p.id AND r.attempt = p.attempt + 1 AND r.owner = p.owner
        WHERE p.id = ANY (NEW.after) AND p.state = 'FAIL'
        ORDER BY p.id LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF current_setting('transaction_isolation') = 'read committed' THEN
            PERFORM FROM @extschema@.task AS r WHERE r.id = handed.retry FOR KEY SHARE;
        ELSE
            PERFORM FROM @extschema@.task AS r WHERE r.id = handed.retry FOR SHARE;
        END IF;
        NEW.after := array_replace(NEW.after, handed.failed, handed.retry);
    END LOOP;
    -- The first prerequisite that ended otherwise than DONE, and those still to end, in one
    -- statement: one snapshot.  The locks above do not hold a state (FOR KEY SHARE lets a
    -- task_cancel's STOP through), and a STOP committed between two statements was neither
    -- ended for the first nor waited for by the second: the task waited for nothing, and ran.
    SELECT (array_agg(t.id ORDER BY t.id) FILTER (WHERE t.state IN ('FAIL', 'GONE', 'STOP')))[1] AS id,
           (array_agg(t.state ORDER BY t.id) FILTER (WHERE t.state IN ('FAIL', 'GONE', 'STOP')))[1] AS state,
           count(*) FILTER (WHERE t.state IN ('PLAN', 'TAKE', 'WORK')) AS waiting
    INTO ended FROM @extschema@.task AS t WHERE t.id = ANY (NEW.after);
    IF NOT NEW.after_any AND ended.id IS NOT NULL AND NEW.state = 'PLAN' THEN
        -- A waiting task of the row's key: the row is left waiting, to meet it in the key's unique
        -- index as any other would, where ON CONFLICT (task_enqueue's on_conflict) decides.  Made
        -- STOP, it met none, and a STOP row was inserted beside the waiting task whatever
        -- on_conflict said.  That task is held FOR SHARE (no claim takes it) to the commit, so
        -- that it still waits when the row meets it: a row left waiting beside none would run.
        IF NEW.key IS NOT NULL THEN
            PERFORM FROM @extschema@.task AS w
            WHERE w.owner = NEW.owner AND w.key = NEW.key AND w.state = 'PLAN' FOR SHARE;
            IF FOUND THEN
                RETURN NEW;
            END IF;
        END IF;
        NEW.state := 'STOP';
        NEW.error := format('ERROR:  prerequisite task %s ended %s', ended.id, ended.state);
        NEW.stop := clock_timestamp();
        RETURN NEW;
    END IF;
    NEW.waiting_for := ended.waiting;
    RETURN NEW;
END
$$;

-- AFTER INSERT of a task that waits: its edges.  SECURITY DEFINER, as task
-- authors cannot write the edges table (check_prerequisites has checked, as
-- the inserting role, that it may name these tasks; the locks it took keep
-- their states as it counted them).
CREATE FUNCTION pgtaskpy.record_prerequisites() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    INSERT INTO pgtaskpy.pending_prerequisite (prerequisite, dependent)
    SELECT DISTINCT t.id, NEW.id FROM @extschema@.task AS t
    WHERE t.id = ANY (NEW.after) AND t.state IN ('PLAN', 'TAKE', 'WORK');
    RETURN NULL;
END
$$;

-- At the commit of a READ COMMITTED transaction that inserted a task waiting
-- for prerequisites (a deferred constraint trigger, after every statement of
-- the transaction): the prerequisites that ended since the INSERT read them,
-- whose ends could not see its edges, count as their ends would have counted
-- them: one that ended FAIL, GONE or STOP stops the task (unless after_any),
-- and the others no longer count in waiting_for, which releases the task
-- when none is left.  A prerequisite that failed and handed its dependents
-- on to its retry (pass_dependents_on, which could not see this task's
-- edges) is followed to the retry first, as the dependent would have been
-- had it been committed first.  The prerequisites' rows are locked FOR SHARE
-- from here to the commit: an end under way finishes first, and a later one
-- sees the edges (see the top of this file).  SECURITY DEFINER, as
-- record_prerequisites; it changes only the task just inserted (and, if it
-- stops it, what waits for it in this transaction).
CREATE FUNCTION pgtaskpy.settle_prerequisites() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ended record;
    handed record;
    prerequisites bigint[] := NEW.after;
    waiting integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN NULL;  -- (its prerequisites' rows are locked FOR SHARE: none has ended since)
    END IF;
    PERFORM FROM @extschema@.task AS p WHERE p.id = ANY (NEW.after) ORDER BY p.id FOR SHARE;
    IF NOT EXISTS (SELECT FROM @extschema@.task AS d WHERE d.id = NEW.id AND d.state = 'PLAN' AND d.waiting_for > 0) THEN
        RETURN NULL;  -- deleted, stopped or released since, in this transaction
    END IF;
    LOOP  -- (a retry that failed and was retried in turn: followed again)
        SELECT p.id AS failed, r.id AS retry INTO handed
        FROM @extschema@.task AS p
        -- (its owner's: an author set the parent of a retry of hers to another role's task, and
        -- that role's dependents waited for her task; README, pg_task.id)
        JOIN @extschema@.task AS r ON r.parent = p.id AND r.attempt = p.attempt + 1 AND r.owner = p.owner
        WHERE p.id = ANY (prerequisites) AND p.state = 'FAIL'
        ORDER BY p.id LIMIT 1;
        EXIT WHEN NOT FOUND;
        PERFORM FROM @extschema@.task AS r WHERE r.id = handed.retry FOR SHARE;
        prerequisites := array_replace(prerequisites, handed.failed, handed.retry);
        -- (keep_prerequisites warned its author that the change had not changed what it waits for)
        PERFORM set_config('pgtaskpy.passing_dependents', 'on', true);
        UPDATE @extschema@.task AS d SET after = prerequisites WHERE d.id = NEW.id;
        PERFORM set_config('pgtaskpy.passing_dependents', '', true);
        UPDATE pgtaskpy.pending_prerequisite AS e SET prerequisite = handed.retry
        WHERE e.dependent = NEW.id AND e.prerequisite = handed.failed AND NOT EXISTS (
            SELECT FROM pgtaskpy.pending_prerequisite AS k WHERE k.prerequisite = handed.retry AND k.dependent = NEW.id);
        DELETE FROM pgtaskpy.pending_prerequisite AS e  -- (it listed the retry itself already)
        WHERE e.dependent = NEW.id AND e.prerequisite = handed.failed;
    END LOOP;
    IF NOT NEW.after_any THEN
        SELECT s.id, s.ended_as INTO ended
        FROM (SELECT p.id, 'ended ' || p.state AS ended_as FROM @extschema@.task AS p
              WHERE p.id = ANY (prerequisites) AND p.state IN ('FAIL', 'GONE', 'STOP')
              UNION ALL
              -- Deleted by this transaction after the INSERT (no other may: the INSERT locked it).
              -- Its DELETE's trigger (prerequisite_deleted) fires after this one: it would find
              -- no edge left, and the task ran without its prerequisite.
              SELECT e.prerequisite, 'was deleted' FROM pgtaskpy.pending_prerequisite AS e
              WHERE e.dependent = NEW.id AND NOT EXISTS (SELECT FROM @extschema@.task AS p WHERE p.id = e.prerequisite)
             ) AS s
        ORDER BY s.id LIMIT 1;
        IF FOUND THEN
            DELETE FROM pgtaskpy.pending_prerequisite AS e WHERE e.dependent = NEW.id;
            PERFORM set_config('pgtaskpy.resolving', 'on', true);
            UPDATE @extschema@.task AS d
            SET state = 'STOP', stop = clock_timestamp(),
                error = format('ERROR:  prerequisite task %s %s', ended.id, ended.ended_as)
            WHERE d.id = NEW.id;
            PERFORM set_config('pgtaskpy.resolving', '', true);
            PERFORM pgtaskpy.resolve_dependents(NEW.id, 'STOP');
            RETURN NULL;
        END IF;
    END IF;
    -- (the edges are of the prerequisites not ended when the INSERT recorded them)
    DELETE FROM pgtaskpy.pending_prerequisite AS e
    WHERE e.dependent = NEW.id AND NOT EXISTS (
        SELECT FROM @extschema@.task AS p WHERE p.id = e.prerequisite AND p.state IN ('PLAN', 'TAKE', 'WORK'));
    waiting := (SELECT count(*) FROM pgtaskpy.pending_prerequisite AS e WHERE e.dependent = NEW.id);
    IF waiting < NEW.waiting_for THEN
        PERFORM set_config('pgtaskpy.next_run', 'on', true);  -- (the scheduler's own plan, as resolve_dependents')
        UPDATE @extschema@.task AS d
        SET waiting_for = waiting, plan = CASE WHEN waiting = 0 THEN greatest(d.plan, clock_timestamp()) ELSE d.plan END
        WHERE d.id = NEW.id;
        PERFORM set_config('pgtaskpy.next_run', 'off', true);
        IF waiting = 0 THEN
            PERFORM pgtaskpy.wake_launchers();
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- BEFORE UPDATE OF after, after_any: the count and the edges were made from the
-- list given at INSERT, and each prerequisite's end was counted down, or
-- stopped the task, by the after_any of that moment (turned off later, a task
-- that had counted a failure down ran once the others ended DONE: a probe).
-- Members of pgtaskpy_admin may repair rows by hand, and are told when the row
-- waits: its new list or rule was taken, and changed nothing of what it waits
-- for.  (Not when a failed run's retry takes its place in its dependents'
-- lists: pass_dependents_on.)
CREATE FUNCTION pgtaskpy.keep_prerequisites() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    changed text := CASE WHEN NEW.after IS DISTINCT FROM OLD.after THEN 'after' ELSE 'after_any' END;
BEGIN
    IF NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'task.% cannot change once the task is inserted', changed
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Stop the task (state = ''STOP'') and insert a new one.';
    ELSIF NEW.state = 'PLAN' AND OLD.state = 'PLAN'
          AND current_setting('pgtaskpy.passing_dependents', true) IS DISTINCT FROM 'on' THEN
        RAISE WARNING 'task %: its % changed, but not what it waits for: % of the prerequisites its INSERT named',
            NEW.id, changed, NEW.waiting_for
            USING HINT = CASE changed WHEN 'after' THEN 'To wait for other tasks, stop it (state = ''STOP'') and insert a new one.'
                              ELSE 'The prerequisites that have ended were counted by the old after_any; those to come count by the new one.' END;
    END IF;
    RETURN NEW;
END
$$;

-- The end of task `task_id` as its dependents see it (end_state NULL: the row
-- was deleted before it ended): each dependent waiting in PLAN counts it down
-- when it ended DONE or the dependent has after_any, and the last one makes it
-- due (plan moves up to now, so that `active` counts from here: the clock's
-- now, not the transaction's start, which a DBA's long transaction that
-- cancelled the prerequisite put seconds back, and the dependent went GONE
-- before it was ever due); otherwise the
-- dependent ends STOP with the error naming the prerequisite, and its own
-- dependents follow, down the graph, in a loop (a chain of 1,000 is no
-- recursion 1,000 deep).  Dependents are locked in order of ids.  Each ended
-- task's row is locked by its end already (the caller's UPDATE or DELETE of
-- it in this transaction): the commit of an INSERT of a task `after` it, which
-- locks the row FOR SHARE, has been waited for, or waits for this one.
CREATE FUNCTION pgtaskpy.resolve_dependents(
    task_id bigint, end_state @extschema@.state, going_on integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ended bigint[] := ARRAY[task_id];
    ended_as text[] := ARRAY[COALESCE('ended ' || end_state::text, 'was deleted')];
    i integer := 1;
    dependents bigint[];
    released integer := 0;
    stopped bigint[];
BEGIN
    WHILE i <= cardinality(ended) LOOP
        WITH taken AS (
            DELETE FROM pgtaskpy.pending_prerequisite AS e WHERE e.prerequisite = ended[i] RETURNING e.dependent)
        SELECT array_agg(taken.dependent ORDER BY taken.dependent) INTO dependents FROM taken;
        IF dependents IS NOT NULL THEN
            IF cardinality(dependents) > 1 THEN
                -- Locked in the order of their ids first: two ends counting down
                -- dependents they share would otherwise deadlock.  (A chain's one
                -- dependent needs no order, nor the lock's cost: about 30 us an end.)
                PERFORM FROM @extschema@.task AS w
                WHERE w.id = ANY (dependents) AND w.state = 'PLAN' AND w.waiting_for > 0
                  AND (ended_as[i] = 'ended DONE' OR w.after_any)
                ORDER BY w.id FOR NO KEY UPDATE;
            END IF;
            -- (the scheduler's own plan: the row checks are skipped, as for a next run)
            PERFORM set_config('pgtaskpy.next_run', 'on', true);
            WITH counted AS (
                UPDATE @extschema@.task AS d
                SET waiting_for = d.waiting_for - 1,
                    plan = CASE WHEN d.waiting_for = 1 THEN greatest(d.plan, clock_timestamp()) ELSE d.plan END
                WHERE d.id = ANY (dependents) AND d.state = 'PLAN' AND d.waiting_for > 0
                  AND (ended_as[i] = 'ended DONE' OR d.after_any)
                RETURNING d.waiting_for, d.hash, d.max)
            SELECT released + count(*) FILTER (WHERE counted.waiting_for = 0
                                                 AND (i > 1 OR counted.hash IS DISTINCT FROM going_on OR counted.max > 0))
            INTO released FROM counted;
            PERFORM set_config('pgtaskpy.next_run', 'off', true);
            IF ended_as[i] <> 'ended DONE' THEN  -- (else nothing to stop)
                -- (the stop of a dependent is not a user's STOP: task_prerequisite_stopped
                -- leaves it to this loop)
                PERFORM set_config('pgtaskpy.resolving', 'on', true);
                WITH ended_now AS (
                    UPDATE @extschema@.task AS d
                    SET state = 'STOP', stop = clock_timestamp(),
                        error = format('ERROR:  prerequisite task %s %s', ended[i], ended_as[i])
                    WHERE d.id IN (SELECT w.id FROM @extschema@.task AS w
                                   WHERE w.id = ANY (dependents) AND w.state = 'PLAN' AND NOT w.after_any
                                   ORDER BY w.id FOR NO KEY UPDATE)
                    RETURNING d.id)
                SELECT array_agg(ended_now.id ORDER BY ended_now.id) INTO stopped FROM ended_now;
                PERFORM set_config('pgtaskpy.resolving', '', true);
                IF stopped IS NOT NULL THEN
                    PERFORM pgtaskpy.forget_waits_of(stopped);  -- (on their other prerequisites)
                    ended := ended || stopped;
                    ended_as := ended_as || array_fill('ended STOP'::text, ARRAY[cardinality(stopped)]);
                END IF;
            END IF;
        END IF;
        i := i + 1;
    END LOOP;
    -- Launchers claim what was released, except a dependent in the group
    -- `going_on` (the hash of the ended task's group, when its worker goes on
    -- with it: finish_task's wake false) that runs one at a time: that worker
    -- claims it, or wakes the launchers when it does not (a chain costs no
    -- launcher turn a task).
    IF released > 0 THEN
        PERFORM pgtaskpy.wake_launchers();
    END IF;
END
$$;

-- A failed run whose retry row is inserted hands its dependents on to the
-- retry, which they wait for instead, rather than being stopped.  finish_task
-- calls this in place of resolve_dependents for such a run.  `after` of each
-- dependent names the retry from then on.
CREATE FUNCTION pgtaskpy.pass_dependents_on(from_task bigint, to_task bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM set_config('pgtaskpy.passing_dependents', 'on', true);  -- (keep_prerequisites)
    UPDATE @extschema@.task AS d SET after = array_replace(d.after, from_task, to_task)
    WHERE d.id IN (SELECT e.dependent FROM pgtaskpy.pending_prerequisite AS e WHERE e.prerequisite = from_task);
    PERFORM set_config('pgtaskpy.passing_dependents', '', true);
    UPDATE pgtaskpy.pending_prerequisite AS e SET prerequisite = to_task WHERE e.prerequisite = from_task;
END
$$;

-- A user's STOP of a waiting or claimed task (UPDATE, task_cancel,
-- task_unschedule) is an end its dependents follow, and so is an admin's
-- hand repair of a task that waits, is claimed or runs to any end (its
-- dependents waited for ever); the scheduler's own sessions
-- (pgtaskpy.scheduler, dispatch.py's SCHEDULER_SETTINGS) resolve the
-- dependents of the ends they write themselves (finish_task, whose end of a
-- waiting task as FAIL this follows again, finding its edges taken).  As the
-- transaction commits (a deferred constraint trigger): its lock on the task's
-- id is then held until the commit only.  SECURITY DEFINER: the dependents'
-- edges are the scheduler's.
CREATE FUNCTION pgtaskpy.prerequisite_stopped() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgtaskpy.forget_waits_of(ARRAY[NEW.id]);
    PERFORM pgtaskpy.resolve_dependents(NEW.id, NEW.state);
    RETURN NULL;
END
$$;

-- A task deleted before it ended: its dependents stop (or, with after_any,
-- count it as ended), as the transaction commits.  A finished task's dependents were resolved when it
-- ended, before finish_task deletes a row that produced nothing.
CREATE FUNCTION pgtaskpy.prerequisite_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgtaskpy.forget_waits_of(ARRAY[OLD.id]);
    PERFORM pgtaskpy.resolve_dependents(OLD.id, NULL);
    RETURN NULL;
END
$$;

-- The edges on which tasks that will never run (ended, or deleted, while
-- they waited for prerequisites) wait.  Left behind, an edge of a deleted
-- waiting task counted down, or stopped, the next task inserted with its id
-- (ids the sequence has given may be inserted again), another role's too, with
-- an error naming a task it never listed; and inserting that id after the same
-- prerequisite failed on the edges' primary key.
CREATE FUNCTION pgtaskpy.forget_waits_of(ids bigint[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ DELETE FROM pgtaskpy.pending_prerequisite AS e WHERE e.dependent = ANY (ids) $$;
REVOKE ALL ON FUNCTION pgtaskpy.forget_waits_of(bigint[]) FROM PUBLIC;

-- TRUNCATE task (its owner's, a superuser's) takes every task, and so every
-- edge: kept, they released a later task with a reused id (RESTART IDENTITY)
-- when another ended, before its own prerequisite had run.
CREATE FUNCTION pgtaskpy.forget_truncated_prerequisites() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgtaskpy.pending_prerequisite;
    RETURN NULL;
END
$$;

-- An ended task with prerequisites that an admin sets back to PLAN (the repair
-- of a workflow: a failed step and the dependents it stopped, re-armed
-- together) waits again for those of its prerequisites that have not ended,
-- and runs at once when none is left: a stopped dependent kept the count it
-- was stopped with, and no edge would ever count it down.  As the transaction
-- commits (a deferred constraint trigger), so that the rows re-armed with it,
-- in any order, count as waiting; the prerequisites are locked FOR SHARE from
-- there to the commit, as settle_prerequisites locks them, so that an end
-- either waits for the commit and finds the edge, or was committed first and
-- is read ended.  Only admins may set an ended task waiting (task_guard);
-- SECURITY DEFINER, as the edges are the scheduler's.
CREATE FUNCTION pgtaskpy.rearm_prerequisites() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    pending bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM @extschema@.task AS d
                   WHERE d.id = NEW.id AND d.state = 'PLAN' AND d.waiting_for = NEW.waiting_for) THEN
        RETURN NULL;  -- ended, stopped or deleted again in this transaction, or its count set by hand
    END IF;
    SELECT array_agg(p.id ORDER BY p.id) INTO pending
    FROM (SELECT t.id FROM @extschema@.task AS t
          WHERE t.id = ANY (NEW.after) AND t.state IN ('PLAN', 'TAKE', 'WORK') ORDER BY t.id FOR SHARE) AS p;
    -- A cycle (the task among its own prerequisites, or one of them waiting for it, through
    -- the edges of those re-armed before it in this transaction too) waited for ever.
    IF NEW.id = ANY (pending) OR EXISTS (
        WITH RECURSIVE waiting_for_it(id) AS (
            SELECT e.dependent FROM pgtaskpy.pending_prerequisite AS e WHERE e.prerequisite = NEW.id
            UNION
            SELECT e.dependent FROM waiting_for_it AS w
            JOIN pgtaskpy.pending_prerequisite AS e ON e.prerequisite = w.id)
        SELECT FROM waiting_for_it AS w WHERE w.id = ANY (pending)) THEN
        RAISE EXCEPTION 'task % cannot wait for its prerequisites: one of them waits for it', NEW.id
            USING ERRCODE = 'invalid_parameter_value', DETAIL = format('Its after: %s.', NEW.after),
                  HINT = 'Set it waiting with prerequisites that do not wait for it, or leave it ended.';
    END IF;
    DELETE FROM pgtaskpy.pending_prerequisite AS e WHERE e.dependent = NEW.id;
    INSERT INTO pgtaskpy.pending_prerequisite (prerequisite, dependent) SELECT p, NEW.id FROM unnest(pending) AS p;
    PERFORM set_config('pgtaskpy.next_run', 'on', true);  -- (the scheduler's own count, as resolve_dependents')
    UPDATE @extschema@.task AS d
    SET waiting_for = coalesce(cardinality(pending), 0),
        plan = CASE WHEN pending IS NULL THEN greatest(d.plan, clock_timestamp()) ELSE d.plan END
    WHERE d.id = NEW.id;
    PERFORM set_config('pgtaskpy.next_run', 'off', true);
    IF pending IS NULL THEN
        PERFORM pgtaskpy.wake_launchers();
    END IF;
    RETURN NULL;
END
$$;

-- Triggers named after task_guard_insert, so that they fire after it (BEFORE
-- triggers fire in order of names) and may set state, stop and error.
CREATE TRIGGER task_prerequisites_insert
    BEFORE INSERT ON @extschema@.task
    FOR EACH ROW WHEN (NEW.after IS NOT NULL OR NEW.waiting_for <> 0)
    EXECUTE FUNCTION pgtaskpy.check_prerequisites();

CREATE TRIGGER task_prerequisites_recorded
    AFTER INSERT ON @extschema@.task
    FOR EACH ROW WHEN (NEW.waiting_for > 0)
    EXECUTE FUNCTION pgtaskpy.record_prerequisites();

CREATE TRIGGER task_prerequisites_truncated
    AFTER TRUNCATE ON @extschema@.task
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskpy.forget_truncated_prerequisites();

CREATE TRIGGER task_prerequisites_update
    BEFORE UPDATE OF after, after_any ON @extschema@.task
    FOR EACH ROW WHEN (NEW.after IS DISTINCT FROM OLD.after
                       OR NEW.after_any IS DISTINCT FROM OLD.after_any AND cardinality(OLD.after) > 0)
    EXECUTE FUNCTION pgtaskpy.keep_prerequisites();

-- Whether this end of a task is resolve_dependents' own (pgtaskpy.resolving, which it sets
-- around its stops of dependents), which task_prerequisite_stopped leaves to it.  Any session
-- may set that setting: a task author who did stopped its own task with its dependents,
-- another role's too, left waiting for good (a probe).  It counts for a superuser's statement
-- only: resolve_dependents runs as one (a scheduler session, or a SECURITY DEFINER trigger's).
CREATE FUNCTION pgtaskpy.resolving_dependents() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT current_setting('pgtaskpy.resolving', true) IS NOT DISTINCT FROM 'on'
           AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user AND r.rolsuper)
$$;

-- Deferred constraint triggers: CREATE OR REPLACE, which every upgrade script
-- replays (sql/build.py), cannot make them, so each is made once, here.
DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                   WHERE tgrelid = '@extschema@.task'::pg_catalog.regclass AND tgname = 'task_prerequisites_settled') THEN
        CREATE CONSTRAINT TRIGGER task_prerequisites_settled
            AFTER INSERT ON @extschema@.task DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (NEW.waiting_for > 0)
            EXECUTE FUNCTION pgtaskpy.settle_prerequisites();
    END IF;
    -- (1.3 made it fire for hand ends of claimed and running tasks, and for GONE, and left it
    -- to the scheduler's own resolving alone: made again where an earlier version's is)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                   WHERE tgrelid = '@extschema@.task'::pg_catalog.regclass AND tgname = 'task_prerequisite_stopped'
                     AND pg_catalog.pg_get_triggerdef(oid) LIKE '%pgtaskpy.resolving_dependents()%') THEN
        DROP TRIGGER IF EXISTS task_prerequisite_stopped ON @extschema@.task;
        CREATE CONSTRAINT TRIGGER task_prerequisite_stopped
            AFTER UPDATE OF state ON @extschema@.task DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN ((OLD.state IN ('PLAN', 'TAKE') AND NEW.state = 'STOP'
                                OR OLD.state = 'PLAN' AND NEW.state IN ('DONE', 'FAIL')
                                OR OLD.state IN ('PLAN', 'TAKE', 'WORK') AND NEW.state IN ('DONE', 'FAIL', 'STOP', 'GONE')
                                   AND pg_catalog.current_setting('pgtaskpy.scheduler', true) IS DISTINCT FROM 'on')
                               AND NOT pgtaskpy.resolving_dependents())
            EXECUTE FUNCTION pgtaskpy.prerequisite_stopped();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                   WHERE tgrelid = '@extschema@.task'::pg_catalog.regclass AND tgname = 'task_prerequisites_rearmed') THEN
        CREATE CONSTRAINT TRIGGER task_prerequisites_rearmed
            AFTER UPDATE OF state ON @extschema@.task DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (OLD.state IN ('DONE', 'FAIL', 'STOP', 'GONE') AND NEW.state = 'PLAN'
                               AND (NEW.after IS NOT NULL OR NEW.waiting_for > 0)
                               AND NEW.waiting_for = OLD.waiting_for)
            EXECUTE FUNCTION pgtaskpy.rearm_prerequisites();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                   WHERE tgrelid = '@extschema@.task'::pg_catalog.regclass AND tgname = 'task_prerequisite_deleted') THEN
        CREATE CONSTRAINT TRIGGER task_prerequisite_deleted
            AFTER DELETE ON @extschema@.task DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (OLD.state IN ('PLAN', 'TAKE', 'WORK'))
            EXECUTE FUNCTION pgtaskpy.prerequisite_deleted();
    END IF;
END
$do$;

-- Exclusive tasks, as the claims see them: 'running' while one is claimed or
-- runs, 'due' while one may start (then nothing else is claimed, so that the
-- running tasks drain), NULL otherwise.  Two probes of an index that holds only
-- exclusive tasks that wait or run, by state then plan: those planned ahead are
-- not read (1,000 of them cost each claim, the launcher's and every worker's,
-- 0.45 ms when they were).  Due by the clock, not by now(): a claim whose
-- transaction began before the task came due, and waited for the scheduling
-- lock meanwhile, claimed other tasks after it was due (25 of them 66-356 ms
-- after, three launchers and a busy table); it claims nothing now, and the next
-- turn claims the exclusive task.
CREATE FUNCTION pgtaskpy.exclusive_gate() RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off
AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- (a value: the index's plan bound, as now() was)
BEGIN
    -- (One that claim_exclusive_task would not claim, of a paused or rate-limited group or of a
    -- role whose running limit is 0, is not due: it would hold every other task back.  One
    -- statement: each costs a claim 10-20 us.)
    RETURN CASE WHEN EXISTS (SELECT FROM @extschema@.task AS t WHERE t.exclusive AND t.state IN ('TAKE', 'WORK'))
                    THEN 'running'
                WHEN EXISTS (SELECT FROM @extschema@.task AS t
                             WHERE t.exclusive AND t.state = 'PLAN' AND t.waiting_for = 0 AND t.plan <= at
                               AND (t.plan <= at AND t.plan + t.active > at) IS TRUE
                               AND NOT pgtaskpy.group_paused(t.owner, t."group")
                               AND NOT (t.max < 0 AND pgtaskpy.group_spaced(t.owner, t.hash, at))
                               AND pgtaskpy.rate_has_room(t.owner, t."group", 1)
                               AND pgtaskpy.owner_has_room(pgtaskpy.role_running_limit(t.owner), 0, 1))
                    THEN 'due' END;
END
$$;

-- The first due exclusive task (higher max, then lower id) that claim_exclusive_task claims,
-- locked for this transaction; NULL when there is none, as when a client holds every due one
-- (SELECT ... FOR UPDATE or FOR SHARE, an owner's task_schedule of its series): such a one is
-- not due for claim_due_tasks, which goes on as if it were not there.  exclusive_gate, which
-- cannot lock, counted it due, and no task of the database started for as long (a probe).
-- Due by the clock (`at`), as exclusive_gate counts it: by now(), a turn whose transaction began
-- before the task's plan found none, and claimed other tasks after the task was due.
-- (Sorts on: under claim_due_tasks' enable_sort off, the plan walked every waiting task in
-- priority order rather than sort the few exclusive ones.)
CREATE FUNCTION pgtaskpy.first_unheld_exclusive_task(at timestamptz) RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET enable_sort = on
AS $$
    SELECT e.id FROM @extschema@.task AS e
    WHERE e.exclusive AND e.state = 'PLAN' AND e.waiting_for = 0 AND e.plan <= at  -- (read: the due ones)
      AND (e.plan <= at AND e.plan + e.active > at) IS TRUE
      AND pgtaskpy.owner_has_room(pgtaskpy.role_running_limit(e.owner), 0, 1)
      AND NOT pgtaskpy.group_paused(e.owner, e."group")  -- (70_operating.sql)
      AND NOT (e.max < 0 AND pgtaskpy.group_spaced(e.owner, e.hash, at))  -- (40_scheduling.sql: pause_group)
      AND pgtaskpy.rate_has_room(e.owner, e."group", 1)
    ORDER BY e.max DESC, e.id LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
$$;

-- Whether a due exclusive task is not held by a client (first_unheld_exclusive_task), asked
-- without keeping its row locked: the probe's lock goes with its subtransaction.  Kept, it
-- lasted to the end of every turn while the database drained for the task, and a client's
-- UPDATE or task_cancel of the row waited for it (NOWAIT failed).
CREATE FUNCTION pgtaskpy.due_exclusive_task_unheld(at timestamptz) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unheld boolean;
BEGIN
    BEGIN
        unheld := pgtaskpy.first_unheld_exclusive_task(at) IS NOT NULL;
        RAISE SQLSTATE 'PT001';  -- (rolls the subtransaction back, and the row lock with it)
    EXCEPTION WHEN SQLSTATE 'PT001' THEN
        NULL;
    END;
    RETURN unheld;
END
$$;

-- claim_due_tasks while an exclusive task is due or runs (under the
-- scheduling lock): the first due exclusive task (higher max, then lower id),
-- once no task of the database is claimed or running; else nothing.
CREATE FUNCTION pgtaskpy.claim_exclusive_task(claimer integer)
RETURNS TABLE (id bigint, hash integer, owner name, remote text, reuse boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off
AS $$
DECLARE
    taken bigint[];
BEGIN
    IF EXISTS (SELECT FROM @extschema@.task AS r WHERE r.state IN ('TAKE', 'WORK')) THEN
        RETURN;
    END IF;
    -- (40_scheduling.sql: a claim a trigger refuses fails that task)
    taken := pgtaskpy.take_claimed(array_remove(ARRAY[pgtaskpy.first_unheld_exclusive_task(clock_timestamp())], NULL),
                                   claimer);
    RETURN QUERY
    SELECT t.id, t.hash, t.owner, t.remote, (t.count > 0 OR t.live > interval '0') AS reuse
    FROM @extschema@.task AS t WHERE t.id = ANY (taken);
END
$$;

-- The trigger functions too: firing a trigger checks no EXECUTE right, but attaching
-- one does, and a SECURITY DEFINER one attached to an author's own table was fed any
-- task id (it stopped another role's dependents, or let one run before its prerequisite).
REVOKE ALL ON FUNCTION pgtaskpy.check_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.record_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.settle_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.keep_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.prerequisite_stopped() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.prerequisite_deleted() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.rearm_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.forget_truncated_prerequisites() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.resolve_dependents(bigint, @extschema@.state, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.pass_dependents_on(bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.exclusive_gate() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.claim_exclusive_task(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.first_unheld_exclusive_task(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.due_exclusive_task_unheld(timestamptz) FROM PUBLIC;
