-- Functions for users: enqueue a task, wait for its result, cancel it.

-- INSERT with only the given columns; the others take their defaults.
CREATE FUNCTION @extschema@.task_enqueue(
    input text,
    plan timestamptz DEFAULT NULL,
    "group" text DEFAULT NULL,
    max integer DEFAULT NULL,
    repeat interval DEFAULT NULL,
    timeout interval DEFAULT NULL,
    remote text DEFAULT NULL,
    data text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    names text[] := '{}';
    values_ text[] := '{}';
    task_id bigint;
BEGIN
    IF plan IS NOT NULL THEN names := array_append(names, 'plan'); values_ := array_append(values_, '$2'); END IF;
    IF "group" IS NOT NULL THEN names := array_append(names, 'group'); values_ := array_append(values_, '$3'); END IF;
    IF max IS NOT NULL THEN names := array_append(names, 'max'); values_ := array_append(values_, '$4'); END IF;
    IF repeat IS NOT NULL THEN names := array_append(names, 'repeat'); values_ := array_append(values_, '$5'); END IF;
    IF timeout IS NOT NULL THEN names := array_append(names, 'timeout'); values_ := array_append(values_, '$6'); END IF;
    IF remote IS NOT NULL THEN names := array_append(names, 'remote'); values_ := array_append(values_, '$7'); END IF;
    IF data IS NOT NULL THEN names := array_append(names, 'data'); values_ := array_append(values_, '$8'); END IF;
    EXECUTE format('INSERT INTO @extschema@.task (input%s) VALUES ($1%s) RETURNING id',
                   (SELECT string_agg(', ' || quote_ident(n), '') FROM unnest(names) AS n),
                   (SELECT string_agg(', ' || v, '') FROM unnest(values_) AS v))
        INTO task_id
        USING input, plan, "group", max, repeat, timeout, remote, data;
    RETURN task_id;
END
$$;
COMMENT ON FUNCTION @extschema@.task_enqueue IS 'insert a task (unset arguments take the column defaults) and return its id';

-- Wait until a task has ended and return its row (NULL when it was deleted
-- because it produced neither output nor error).  Polls with a growing pause:
-- a function cannot wait for NOTIFY.
CREATE FUNCTION @extschema@.task_wait(task_id bigint, wait_for interval DEFAULT interval '1 minute')
RETURNS @extschema@.task
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + wait_for;
    pause double precision := 0.001;
    t @extschema@.task;
BEGIN
    LOOP
        SELECT * INTO t FROM @extschema@.task WHERE id = task_id;
        IF NOT FOUND OR t.state NOT IN ('PLAN', 'TAKE', 'WORK') THEN
            RETURN t;
        END IF;
        IF clock_timestamp() >= deadline THEN
            RAISE EXCEPTION 'task % is still %, after waiting %', task_id, t.state, wait_for
                USING ERRCODE = 'query_canceled',
                      HINT = 'Is a launcher running for this database (pg_task_py run)? Wait longer with task_wait(id, interval).';
        END IF;
        PERFORM pg_sleep(pause);
        pause := least(pause * 2, 0.1);
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.task_wait IS 'wait for a task to end and return its row (NULL if it was deleted)';

-- Stop a waiting task (STOP) or cancel a running one (it ends FAIL with the
-- cancel error; with stop_series, a repeating task gets no next run).
-- Returns whether there was something to stop.  The caller's own view of
-- the table (row-level security) decides which tasks are theirs.
CREATE FUNCTION @extschema@.task_cancel(task_id bigint, stop_series boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE @extschema@.task SET state = 'STOP' WHERE id = task_id AND state = 'PLAN';
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN pgtaskpy.cancel_running_task(task_id, stop_series);
END
$$;
COMMENT ON FUNCTION @extschema@.task_cancel IS 'STOP a waiting task or cancel a running one';

-- The privileged half of task_cancel: a claimed task is stopped before it
-- starts; a running one is cancelled through the backend that really runs
-- it, found from the row the scheduler wrote (task authors cannot write
-- state, pid or worker) and checked against the server: the task's session
-- (a backend of this database logged in as the owner) or, for a remote task,
-- its worker (a worker backend of this database, started before the task).
-- SECURITY DEFINER, since those backends are not the caller's (a remote
-- task's worker belongs to the launcher's role); so the caller's right to the
-- task is checked here again, for its session user, as task_cancel's own
-- check cannot be relied on by a direct call.
CREATE FUNCTION pgtaskpy.cancel_running_task(task_id bigint, stop_series boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
BEGIN
    SELECT * INTO t FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT (pg_has_role(session_user, t.owner, 'MEMBER') OR pg_has_role(session_user, 'pgtaskpy_admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'permission denied to cancel task %', task_id USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF t.state = 'TAKE' THEN
        -- Claimed, not started: the worker that would start it finds it STOP
        -- (it takes only a task still TAKE by its claimer).
        UPDATE @extschema@.task SET state = 'STOP', worker = NULL WHERE id = task_id;
        RETURN true;
    END IF;
    IF stop_series THEN  -- the run's end inserts the next run only while repeat > 0
        UPDATE @extschema@.task SET repeat = interval '0' WHERE id = task_id;
    END IF;
    IF t.remote IS NULL AND EXISTS (
        SELECT FROM pg_stat_get_activity(t.pid) AS a
        WHERE t.pid IS NOT NULL AND a.usesysid = to_regrole(quote_ident(t.owner))
          AND a.datid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())) THEN
        RETURN pg_cancel_backend(t.pid);
    ELSIF t.remote IS NOT NULL AND pgtaskpy.scheduler_backend_alive(t.worker, t.start) THEN
        RETURN pg_cancel_backend(t.worker);  -- it cancels the remote query (run_task, serve_interrupts)
    END IF;
    RETURN false;  -- its backend is gone: recovery ends it
END
$$;

-- Task authors get them through pgtaskpy_user (and PUBLIC, unless a DBA revokes it).
GRANT EXECUTE ON FUNCTION @extschema@.task_enqueue(text, timestamptz, text, integer, interval, interval, text, text),
    @extschema@.task_wait(bigint, interval), @extschema@.task_cancel(bigint, boolean) TO pgtaskpy_user;
