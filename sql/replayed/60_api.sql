-- Functions for users: enqueue a task, wait for its result, cancel it; named
-- series (task_schedule, task_unschedule) and the view of the series.

-- INSERT with only the given columns; the others take their defaults.
-- With a key, on_conflict says what happens when the caller already has a
-- task of that key waiting (the unique index task_key_waiting): 'error' (the
-- unique violation), 'skip' (its id is returned and nothing changes) or
-- 'replace' (its input, plan and data become the given ones: a debounce).
-- A running task of the key is never touched: the new one waits behind it
-- (the runs of a key never overlap).
CREATE FUNCTION @extschema@.task_enqueue(
    input text,
    plan timestamptz DEFAULT NULL,
    "group" text DEFAULT NULL,
    max integer DEFAULT NULL,
    repeat interval DEFAULT NULL,
    timeout interval DEFAULT NULL,
    remote text DEFAULT NULL,
    data text DEFAULT NULL,
    after bigint[] DEFAULT NULL,
    key text DEFAULT NULL,
    on_conflict text DEFAULT 'error',
    after_any boolean DEFAULT NULL,
    exclusive boolean DEFAULT NULL,
    retry integer DEFAULT NULL,
    retry_delay interval DEFAULT NULL,
    retry_max interval DEFAULT NULL,
    retry_on text[] DEFAULT NULL,
    retry_unsafe boolean DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The columns of the arguments after input, in their order (on_conflict names none):
    -- argument i + 1 is $(i + 1).
    columns text[] := '{plan,group,max,repeat,timeout,remote,data,after,key,NULL,after_any,exclusive,'
                      'retry,retry_delay,retry_max,retry_on,retry_unsafe}';
    given boolean[] := ARRAY[plan IS NOT NULL, "group" IS NOT NULL, max IS NOT NULL, repeat IS NOT NULL,
                             timeout IS NOT NULL, remote IS NOT NULL, data IS NOT NULL, after IS NOT NULL,
                             key IS NOT NULL, false, after_any IS NOT NULL, exclusive IS NOT NULL,
                             retry IS NOT NULL, retry_delay IS NOT NULL, retry_max IS NOT NULL,
                             retry_on IS NOT NULL, retry_unsafe IS NOT NULL];
    names text := '';
    values_ text := '';
    conflict text := '';
    task_id bigint;
BEGIN
    -- (NULL is unset, as for every other argument: its default.  It was "invalid on_conflict".)
    on_conflict := coalesce(on_conflict, 'error');
    IF on_conflict NOT IN ('error', 'skip', 'replace') THEN
        RAISE EXCEPTION 'invalid on_conflict "%"', on_conflict
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''error'', ''skip'' or ''replace''.';
    END IF;
    -- (without a key there is nothing to conflict with: 'skip' inserted a second task as 'error' does)
    IF key IS NULL AND on_conflict <> 'error' THEN
        RAISE EXCEPTION 'on_conflict => ''%'' needs a key', on_conflict
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'on_conflict decides what happens when a task of the same key is waiting; give key => ...';
    END IF;
    FOR i IN 1..cardinality(columns) LOOP
        IF given[i] THEN
            names := names || ', ' || quote_ident(columns[i]);
            values_ := values_ || ', $' || (i + 1);
        END IF;
    END LOOP;
    -- (the inference clause names task_key_waiting, a partial index: ON CONSTRAINT cannot)
    IF key IS NOT NULL AND on_conflict = 'skip' THEN
        conflict := ' ON CONFLICT (owner, key) WHERE state = ''PLAN'' AND key IS NOT NULL DO NOTHING';
    ELSIF key IS NOT NULL AND on_conflict = 'replace' THEN
        conflict := ' ON CONFLICT (owner, key) WHERE state = ''PLAN'' AND key IS NOT NULL'
                    ' DO UPDATE SET input = EXCLUDED.input, plan = EXCLUDED.plan, data = EXCLUDED.data';
    END IF;
    -- ('replace' gave a series' waiting run this call's input: each later run ran it.  Whatever
    -- this call's repeat: the update changes input, plan and data only.)
    IF key IS NOT NULL AND on_conflict = 'replace'
       AND EXISTS (SELECT FROM @extschema@.task AS w
                   WHERE w.owner = current_user AND w.key = task_enqueue.key AND w.state = 'PLAN'
                     AND (w.cron IS NOT NULL OR w.repeat > interval '0')) THEN
        RAISE EXCEPTION 'key "%" names a series: on_conflict => ''replace'' would change what each of its runs does',
            task_enqueue.key USING ERRCODE = 'unique_violation',
            HINT = 'Change a series with task_schedule; run it now with UPDATE task SET plan = now() '
                   'WHERE key = ... AND state = ''PLAN''.';
    END IF;
    FOR attempt IN 1..100 LOOP
        -- (the table an argument: a % in the schema's name was read as format's, a review)
        EXECUTE format('INSERT INTO %s AS t (input%s) VALUES ($1%s)%s RETURNING t.id',
                       '@extschema@.task'::pg_catalog.regclass, names, values_, conflict)
            INTO task_id
            USING input, plan, "group", max, repeat, timeout, remote, data, after, key, on_conflict, after_any,
                  exclusive, retry, retry_delay, retry_max, retry_on, retry_unsafe;
        IF task_id IS NOT NULL THEN
            RETURN task_id;
        END IF;
        -- skip: the waiting task of the key, unless it has started since (then insert again)
        SELECT t.id INTO task_id FROM @extschema@.task AS t
        WHERE t.owner = current_user AND t.key = task_enqueue.key AND t.state = 'PLAN';
        IF task_id IS NOT NULL THEN
            RETURN task_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'task_enqueue: the waiting task of key "%" kept changing', key
        USING ERRCODE = 'lock_not_available', HINT = 'Try again.';
END
$$;
COMMENT ON FUNCTION @extschema@.task_enqueue IS 'insert a task (unset arguments take the column defaults) and return its id';

-- A linear chain in one call: each input runs after the one before has ended
-- DONE (a failure stops the rest), or, with ignore_errors, once it has ended
-- in any state (after_any); the retry arguments go to every step.  Returns the
-- ids in order.
CREATE FUNCTION @extschema@.task_chain(
    inputs text[], "group" text DEFAULT NULL, ignore_errors boolean DEFAULT false,
    retry integer DEFAULT NULL, retry_delay interval DEFAULT NULL, retry_max interval DEFAULT NULL,
    retry_on text[] DEFAULT NULL, retry_unsafe boolean DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step text;
    ids bigint[] := '{}';
BEGIN
    IF inputs IS NULL OR array_ndims(inputs) IS DISTINCT FROM 1 THEN  -- (array_ndims of '{}' is NULL)
        RAISE EXCEPTION 'task_chain needs a one-dimensional array of inputs, at least one'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(inputs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'task_chain: step % of the inputs is NULL', array_position(inputs, NULL) - array_lower(inputs, 1) + 1
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF ignore_errors IS NULL THEN
        RAISE EXCEPTION 'task_chain: ignore_errors must be true or false' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- (an empty step failed the table's check, which named no step and showed the INSERT of
    -- task_enqueue: a probe.  The check's own test, check_task's.)
    FOR n IN 1..cardinality(inputs) LOOP
        step := inputs[array_lower(inputs, 1) + n - 1];
        IF NOT (btrim(left(step, 100), E' \t\r\n;') <> ''
                OR btrim(convert_to(step, current_setting('server_encoding')), E'\\x090a0d203b'::bytea) <> ''::bytea) THEN
            RAISE EXCEPTION 'task_chain: step % of the inputs is empty', n
                USING ERRCODE = 'check_violation', CONSTRAINT = 'task.input must not be empty';
        END IF;
    END LOOP;
    FOREACH step IN ARRAY inputs LOOP
        ids := ids || @extschema@.task_enqueue(
            step, "group" => task_chain."group",
            after => CASE WHEN cardinality(ids) > 0 THEN ARRAY[ids[cardinality(ids)]] END,
            after_any => CASE WHEN cardinality(ids) > 0 AND ignore_errors THEN true END,
            retry => task_chain.retry, retry_delay => task_chain.retry_delay, retry_max => task_chain.retry_max,
            retry_on => task_chain.retry_on, retry_unsafe => task_chain.retry_unsafe);
    END LOOP;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION @extschema@.task_chain IS 'insert a chain of tasks, each after the one before; returns their ids';

-- Whether the calling transaction (not a savepoint of it) holds a lock on the task's row: the
-- row's xmax is its id, whatever the lock's strength.  task_wait's.
CREATE FUNCTION pgtaskpy.row_locked_here(task_id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.xmax = (pg_current_xact_id_if_assigned()::text::bigint % 4294967296)::text::xid
    FROM @extschema@.task AS t WHERE t.id = task_id
$$;

-- Whether the task's row version is the calling transaction's, a savepoint's of it included: one
-- this session sees whose inserting transaction is still in progress can be no other's.  Its
-- xmin, a savepoint's id or the transaction's, is at or after the transaction's own id (given
-- first, and once it writes): made a 64-bit id from there, pg_xact_status reads it (an older
-- row's, read as in the future, is none of this transaction's).  task_wait's: it compared xmin
-- with the transaction's id alone, and a task inserted in a savepoint (psycopg's nested
-- transaction(), a framework's atomic block) waited out its whole wait, the hint naming the launcher.
CREATE FUNCTION pgtaskpy.row_written_here(task_id bigint) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    own bigint := pg_current_xact_id_if_assigned()::text::bigint;
    low bigint := (SELECT t.xmin::text::bigint FROM @extschema@.task AS t WHERE t.id = task_id);
    id xid8;
BEGIN
    IF own IS NULL OR low IS NULL THEN
        RETURN false;
    END IF;
    id := (own + (low - own % 4294967296 + 4294967296) % 4294967296)::text::xid8;
    -- (not another's that was running as the snapshot was taken: a frozen row of a database past
    -- its first 2^32 transactions may have the low bits of one, a review)
    RETURN pg_xact_status(id) = 'in progress'
           AND NOT EXISTS (SELECT FROM pg_snapshot_xip(pg_current_snapshot()) AS x WHERE x = id);
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN false;
END
$$;

-- What keeps the running task `t` from ending that the calling session holds (NULL: nothing): a
-- lock its end waits for (an INSERT of a task of its key, whose retry or next run then waits for
-- the commit), or one its query waits for (a row of this transaction's).  Neither is let go
-- while task_wait waits, and it waited out its whole wait, its hint "it is running" (a probe).
-- (A remote task's pid, or a standby's, is another server's.)
CREATE FUNCTION pgtaskpy.end_held_here(t @extschema@.task) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN pg_backend_pid() = ANY (pg_blocking_pids(t.worker))
                THEN format('its end (worker backend %s) waits for a lock this session holds', t.worker)
                WHEN t.remote IS NULL AND t.target IS NULL AND pg_backend_pid() = ANY (pg_blocking_pids(t.pid))
                THEN format('its query (backend %s) waits for a lock this session holds', t.pid) END
$$;

-- Wait until a task has ended and return its row (NULL when it was deleted
-- because it produced neither output nor error).  Polls with a growing pause:
-- a function cannot wait for NOTIFY.
CREATE FUNCTION @extschema@.task_wait(task_id bigint, wait_for interval DEFAULT interval '1 minute')
RETURNS @extschema@.task
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline timestamptz;
    pause double precision := 0.001;
    t @extschema@.task;
    locked_here boolean := false;  -- this transaction has locked the task's row
    held_here text;  -- what of this session's keeps the running task from ending (end_held_here)
    rate_limit text;  -- its group's task_limit, for the hint of a wait that runs out
    spaced_until timestamptz;  -- the end of its group's pause after a run (max < 0), for that hint too
BEGIN
    IF task_id IS NULL OR wait_for IS NULL THEN
        RAISE EXCEPTION 'task_wait needs a task id and how long to wait, not NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF wait_for < interval '0' THEN
        RAISE EXCEPTION 'task_wait needs a wait of zero or more, not %', wait_for
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (a wait past what a timestamp holds, '300000 years', failed "timestamp out of range": for ever)
    deadline := CASE WHEN wait_for >= interval '1000 years' THEN 'infinity' ELSE clock_timestamp() + wait_for END;
    LOOP
        SELECT * INTO t FROM @extschema@.task WHERE id = task_id;
        IF NOT FOUND THEN
            RETURN NULL;  -- (a NULL, not a row of NULLs, which a client reads as a row)
        ELSIF t.state NOT IN ('PLAN', 'TAKE', 'WORK') THEN
            RETURN t;
        END IF;
        IF pause = 0.001 THEN  -- (the first look) It would wait in vain: its snapshot never shows the
            -- end, or the task cannot start before this transaction commits.
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'task_wait cannot see a task end in a % transaction',
                    upper(current_setting('transaction_isolation'))
                    USING ERRCODE = 'feature_not_supported', HINT = 'Call it in a READ COMMITTED transaction.';
            -- The row's version is this transaction's (or a savepoint's): it inserted the row, or
            -- updated it, and so holds it until it commits (a task is inserted PLAN: one claimed or
            -- running was updated).  The claims skip a row held; an end waits for it.
            ELSIF pgtaskpy.row_written_here(task_id) THEN
                RAISE EXCEPTION 'task % was %: it cannot % before the transaction commits', task_id,
                    CASE WHEN t.state = 'PLAN' THEN 'inserted or updated by this transaction'
                         ELSE 'updated by this transaction' END,
                    CASE WHEN t.state = 'PLAN' THEN 'start' ELSE 'end' END
                    USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Commit, then call task_wait.';
            END IF;
            -- A lock this transaction holds on the row: task_cancel's, or SELECT ... FOR UPDATE or
            -- FOR SHARE, keeps the task from starting or ending until the transaction ends; the KEY
            -- SHARE lock of a foreign key's check (a row of another table that references the task)
            -- keeps it from nothing, and xmax cannot tell them apart.  So this waits, unless this
            -- transaction's own task_cancel took it (pgtaskpy.cancelled_tasks).
            -- (called in the task's own session: it waited its whole wait_for, for ever with 1000 years)
            IF t.state IN ('TAKE', 'WORK') AND t.pid = pg_backend_pid()
               AND task_id::text = current_setting('pg_task.id', true) THEN
                RAISE EXCEPTION 'task % cannot wait for its own end', task_id
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = 'task_wait was called in the task''s own session.';
            END IF;
            locked_here := pgtaskpy.row_locked_here(task_id);
            IF locked_here AND t.state IN ('TAKE', 'WORK') AND task_id::text = ANY (string_to_array(
                   current_setting('pgtaskpy.cancelled_tasks', true), ',')) THEN
                RAISE EXCEPTION 'task % is locked by this transaction (task_cancel): it cannot end before the transaction commits',
                    task_id USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Commit, then call task_wait.';
            END IF;
        END IF;
        held_here := CASE WHEN t.state = 'WORK' THEN pgtaskpy.end_held_here(t) END;
        IF held_here IS NOT NULL THEN
            RAISE EXCEPTION 'task % cannot end while this session holds what it waits for: %', task_id, held_here
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Commit (or let go of the session''s advisory lock), then call task_wait.';
        END IF;
        IF clock_timestamp() >= deadline THEN
            locked_here := pgtaskpy.row_locked_here(task_id);  -- (the row's version now)
            -- (read where the caller may, as pgtaskpy_user may its own: a role granted the table alone
            -- by hand got `permission denied for table group_limit` for its wait's end, a review)
            IF has_table_privilege('pgtaskpy.group_limit', 'SELECT') THEN
                rate_limit := (SELECT format('%s tasks per %s', l.starts, l.per) FROM pgtaskpy.group_limit AS l
                               WHERE l.owner = t.owner AND l."group" = t."group");
            END IF;
            -- (the end of the pause after its group's last run that holds it, max < 0)
            IF t.max < 0 AND has_table_privilege('pgtaskpy.group_spacing', 'SELECT') THEN
                spaced_until := (SELECT s.until FROM pgtaskpy.group_spacing AS s
                                 WHERE s.owner = t.owner AND s.hash = t.hash AND s.until > clock_timestamp());
            END IF;
            RAISE EXCEPTION 'task % is still %, after waiting %', task_id, t.state, wait_for
                USING ERRCODE = 'query_canceled',
                      HINT = CASE WHEN locked_here
                          THEN format('This transaction holds a lock on the task''s row: one of task_cancel, SELECT ... FOR UPDATE or FOR SHARE, or an INSERT of a task after it keeps it from %s until the transaction commits (a foreign key''s check does not). Commit, then call task_wait.',
                                      CASE WHEN t.state = 'PLAN' THEN 'starting' ELSE 'ending' END)
                          -- (a launcher is not what it lacks: said as the hint to look for one misled)
                          WHEN t.state = 'PLAN' AND t.waiting_for > 0
                          THEN format('It waits for %s of its prerequisites (after: %s) to end. Wait longer with task_wait(id, interval).',
                                      t.waiting_for, t.after)
                          WHEN t.state = 'PLAN' AND t.plan > clock_timestamp()
                          THEN format('It is planned for %s. Wait longer with task_wait(id, interval).', t.plan)
                          WHEN t.state = 'PLAN' AND pgtaskpy.group_paused(t.owner, t."group")
                          THEN format('Its group %L of role %I is paused: task_resume(%L) lets it start.',
                                      t."group", t.owner, t."group")
                          WHEN t.state = 'PLAN' AND pgtaskpy.role_running_limit(t.owner) = 0
                          THEN format('Role %I may run no task: its pg_task_py.role_running_limit (or CONNECTION LIMIT) is 0.',
                                      t.owner)
                          WHEN t.state = 'PLAN' AND spaced_until IS NOT NULL
                          THEN format('Its group %L waits out the pause of %s ms after its last run (max %s): it starts at %s at the earliest. Wait longer with task_wait(id, interval).',
                                      t."group", -(t.max::bigint), t.max, spaced_until)
                          WHEN t.state = 'PLAN' AND rate_limit IS NOT NULL
                          THEN format('Its group %L of role %I starts at most %s (task_limit): it waits its turn. Wait longer with task_wait(id, interval).',
                                      t."group", t.owner, rate_limit)
                          -- (a launcher is not what these lack either: a probe was told to look for one)
                          WHEN t.state = 'PLAN' AND t.key IS NOT NULL AND EXISTS (
                                   SELECT FROM @extschema@.task AS k
                                   WHERE k.state IN ('TAKE', 'WORK') AND k.owner = t.owner AND k.key = t.key)
                          THEN format('A run of its key %L is running: the runs of a key never overlap, it starts once that one has ended. Wait longer with task_wait(id, interval).',
                                      t.key)
                          WHEN t.state = 'WORK'
                          THEN format('It is running (since %s, in backend %s%s): it has not ended yet. Wait longer with task_wait(id, interval), or cancel it with task_cancel(%s).',
                                      t.start, t.pid, CASE WHEN t.remote IS NOT NULL THEN ' of its remote server' ELSE '' END, task_id)
                          WHEN t.state = 'TAKE'
                          THEN 'It is claimed: a worker is opening its session, or waits for a free connection (max_connections, its role''s CONNECTION LIMIT). Wait longer with task_wait(id, interval).'
                          WHEN t.state = 'PLAN' AND t.exclusive
                          THEN 'It is exclusive: it starts once no other task of the database is claimed or running. Wait longer with task_wait(id, interval).'
                          ELSE 'It is due: it starts once its group has room (max; a negative max: once the pause after its group''s last run is over), no exclusive task is due or running, and its role is under its running limit. Is a launcher running for this database (pg_task_py run)? Wait longer with task_wait(id, interval).' END;
        END IF;
        PERFORM pg_sleep(pause);
        pause := least(pause * 2, 0.1);
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.task_wait IS 'wait for a task to end and return its row (NULL if it was deleted)';

-- Stop a waiting task (STOP) or cancel a running one (it ends FAIL with the
-- cancel error).  A series (repeat or cron) goes on with its next run, as
-- after any run's end: a waiting run stopped is skipped; with stop_series, it
-- gets no next run.  Returns whether there was something to stop.  The
-- caller's own view of the table (row-level security) decides which tasks
-- are theirs.  A running task is looked for first: its cancel updates no
-- row of the table, so that a task holding a lock on it (LOCK TABLE task IN
-- SHARE MODE, which an UPDATE waits for) can still be cancelled.
-- The run that goes on from a series' run `task_id` that has ended: its next run, or a retry,
-- which names it as parent (and so on, past those that have ended too): its id, NULL when
-- none of the caller's waits or runs, or the run's row is gone (deleted at its end).  The
-- series' own rows: its owner's, the last that names the run (its end inserts it; a task the
-- run inserted, whose parent pg_task.id also makes the run's, came before), a next run when
-- the run repeats, or its retry (attempt + 1); not a task that a one-off or an ended series
-- inserted, a repeating one too (a review: one-off 1 had inserted series 2, and
-- task_cancel(1, true) ended series 2), nor another role's that names the run so.  Not by
-- input: task_schedule or an UPDATE may give the waiting run another (a review).  Each step a
-- later id: a parent written by hand makes no loop.
CREATE FUNCTION pgtaskpy.series_run_after(task_id bigint) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run @extschema@.task;
BEGIN
    SELECT * INTO run FROM @extschema@.task AS t WHERE t.id = task_id;
    WHILE FOUND LOOP
        SELECT * INTO run FROM @extschema@.task AS c
        WHERE c.parent = run.id AND c.id > run.id AND c.owner = run.owner
          AND ((run.repeat > interval '0' OR run.cron IS NOT NULL) AND (c.repeat > interval '0' OR c.cron IS NOT NULL)
               OR c.attempt = run.attempt + 1)
        ORDER BY c.id DESC LIMIT 1;
        IF FOUND AND run.state IN ('PLAN', 'TAKE', 'WORK') THEN
            RETURN run.id;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION @extschema@.task_cancel(task_id bigint, stop_series boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    series boolean;
    follower bigint;
BEGIN
    IF pgtaskpy.cancel_if_running(task_id, stop_series) THEN
        RETURN pgtaskpy.note_cancelled(task_id);
    END IF;
    -- A named series' waiting run: its series is locked before its row, as task_schedule
    -- locks them (the other order deadlocked with a task_schedule of the series).
    PERFORM pgtaskpy.lock_series(t.owner, t.key)
    FROM @extschema@.task AS t WHERE t.id = task_id AND t.state = 'PLAN' AND t.key IS NOT NULL;
    UPDATE @extschema@.task AS t SET state = 'STOP' WHERE t.id = task_id AND t.state = 'PLAN'
    RETURNING t.repeat > interval '0' OR t.cron IS NOT NULL INTO series;
    IF FOUND THEN
        IF series AND stop_series IS NOT TRUE THEN  -- (NULL: the default, as for a running task)
            INSERT INTO pgtaskpy.steering_proof (task_id) VALUES (task_id);
            PERFORM pgtaskpy.follow_skipped_run(task_id);
        END IF;
        RETURN true;
    END IF;
    -- (claimed meanwhile: the UPDATE waited for the claim's row lock, then found it TAKE)
    IF pgtaskpy.cancel_if_running(task_id, stop_series) THEN
        RETURN pgtaskpy.note_cancelled(task_id);
    END IF;
    -- Ended before the cancel reached it (the cancel waited for its row as its end was written),
    -- and the series went on: stop_series is for the series, whose run that goes on is stopped or
    -- cancelled in its place.  (A series of a tiny repeat was never caught: 25 cancels of 25
    -- returned false, and it ran on, 100 runs a second: a probe.)
    follower := CASE WHEN stop_series THEN pgtaskpy.series_run_after(task_id) END;
    RETURN follower IS NOT NULL AND @extschema@.task_cancel(follower, true);
END
$$;

-- A running task this transaction cancelled, noted for task_wait until the transaction ends: the
-- cancel's lock on its row holds its end until then.  Returns true.
CREATE FUNCTION pgtaskpy.note_cancelled(task_id bigint) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    SELECT set_config('pgtaskpy.cancelled_tasks',
                      concat_ws(',', NULLIF(current_setting('pgtaskpy.cancelled_tasks', true), ''), task_id), true)
           IS NOT NULL
$$;

-- task_cancel's half for a task that is TAKE or WORK in the caller's view of
-- the table: false when it is not (or no longer) running.
CREATE FUNCTION pgtaskpy.cancel_if_running(task_id bigint, stop_series boolean) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgtaskpy.steering_proof (task_id) VALUES (task_id);
    RETURN pgtaskpy.cancel_running_task(task_id, stop_series);
END
$$;
COMMENT ON FUNCTION @extschema@.task_cancel IS 'STOP a waiting task or cancel a running one';

-- Whether the calling role may act on the task (or the series of the role
-- `series_owner`): the proof its public half inserted in this transaction
-- (pgtaskpy.steering_proof, sql/created_once/35_security.sql), taken.  What
-- the SECURITY DEFINER halves of task_cancel and task_unschedule check, where
-- row-level security (current_user: their definer) no longer does, and
-- session_user is not the caller when a superuser's session calls a task
-- author's SECURITY DEFINER function.
CREATE FUNCTION pgtaskpy.take_steering_proof(proof_task bigint, proof_owner name) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    WITH taken AS (
        DELETE FROM pgtaskpy.steering_proof AS p
        WHERE p.xact = pg_current_xact_id()
          AND p.task_id IS NOT DISTINCT FROM proof_task AND p.owner IS NOT DISTINCT FROM proof_owner
        RETURNING 1)
    SELECT EXISTS (SELECT FROM taken)
$$;

-- Whether the running task's own session holds its row (`xmax`: the row's, which a whole-row
-- value leaves out): a task that wrote its progress (`data`) or locked its row, whose
-- transaction keeps the lock until the input ends.  task_cancel and a launcher's stop cancel
-- such a task without waiting for the row.
CREATE FUNCTION pgtaskpy.held_by_its_session(t @extschema@.task, row_xmax xid) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF t.state IS DISTINCT FROM 'WORK' OR t.remote IS NOT NULL OR t.target IS NOT NULL OR t.pid IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_stat_clear_snapshot();  -- (the activity as it is now, not as the transaction first read it)
    RETURN EXISTS (SELECT FROM pg_stat_get_activity(t.pid) AS a
                   WHERE a.backend_xid = row_xmax AND pgtaskpy.may_be_task_session(t, a.usesysid, a.backend_start,
                                                                                a.application_name)
                     AND a.datid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()));
END
$$;

-- The mark of a running task's cancel, which its end reads (retry_plan): a user's, whose run is
-- never retried, or a launcher's stop's (its session sets pgtaskpy.stop_cancels for its cancels,
-- dispatch.py), retried as an error.  Any role may set the setting: a superuser's session only
-- is a launcher's (a task author's own cancel was retried so, and an admin's of another role's).
-- A user's stays, before or after a stop's: a stop's insert waits for a user's open one and then
-- keeps it (marked later by the stop, a user's mark that committed as the stop's turn ran was
-- taken for the stop's: a review).
CREATE FUNCTION pgtaskpy.mark_cancelled(task_id bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO pgtaskpy.cancelled_run AS c (task_id, by_stop)
    VALUES (task_id, coalesce(current_setting('pgtaskpy.stop_cancels', true), '') = 'on'
                     AND (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user))
    ON CONFLICT ON CONSTRAINT cancelled_run_pkey DO UPDATE SET by_stop = false WHERE c.by_stop AND NOT excluded.by_stop
$$;
REVOKE ALL ON FUNCTION pgtaskpy.mark_cancelled(bigint) FROM PUBLIC;

-- The privileged half of task_cancel: a claimed task is stopped before it
-- starts; a running one is cancelled through the backend that really runs
-- it, found from the row the scheduler wrote (task authors cannot write
-- state, pid or worker) and checked against the server: the task's session
-- (a backend of this database that may_be_task_session: logged in as the owner,
-- or named as a task's session, its role renamed or dropped since) or, for a remote task
-- or one of a target, its worker (a worker backend of this database, started before the task).
-- SECURITY DEFINER, since those backends are not the caller's (a remote
-- task's worker belongs to the launcher's role); so the caller's right to the
-- task is checked here again (take_steering_proof), as task_cancel's own
-- check cannot be relied on by a direct call.
CREATE FUNCTION pgtaskpy.cancel_running_task(task_id bigint, stop_series boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
    held_by_task boolean := false;  -- the task's own transaction holds its row
    old_level text;
BEGIN
    -- (taken first: a proof left over would be there for the rest of the transaction)
    IF NOT pgtaskpy.take_steering_proof(task_id, NULL) THEN
        RAISE EXCEPTION 'permission denied to cancel task %', task_id USING ERRCODE = 'insufficient_privilege',
            HINT = 'Cancel it with task_cancel(id), as a role that sees it.';
    END IF;
    SELECT * INTO t FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK') FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- A task that writes its progress to its row (`data`) or locks it holds the row until its
        -- input ends: the cancel waited that long, then found it DONE.  Its session is signalled
        -- without the lock, then the lock is taken (the end waits for it, as below).  Any other
        -- holder (the task's end being written) is waited for.
        SELECT r.* INTO t FROM @extschema@.task AS r WHERE r.id = task_id AND pgtaskpy.held_by_its_session(r, r.xmax);
        held_by_task := FOUND;
        IF NOT held_by_task THEN
            SELECT * INTO t FROM @extschema@.task WHERE id = task_id AND state IN ('TAKE', 'WORK') FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
        END IF;
    END IF;
    IF t.state = 'TAKE' THEN
        -- Claimed, not started: the worker that would start it finds it STOP
        -- (it takes only a task still TAKE by its claimer).  A series goes on
        -- with its next run, as after a waiting run's stop (it ended the series).
        UPDATE @extschema@.task SET state = 'STOP', worker = NULL WHERE id = task_id;
        IF (t.repeat > interval '0' OR t.cron IS NOT NULL) AND stop_series IS NOT TRUE THEN
            INSERT INTO pgtaskpy.steering_proof (task_id) VALUES (task_id);
            PERFORM pgtaskpy.follow_skipped_run(task_id);
        END IF;
        RETURN true;
    END IF;
    IF stop_series THEN
        -- A run's own call: the cancel below ends its transaction, and the series' end with it.
        IF t.pid = pg_backend_pid() AND t.remote IS NULL AND t.target IS NULL THEN
            RAISE EXCEPTION 'task % cannot end its own series with task_cancel', task_id
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'The cancel would roll back its own transaction, and the end of the series with it.',
                      HINT = 'From its run, end its series with task_unschedule(key) (a named one), or with UPDATE task'
                             ' SET repeat = ''0'', cron = NULL WHERE id = current_setting(''pg_task.id'')::bigint:'
                             ' the run finishes, and no next run follows.';
        END IF;
        PERFORM pgtaskpy.end_series(task_id);
    END IF;
    -- (A task of target 'standby' may run on the standby, whose pids are not this server's.  The
    -- activity read afresh: an earlier call in this transaction left its snapshot, in which an
    -- ended session still showed, and the signal warned "PID ... is not a PostgreSQL backend".)
    PERFORM pg_stat_clear_snapshot();
    IF t.remote IS NULL AND t.target IS NULL AND EXISTS (
        SELECT FROM pg_stat_get_activity(t.pid) AS a
        WHERE t.pid IS NOT NULL AND pgtaskpy.may_be_task_session(t, a.usesysid, a.backend_start,
                                                                                a.application_name)
          AND a.datid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())) THEN
        -- A task just marked WORK may not have its input in its session yet (the
        -- worker sends it right after that commit), and a cancel that reaches
        -- the session before it, even while it runs the short statement that
        -- prepares it, is lost: wait until the session runs the input, or ran
        -- it last (its query a prefix of the input: the view truncates), a
        -- second at most.  (The task's end waits for this transaction's row
        -- lock, so it cannot slip by; the view is a snapshot until cleared.)
        FOR attempt IN 1..200 LOOP
            PERFORM pg_stat_clear_snapshot();
            EXIT WHEN NOT EXISTS (
                SELECT FROM pg_stat_get_activity(t.pid) AS a
                WHERE (a.query = '' OR NOT starts_with(t.input, a.query))
                  AND a.query <> 'COMMIT');  -- (the COMMIT a worker adds after the input)
            PERFORM pg_sleep(0.005);
        END LOOP;
        -- (read by the end, which waits for this transaction's row lock: no retry of a cancel)
        PERFORM pgtaskpy.mark_cancelled(task_id);
        -- (A session that ends between the look and the signal made the signal warn the caller
        -- "PID ... is not a PostgreSQL backend process" and the call return false: its input had
        -- ended, and the task ends as it would have, as README's task_cancel says, true.)
        old_level := current_setting('client_min_messages');
        PERFORM set_config('client_min_messages', 'error', true);
        PERFORM pg_cancel_backend(t.pid);
        PERFORM set_config('client_min_messages', old_level, true);
        IF held_by_task THEN  -- (free once the cancel has ended the task's transaction)
            BEGIN
                -- (A task that catches the cancel holds the row on: the end may then miss the
                -- cancel's note, rather than this wait, a launcher's stop's, last the task's run.)
                PERFORM set_config('lock_timeout', '5s', true);
                PERFORM FROM @extschema@.task AS r WHERE r.id = task_id FOR NO KEY UPDATE;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
        RETURN true;
    ELSIF (t.remote IS NOT NULL OR t.target IS NOT NULL) AND pgtaskpy.scheduler_backend_alive(t.worker, t.start, '{worker}') THEN
        PERFORM pgtaskpy.mark_cancelled(task_id);
        RETURN pg_cancel_backend(t.worker);  -- it cancels the remote query (run_task, serve_interrupts)
    END IF;
    -- Its session is gone: its input has ended, and its end waits for this transaction's lock on
    -- the row (it ends as it would have, and the call says so, as README's task_cancel does), or
    -- its worker is gone too, and recovery ends it.  With stop_series a series (or the run's
    -- retries) has ended here, whichever it was: false said "nothing to stop" (a probe: 39
    -- calls of 60).
    RETURN stop_series IS TRUE AND (t.repeat > interval '0' OR t.cron IS NOT NULL OR t.attempt <= t.retry)
           OR pgtaskpy.scheduler_backend_alive(t.worker, t.start, '{worker}');
END
$$;

-- The next run of a series whose waiting run task_cancel has just stopped, as
-- that run's end would have inserted it (follow_task); its id, or NULL when
-- the task is no stopped run of a series, or has a next run already (a second
-- call inserts none).  SECURITY DEFINER, as follow_task is the scheduler's; so
-- the caller's right to the task is checked here again (take_steering_proof),
-- as cancel_running_task does.
CREATE FUNCTION pgtaskpy.follow_skipped_run(task_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
BEGIN
    IF NOT pgtaskpy.take_steering_proof(task_id, NULL) THEN  -- (first, as cancel_running_task's)
        RAISE EXCEPTION 'permission denied to go on with the series of task %', task_id
            USING ERRCODE = 'insufficient_privilege', HINT = 'Stop its run with task_cancel(id), as a role that sees it.';
    END IF;
    SELECT * INTO t FROM @extschema@.task AS s
    WHERE s.id = task_id AND s.state = 'STOP' AND (s.repeat > interval '0' OR s.cron IS NOT NULL)
    FOR NO KEY UPDATE;
    -- (a next run is the series': its owner's, repeating.  Any role may name the task
    -- as the parent of its own rows, and this function sees every role's.)
    IF NOT FOUND OR EXISTS (SELECT FROM @extschema@.task AS n
                            WHERE n.parent = task_id AND n.owner = t.owner
                              AND (n.repeat > interval '0' OR n.cron IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    t.max := greatest(t.max, 0);  -- (a negative max pushes the group back after a run, not a skipped one)
    PERFORM pgtaskpy.follow_task(t);
    RETURN (SELECT n.id FROM @extschema@.task AS n
            WHERE n.parent = task_id AND n.owner = t.owner AND n.state = 'PLAN'
              AND (n.repeat > interval '0' OR n.cron IS NOT NULL));
END
$$;

-- The run again of ended task `task_id` still to come (waiting, claimed or running), if any: its
-- automatic retry, a copy task_retry made of it (a one-off child with its input and remote), or
-- a retry of those, each the child of the attempt before (the third attempt waiting behind a
-- failed second was not seen, and the task ran twice).  Not the next regular run of the task's
-- series (attempt 1 with its repeat or cron; a series' retry has them too), nor a task the
-- task's own SQL inserted (its child by pg_task.id, with an input of its own): task_retry took
-- such a child for a run again, and refused.  The caller's rows only (row-level security).
CREATE FUNCTION pgtaskpy.run_again_to_come(task_id bigint) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE runs AS (
        SELECT n.id, n.owner, n.state FROM @extschema@.task AS t JOIN @extschema@.task AS n ON n.parent = t.id
        WHERE t.id = task_id AND n.owner = t.owner
          AND (n.attempt > 1 OR (n.repeat = interval '0' AND n.cron IS NULL AND n.input = t.input
                                 AND n.remote IS NOT DISTINCT FROM t.remote))
        UNION ALL
        SELECT n.id, n.owner, n.state FROM runs AS r JOIN @extschema@.task AS n ON n.parent = r.id
        WHERE n.owner = r.owner AND n.attempt > 1)
    SELECT min(r.id) FROM runs AS r WHERE r.state IN ('PLAN', 'TAKE', 'WORK')
$$;

-- Run an ended task again now (FAIL, GONE or STOP: redrive a dead task): a
-- new row with its definition, parent = the task, attempt 1 (so it has its
-- retries again).  A one-off run: it does not repeat and joins no series (the
-- series goes on with its own next run).  Row-level security: only a task the
-- caller sees can be run again, as the caller would insert it.
CREATE FUNCTION @extschema@.task_retry(task_id bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
    retry_id bigint;
BEGIN
    IF task_id IS NULL THEN
        RAISE EXCEPTION 'task_retry needs a task id, not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- One call at a time for a task: a second waits here for the first's commit, and then sees
    -- its run (READ COMMITTED), or fails to serialize (REPEATABLE READ, SERIALIZABLE).  Two calls
    -- side by side each made a run.  (An UPDATE of nothing, not a lock alone: a REPEATABLE READ
    -- call would lock the row after the first's commit and still read its snapshot's children.)
    UPDATE @extschema@.task AS l SET data = l.data WHERE l.id = task_id
    RETURNING l.* INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist or is not yours', task_id
            USING ERRCODE = 'no_data_found', HINT = 'A role sees and runs again only its own tasks.';
    ELSIF t.state NOT IN ('FAIL', 'GONE', 'STOP') THEN
        RAISE EXCEPTION 'task % is %: only a FAIL, GONE or STOP task can be run again', task_id, t.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    retry_id := pgtaskpy.run_again_to_come(task_id);  -- (one run again at a time)
    IF retry_id IS NOT NULL THEN
        RAISE EXCEPTION 'task % is being run again already: task %', task_id, retry_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Wait for task %s (task_wait), or cancel it (task_cancel) first.', retry_id);
    END IF;
    BEGIN
        -- (a copy keeps the task's tz in a session whose zone abbreviations are another list: check_task)
        PERFORM set_config('pgtaskpy.copied_task', t.id::text, true);
        INSERT INTO @extschema@.task (
            parent, active, live, timeout, count, max, delete, drift, header, string, delimiter, escape, quote,
            data, "group", input, "null", remote, save, owner, tz, retry, retry_delay, retry_max, retry_on,
            retry_unsafe, exclusive, target)
        VALUES (
            t.id, t.active - t.paused, t.live, t.timeout, t.count, t.max, t.delete, t.drift, t.header, t.string,
            t.delimiter, t.escape, t.quote, t.data, t."group", t.input, t."null", t.remote, t.save, t.owner, t.tz,
            t.retry, t.retry_delay, t.retry_max, t.retry_on, t.retry_unsafe, t.exclusive, t.target)
        RETURNING id INTO retry_id;
        PERFORM set_config('pgtaskpy.copied_task', '', true);
        PERFORM pgtaskpy.copy_user_columns(t, retry_id);
    EXCEPTION WHEN insufficient_privilege THEN
        -- A task the caller sees (pgtaskpy_admin sees every role's) but may not insert as its owner
        -- (the owner check of task_check): the run's owner would be named in a refusal of its own.
        IF t.owner IS DISTINCT FROM current_user THEN
            RAISE EXCEPTION 'task % does not exist or is not yours', task_id
                USING ERRCODE = 'no_data_found',
                      HINT = 'A role runs again only its own tasks (a member of pgtaskpy_admin: those of roles it is a member of).';
        END IF;
        RAISE;
    END;
    RETURN retry_id;
END
$$;
COMMENT ON FUNCTION @extschema@.task_retry IS 'run an ended (FAIL, GONE or STOP) task again now, as a new task; returns its id';

-- A named series, as pg_cron's cron.schedule(name, schedule, command): the
-- caller's series `key` runs `input` at every match of `cron` in zone `tz`.
-- Creates the series, or gives an existing one the new definition: its
-- waiting run is changed in place (its plan moves to the new expression's
-- first match, unless expression and zone are unchanged); while a run is in
-- progress, the new definition waits beside it (the series' runs never
-- overlap), and that run's end inserts no other.  Unset arguments take the
-- column defaults (settings pg_task.tz, pg_task.max, ...; the group: the key),
-- also when replacing; the other columns of a waiting run keep their values,
-- and those of a run in progress go to the new definition beside it.  Returns
-- the id of the series' waiting run.  Row-level security and `owner =
-- current_user`: a role names only its own series.
CREATE FUNCTION @extschema@.task_schedule(
    key text, cron text, input text, tz text DEFAULT NULL, "group" text DEFAULT NULL,
    max integer DEFAULT NULL, timeout interval DEFAULT NULL, remote text DEFAULT NULL,
    retry integer DEFAULT NULL, retry_delay interval DEFAULT NULL, retry_max interval DEFAULT NULL,
    retry_on text[] DEFAULT NULL, retry_unsafe boolean DEFAULT NULL, "delete" boolean DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    zone text := COALESCE(tz, pgtaskpy.setting_default('tz', 'UTC'::text));
    -- A series runs in a group of its own, named by its key, unless given one: series run side
    -- by side, as pg_cron's jobs do (the runs of one series never overlap anyway).
    group_name text := COALESCE("group", key);
    group_max integer := COALESCE(max, pgtaskpy.setting_default('max', 0));
    statement_timeout interval := COALESCE(timeout, pgtaskpy.setting_default('timeout', interval '0 sec'));
    -- The retry columns' values in the statements below: the argument ($9 to $13), else the
    -- column's default (its setting), on an insert and on a replace alike.
    retries text := concat_ws(', ', CASE WHEN retry IS NULL THEN 'DEFAULT' ELSE '$9' END,
                              CASE WHEN retry_delay IS NULL THEN 'DEFAULT' ELSE '$10' END,
                              CASE WHEN retry_max IS NULL THEN 'DEFAULT' ELSE '$11' END,
                              CASE WHEN retry_on IS NULL THEN 'DEFAULT' ELSE '$12' END,
                              CASE WHEN retry_unsafe IS NULL THEN 'DEFAULT' ELSE '$13' END);
    -- (the same for delete, $14: false keeps the runs that return nothing, the series' history)
    deletes text := CASE WHEN "delete" IS NULL THEN 'DEFAULT' ELSE '$14' END;
    task_id bigint;
    running @extschema@.task;
    stopped @extschema@.task;  -- the series' waiting retry, stopped for the new definition
BEGIN
    IF key IS NULL OR cron IS NULL OR input IS NULL THEN
        RAISE EXCEPTION 'task_schedule needs a key, a cron expression and an input'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM pgtaskpy.lock_series(current_user, key);  -- one change of a series at a time
    -- A retry of the series' last run waiting (attempt > 1) when the series changes what it runs,
    -- where or when (its input, remote, group, cron or tz): the new definition's first run is a
    -- regular run at its first match, with its own retries, not that retry moved there (which
    -- kept its attempt, and so fewer retries, and ran the new input at the old run's retry time).
    -- The retry stops (a user's STOP: no next run follows it), and the new run is inserted below.
    -- The same call again (a deploy's) leaves the retry waiting.  (An exclusive one is refused
    -- below, the stop undone with the call.)
    UPDATE @extschema@.task AS t SET state = 'STOP'
    WHERE t.owner = current_user AND t.key = task_schedule.key AND t.state = 'PLAN' AND t.attempt > 1
      AND (t.cron, t.tz, t.input, t.remote, t."group") IS DISTINCT FROM
          (task_schedule.cron, zone, task_schedule.input, task_schedule.remote, group_name)
    RETURNING t.* INTO stopped;
    EXECUTE 'UPDATE @extschema@.task AS t SET cron = $2, tz = $4, input = $3, "group" = $5, max = $6, timeout = $7,'
            ' remote = $8, repeat = interval ''0'', (retry, retry_delay, retry_max, retry_on, retry_unsafe) = ROW('
            || retries || '), "delete" = ' || deletes
            || ' WHERE t.owner = current_user AND t.key = $1 AND t.state = ''PLAN'' RETURNING t.id'
        INTO task_id
        USING key, cron, input, zone, group_name, group_max, statement_timeout, remote,
              retry, retry_delay, retry_max, retry_on, retry_unsafe, "delete";
    IF task_id IS NULL THEN
        -- A run in progress: the new definition beside it keeps the series' columns this function
        -- has no argument for, as a waiting run's change does (they took the defaults, and every
        -- later run with them, whenever a deploy's call came as a run ran), `exclusive` too.
        SELECT r.* INTO running FROM @extschema@.task AS r
        WHERE r.owner = current_user AND r.key = task_schedule.key AND r.state IN ('TAKE', 'WORK')
        ORDER BY r.id DESC LIMIT 1;
        -- Else the retry stopped above gives them, as a waiting run's change keeps them: the new
        -- run lost the series' data, active, live and count, and an admin's exclusive (a review).
        IF running.id IS NULL AND stopped.id IS NOT NULL THEN
            running := stopped;
        END IF;
        -- An exclusive run, or retry: its series stays as an admin made it, as a waiting run's
        -- change is refused (check_task).  The definition beside it was not exclusive, and the
        -- admin's exclusive left the series, or not, by when the owner's call came (a probe).
        IF running.exclusive AND NOT pg_has_role('pgtaskpy_admin', 'MEMBER') THEN
            RAISE EXCEPTION 'permission denied to change what exclusive task % runs', running.id
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = format(CASE WHEN running.state = 'STOP' THEN 'Series "%s" is exclusive, and its retry %s waits.'
                                           ELSE 'Series "%s" is exclusive, and its run %s is in progress.' END,
                                      key, running.id),
                      HINT = 'An exclusive task holds back every role''s tasks: superusers and members of '
                             'pgtaskpy_admin may change it.';
        END IF;
        EXECUTE 'INSERT INTO @extschema@.task AS t (key, cron, tz, input, "group", max, timeout, remote,'
                ' retry, retry_delay, retry_max, retry_on, retry_unsafe, "delete"'
                || CASE WHEN running.id IS NULL THEN '' ELSE
                   ', active, live, count, drift, header, string, delimiter, escape, quote, data, "null", save, target,'
                   ' exclusive' END
                || ') VALUES ($1, $2, $4, $3, $5, $6, $7, $8, ' || retries || ', ' || deletes
                || CASE WHEN running.id IS NULL THEN '' ELSE
                   ', ($15).active - ($15).paused, ($15).live, ($15).count, ($15).drift, ($15).header, ($15).string,'
                   ' ($15).delimiter, ($15).escape, ($15).quote, ($15).data, ($15)."null", ($15).save, ($15).target,'
                   ' ($15).exclusive' END
                || ') RETURNING t.id'
            INTO task_id
            USING key, cron, input, zone, group_name, group_max, statement_timeout, remote,
                  retry, retry_delay, retry_max, retry_on, retry_unsafe, "delete", running;
    END IF;
    RETURN task_id;
END
$$;
COMMENT ON FUNCTION @extschema@.task_schedule IS 'create or replace the named cron series key; returns its waiting task''s id';

-- The privileged half of task_unschedule: the runs of the series (owner,
-- key) in progress get no next run (cron NULL, repeat 0: what task_cancel's
-- stop_series does).  A run whose row is locked right now (its worker is
-- ending it) is left alone and counted in `busy`: the caller looks again once
-- that end has committed, with the next run it may have inserted.  SECURITY
-- DEFINER, since a task author may not write a running task; so the
-- caller's right to the series is checked here (take_steering_proof).
CREATE FUNCTION pgtaskpy.end_series(series_owner name, series_key text, OUT ended integer, OUT busy integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pgtaskpy.take_steering_proof(NULL, series_owner) THEN
        RAISE EXCEPTION 'permission denied to end the series "%" of role "%"', series_key, series_owner
            USING ERRCODE = 'insufficient_privilege', HINT = 'End it with task_unschedule(key), as that role.';
    END IF;
    -- A claimed run that has not started ends STOP, as task_cancel's stop of one does: its worker
    -- then leaves it.  Given back to wait (its session refused, say), it ran later as a one-off.
    WITH marked AS (
        UPDATE @extschema@.task AS t SET cron = NULL, repeat = interval '0', retry = 0,
            state = CASE WHEN t.state = 'TAKE' THEN 'STOP' ELSE t.state END,
            worker = CASE WHEN t.state = 'TAKE' THEN NULL ELSE t.worker END
        WHERE t.id IN (SELECT r.id FROM @extschema@.task AS r
                       WHERE r.state IN ('TAKE', 'WORK') AND r.owner = series_owner AND r.key = series_key
                         AND (r.cron IS NOT NULL OR r.repeat > interval '0')
                       FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO ended FROM marked;
    busy := (SELECT count(*) FROM @extschema@.task AS r
             WHERE r.state IN ('TAKE', 'WORK') AND r.owner = series_owner AND r.key = series_key
               AND (r.cron IS NOT NULL OR r.repeat > interval '0'));
END
$$;

-- End the caller's series `key`, as pg_cron's cron.unschedule(name): its
-- waiting run becomes STOP, and so does a claimed one that has not started (its
-- worker then leaves it: given back to wait, it ran later as a one-off, a probe);
-- a run in progress finishes and gets no next run.  Returns whether there was
-- such a series.
CREATE FUNCTION @extschema@.task_unschedule(key text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_series boolean := false;
    ended integer;
    busy integer;
    deadline timestamptz := clock_timestamp() + interval '10 s';
BEGIN
    IF key IS NULL THEN
        RETURN false;
    END IF;
    -- Until nothing of the series would go on: a run ending right now may
    -- insert the next run as its end commits, and a waiting run may start
    -- between two of these statements.
    LOOP
        INSERT INTO pgtaskpy.steering_proof (owner) VALUES (current_user);
        SELECT e.ended, e.busy INTO ended, busy FROM pgtaskpy.end_series(current_user, key) AS e;
        UPDATE @extschema@.task AS t SET state = 'STOP'
        WHERE t.owner = current_user AND t.key = task_unschedule.key AND t.state = 'PLAN';
        found_series := found_series OR FOUND OR ended > 0 OR busy > 0;
        EXIT WHEN busy = 0 AND NOT EXISTS (
            SELECT FROM @extschema@.task AS r
            WHERE r.state IN ('TAKE', 'WORK') AND r.owner = current_user AND r.key = task_unschedule.key
              AND (r.cron IS NOT NULL OR r.repeat > interval '0'));
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'task_unschedule: a run of the series "%" is still ending, or another transaction '
                            'holds its row', key
                USING ERRCODE = 'lock_not_available',
                      HINT = 'Try again once the transaction that holds it (SELECT ... FOR SHARE, FOR UPDATE) has ended.';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    RETURN found_series;
END
$$;
COMMENT ON FUNCTION @extschema@.task_unschedule IS 'end the named series key: its waiting or claimed run STOP, a running one gets no next run';

-- The running (TAKE or WORK) tasks the caller may see, for the views: from
-- their index.  Under row-level security the planner may not use the table's
-- statistics for `state` (enum equality is not leakproof) and took a scan of
-- the whole table for them (350 ms for a role owning 500,000 finished rows);
-- the setting holds for this query only.
CREATE FUNCTION pgtaskpy.running_tasks() RETURNS SETOF @extschema@.task
LANGUAGE sql STABLE ROWS 10 SET search_path = pg_catalog, pg_temp SET enable_seqscan = off
AS $$
    SELECT * FROM @extschema@.task AS r WHERE r.state IN ('TAKE', 'WORK')
$$;
REVOKE ALL ON FUNCTION pgtaskpy.running_tasks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtaskpy.running_tasks() TO pgtaskpy_user;

-- The series of repeating tasks (cron or repeat), one row each: a named
-- series by its owner and key, an unnamed one by its current task.  The
-- current task is the waiting run, else the run in progress; next_plan is
-- the waiting run's plan, or what the next run's would be if the run in
-- progress ended now; the last run is the one in progress, else the run
-- before the waiting one (NULL when its row is gone: deleted as it produced
-- nothing, see `delete`).  The view is security_invoker, and the function
-- behind it runs as the caller: each role sees its own series.
--
-- The current tasks are found from the small indexes of waiting and running
-- tasks, as task_stats finds them: with a million finished rows kept, a scan
-- of the table took 180 ms, and now 1 ms.  A function for its settings, as
-- group_stats: under row-level security the planner guesses the indexes'
-- rows badly and compiled the query (JIT) for 30 ms of the caller's 33.
CREATE FUNCTION pgtaskpy.repeating_series()
RETURNS TABLE (
    key text, owner name, id bigint, state @extschema@.state, cron text, repeat interval, tz text,
    next_plan timestamptz, last_state @extschema@.state, last_start timestamptz, last_stop timestamptz,
    "group" text, input text, paused boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp SET jit = off SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT DISTINCT ON (t.owner, t.key, CASE WHEN t.key IS NULL THEN t.id END)
       t.key, t.owner, t.id, t.state, t.cron, t.repeat, t.tz,
       CASE WHEN t.state = 'PLAN' THEN t.plan ELSE pgtaskpy.next_plan(t) END AS next_plan,
       CASE WHEN running.id IS NOT NULL THEN running.state ELSE previous.state END AS last_state,
       CASE WHEN running.id IS NOT NULL THEN running.start ELSE previous.start END AS last_start,
       CASE WHEN running.id IS NOT NULL THEN running.stop ELSE previous.stop END AS last_stop,
       t."group", t.input,
       -- (its group paused by task_pause: task_schedule puts each series in a group of its own)
       EXISTS (SELECT FROM pgtaskpy.group_pause AS p WHERE p.owner = t.owner AND p."group" = t."group") AS paused
FROM @extschema@.task AS t
LEFT JOIN LATERAL (
    SELECT r.id, r.state, r.start, r.stop FROM @extschema@.task AS r
    WHERE r.state IN ('TAKE', 'WORK')
      AND (r.id = t.id OR (t.key IS NOT NULL AND r.owner = t.owner AND r.key = t.key))
    ORDER BY r.id DESC LIMIT 1) AS running ON true
LEFT JOIN @extschema@.task AS previous
    ON previous.id = t.parent AND previous.owner = t.owner AND previous.key IS NOT DISTINCT FROM t.key
   AND previous.state IN ('DONE', 'FAIL', 'GONE', 'STOP')
   AND (previous.cron IS NOT NULL OR previous.repeat > interval '0' OR previous.key IS NOT NULL)
WHERE t.id IN (SELECT w.id FROM @extschema@.task AS w
               WHERE w.state = 'PLAN' AND w.waiting_for = 0 AND (w.cron IS NOT NULL OR w.repeat > interval '0')
               UNION ALL
               SELECT b.id FROM @extschema@.task AS b
               WHERE b.state = 'PLAN' AND b.waiting_for > 0 AND (b.cron IS NOT NULL OR b.repeat > interval '0')
               UNION ALL
               SELECT r.id FROM pgtaskpy.running_tasks() AS r
               WHERE r.cron IS NOT NULL OR r.repeat > interval '0')
ORDER BY t.owner, t.key, CASE WHEN t.key IS NULL THEN t.id END, t.state = 'PLAN' DESC, t.id DESC;
END
$$;
REVOKE ALL ON FUNCTION pgtaskpy.repeating_series() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtaskpy.repeating_series() TO pgtaskpy_user;

CREATE OR REPLACE VIEW @extschema@.task_series WITH (security_invoker = true) AS
SELECT * FROM pgtaskpy.repeating_series();
COMMENT ON VIEW @extschema@.task_series IS 'the caller''s repeating series (cron or repeat): next plan and last run';

-- Task authors get them through pgtaskpy_user (and PUBLIC, unless a DBA revokes it).
GRANT EXECUTE ON FUNCTION
    @extschema@.task_enqueue(text, timestamptz, text, integer, interval, interval, text, text,
                             bigint[], text, text, boolean, boolean, integer, interval, interval, text[], boolean),
    @extschema@.task_chain(text[], text, boolean, integer, interval, interval, text[], boolean),
    @extschema@.task_wait(bigint, interval), @extschema@.task_cancel(bigint, boolean), @extschema@.task_retry(bigint),
    @extschema@.task_schedule(text, text, text, text, text, integer, interval, text,
                              integer, interval, interval, text[], boolean, boolean),
    @extschema@.task_unschedule(text) TO pgtaskpy_user;
GRANT SELECT ON @extschema@.task_series TO pgtaskpy_user;

-- Housekeeping: proofs of ended transactions that no privileged half took (a
-- role may insert its own, millions at once): a few thousand a call, as the
-- launcher's turn that calls it holds the scheduling lock.
CREATE FUNCTION pgtaskpy.delete_stale_steering_proofs() RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM pgtaskpy.steering_proof AS p
    WHERE p.ctid = ANY (ARRAY(SELECT s.ctid FROM pgtaskpy.steering_proof AS s
                              WHERE s.xact < pg_snapshot_xmin(pg_current_snapshot()) LIMIT 5000))
$$;

REVOKE ALL ON FUNCTION pgtaskpy.take_steering_proof(bigint, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.held_by_its_session(@extschema@.task, xid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.delete_stale_steering_proofs() FROM PUBLIC;
