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

-- A remote task's query is cancelled by its worker backend (the local backend
-- that runs it), which belongs to the launcher's role: hence SECURITY DEFINER,
-- with the caller's right to the task checked here.
CREATE FUNCTION pgtaskpy.cancel_remote_task(task_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
BEGIN
    SELECT * INTO t FROM @extschema@.task WHERE id = task_id AND state = 'WORK' AND remote IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT (pg_has_role(session_user, t.owner, 'MEMBER') OR pg_has_role(session_user, 'pgtaskpy_admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'permission denied to cancel task %', task_id USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN pg_cancel_backend(t.worker);
END
$$;

-- Stop a waiting task (STOP) or cancel a running one (it ends FAIL with the
-- cancel error; with stop_series, a repeating task gets no next run).
-- Returns whether there was something to stop.
CREATE FUNCTION @extschema@.task_cancel(task_id bigint, stop_series boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
BEGIN
    UPDATE @extschema@.task SET state = 'STOP' WHERE id = task_id AND state = 'PLAN' RETURNING * INTO t;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF stop_series THEN
        -- The run's end inserts the next run only while repeat > 0.
        UPDATE @extschema@.task SET repeat = interval '0' WHERE id = task_id AND state IN ('TAKE', 'WORK');
    END IF;
    SELECT * INTO t FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF t.state = 'WORK' AND t.remote IS NULL THEN
        RETURN pg_cancel_backend(t.pid);
    ELSIF t.state = 'WORK' THEN
        RETURN pgtaskpy.cancel_remote_task(task_id);
    END IF;
    RAISE EXCEPTION 'task % cannot be cancelled while %', task_id, t.state
        USING HINT = 'It is about to start; try again in a moment.';
END
$$;
COMMENT ON FUNCTION @extschema@.task_cancel IS 'STOP a waiting task or cancel a running one';
