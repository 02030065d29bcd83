-- The scheduling rules, written once: which tasks may start now, how a task
-- ends (and what follows it), and what happens to tasks whose backend died.
-- The launcher only calls these through pgtaskpy.dispatch().
--
-- Task rows are locked FOR NO KEY UPDATE before they are updated (the lock an
-- UPDATE takes itself), FOR UPDATE only before they are deleted: an
-- application's table that references tasks by a foreign key locks each one
-- FOR KEY SHARE while its insert is open, which holds back no claim, start or
-- end (test_scheduling.py), and only a DELETE must wait for.

-- The names other processes see: the NOTIFY channel launchers LISTEN on, and
-- the application_name of each kind of backend (how recovery and workers tell
-- a launcher, a worker and a task's session apart in pg_stat_activity).
-- IMMUTABLE plain SQL: folded into its callers' plans as a constant.
CREATE FUNCTION pgtaskpy.name_of(what text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE what
        WHEN 'channel' THEN 'pg_task_py'
        WHEN 'done channel' THEN 'pg_task_py_done'
        WHEN 'launcher' THEN 'pg_task_py launcher'
        WHEN 'stopping launcher' THEN 'pg_task_py launcher (stopping)'
        WHEN 'worker' THEN 'pg_task_py worker'
        WHEN 'task' THEN 'pg_task_py task'
    END
$$;

-- Wake the launchers (they LISTEN on the channel): a task was inserted or
-- re-planned, or a slot of a group freed.  Identical notifications of one
-- transaction are delivered once.  Not with pg_task_py.wake off: a
-- transaction that NOTIFYs cannot PREPARE TRANSACTION (two-phase commit), and
-- the launchers find its tasks at their next look, within a second.  (The
-- scheduler's own sessions set it on: SCHEDULER_SETTINGS, dispatch.py.)
CREATE FUNCTION pgtaskpy.wake_launchers() RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.pg_notify(pgtaskpy.name_of('channel'), '')
      WHERE pg_catalog.lower(pg_catalog.current_setting('pg_task_py.wake', true)) IS DISTINCT FROM 'off'
        AND pg_catalog.lower(pg_catalog.current_setting('pg_task_py.wake', true)) IS DISTINCT FROM 'false' $$;

-- The lock that serializes the scheduling of a database: every launcher takes
-- it first thing in its turn, before any row, so that no turn holds rows while
-- it waits for the lock (which would deadlock with workers taking their rows).
-- A lock on a view no other role may lock (sql/created_once/26_locks.sql),
-- not an advisory lock, which any role may take and hold.  Neither mode is
-- written to WAL.  PL/pgSQL, whose LOCK runs from a plan kept for the
-- backend's life (a plain SQL function's body is parsed again on every call).
CREATE FUNCTION pgtaskpy.lock_scheduling() RETURNS void
LANGUAGE plpgsql
AS $$ BEGIN LOCK TABLE ONLY pgtaskpy.scheduling_lock IN EXCLUSIVE MODE; END $$;

-- The same lock, shared: workers handing their group's slot on to its next
-- task (claim_next_task) do not wait for each other, only for launchers.
CREATE FUNCTION pgtaskpy.lock_scheduling_shared() RETURNS void
LANGUAGE plpgsql
AS $$ BEGIN LOCK TABLE ONLY pgtaskpy.scheduling_lock IN ROW SHARE MODE; END $$;

-- Serializes the claims of one owner's tasks by workers (only taken when the
-- owner has a pg_task_py.role_running_limit, whose count spans groups); a
-- launcher's claim holds the scheduling lock, which excludes them all.
-- Tried, never waited for: a worker that does not get it leaves the group's
-- next task to a launcher, so that a role holding this advisory key (any role
-- may take one) holds up no claim.
CREATE FUNCTION pgtaskpy.try_lock_owner(owner name) RETURNS boolean
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_try_advisory_xact_lock(
          '@extschema@.task'::pg_catalog.regclass::pg_catalog.oid::pg_catalog.int4,
          pg_catalog.hashtext(owner) OPERATOR(pg_catalog.|) 1) $$;

-- Serializes the changes of one named series (owner, key): task_schedule,
-- and the end of one of its runs, which looks whether the series was
-- replaced meanwhile.  Hashed to keys 2 mod 4, apart from the owners' (odd).
-- An advisory lock, which a role that knows the series' owner and key can
-- take and hold, holding up that series (README, Limits): a row of a table
-- would serialize a user's open transaction of task_schedule with the ends of
-- every series that shares its row.
CREATE FUNCTION pgtaskpy.lock_series(owner name, key text) RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_advisory_xact_lock(
          '@extschema@.task'::pg_catalog.regclass::pg_catalog.oid::pg_catalog.int4,
          (pg_catalog.hashtext(owner::pg_catalog.text OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) key)
           OPERATOR(pg_catalog.&) -4) OPERATOR(pg_catalog.|) 2) $$;

-- pg_task's max, the one rule of who may start: a group with `running` tasks
-- running has room for its rank-th waiting task (rank 1: the next) while at
-- most max + 1 run at once; negative max: one at a time (finish_task makes
-- the pause).  Plain SQL without SET, so the planner inlines it.
CREATE FUNCTION pgtaskpy.group_has_room(max integer, running bigint, rank bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN max >= 0 THEN rank + running <= max::bigint + 1 ELSE rank = 1 AND running = 0 END $$;

-- pg_task_py.role_running_limit: an owner with `running` tasks running has
-- room for its rank-th waiting task (cap NULL: no limit).
CREATE FUNCTION pgtaskpy.owner_has_room(cap integer, running bigint, rank bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT cap IS NULL OR rank + running <= cap $$;

-- Claims a DBA's trigger on task made into no claim, its BEFORE UPDATE
-- returning NULL (the row skipped) or another state or worker: those tasks,
-- first in the order, were chosen again at every turn, never claimed, and
-- held back the rest, the log silent.  They end FAIL (if still waiting).
CREATE FUNCTION pgtaskpy.fail_skipped_claims(skipped bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    one bigint;
BEGIN
    FOREACH one IN ARRAY skipped LOOP
        RAISE WARNING 'pg_task_py: could not claim task %: a trigger on task made its claim no claim', one;
    END LOOP;
    PERFORM pgtaskpy.fail_waiting_tasks(skipped, 'ERROR:  could not claim the task: a trigger on task made its claim'
                                                 ' no claim (returned NULL, or another state or worker)', NULL);
END
$$;

-- Whether an error's SQLSTATE says the server is in trouble (a serialization
-- failure or deadlock, no memory or disk, a lock not available, an operator's
-- intervention), not the row it was writing: the scheduler's one-by-one ways
-- around a refused row (take_claimed, delete_finished) fail their turn on
-- such an error rather than give up on the row.
CREATE FUNCTION pgtaskpy.server_trouble(error_sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.left(error_sqlstate, 2) OPERATOR(pg_catalog.=) ANY ('{40,53,54,55,57,58,XX}'::text[]) $$;

-- PLAN -> TAKE for `claimer`: those of these tasks still waiting and not held
-- by a client (SKIP LOCKED: see claim_due_tasks), in one statement; their ids.
-- A claim that raises (a DBA's trigger on task refusing one task's change to
-- TAKE) fails that task alone, "could not claim the task: ...", and the others
-- are claimed one by one: the one statement's error failed every launcher
-- turn, and no task of the database started any more.  An error of a kind
-- that says nothing about the task (no memory, a serialization failure)
-- fails the turn, as before, and no task.
CREATE FUNCTION pgtaskpy.take_claimed(ids bigint[], claimer integer) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    locked bigint[];
    taken bigint[];
    one bigint;
    refusal text;
    refusal_sqlstate text;
BEGIN
    BEGIN
        locked := ARRAY(SELECT l.id FROM @extschema@.task AS l WHERE l.id = ANY (ids) AND l.state = 'PLAN'
                        FOR NO KEY UPDATE SKIP LOCKED);
        WITH claimed AS (
            UPDATE @extschema@.task AS t
            SET state = 'TAKE', worker = claimer
            WHERE t.id = ANY (locked) AND t.state = 'PLAN'
            RETURNING t.id, t.state, t.worker
        )
        SELECT array_agg(c.id) INTO taken FROM claimed AS c WHERE c.state = 'TAKE' AND c.worker = claimer;
        taken := coalesce(taken, '{}');
        IF cardinality(taken) < cardinality(locked) THEN
            PERFORM pgtaskpy.fail_skipped_claims(ARRAY(SELECT unnest(locked) EXCEPT SELECT unnest(taken)));
        END IF;
        RETURN taken;
    EXCEPTION WHEN OTHERS THEN
        taken := '{}';  -- (the statement is undone: one by one below)
    END;
    FOREACH one IN ARRAY ids LOOP
        BEGIN
            UPDATE @extschema@.task AS t
            SET state = 'TAKE', worker = claimer
            WHERE t.id = (SELECT l.id FROM @extschema@.task AS l WHERE l.id = one AND l.state = 'PLAN'
                          FOR NO KEY UPDATE SKIP LOCKED)
              AND t.state = 'PLAN';
            IF FOUND THEN
                taken := taken || one;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS refusal = MESSAGE_TEXT, refusal_sqlstate = RETURNED_SQLSTATE;
            IF pgtaskpy.server_trouble(refusal_sqlstate) THEN
                RAISE;  -- (not the task's trouble: the turn fails, and the next one claims it)
            END IF;
            RAISE WARNING 'pg_task_py: could not claim task %: %', one, refusal;
            PERFORM pgtaskpy.fail_waiting_tasks(ARRAY[one], 'ERROR:  could not claim the task: ' || refusal,
                                                refusal_sqlstate);
        END;
    END LOOP;
    RETURN taken;
END
$$;

-- Claim due tasks: PLAN -> TAKE, as many as their groups have room for,
-- higher max first, then lower id (pg_task's priority).  Claims of all
-- launchers of a database are serialized by a transaction lock, so two
-- launchers never both fill the last slot of a group.
--
-- Its cost does not grow with the backlog.  The first pass reads waiting
-- tasks in priority order (due or not, so that the read stays short) until
-- the due ones among them span claim_limit + 1 groups (one to spare for a
-- full group), or 4 claim_limit + 32 tasks, or 32 that are not due (tasks
-- planned for later that come first in the order), and claims only from that
-- prefix of the order: what it claims is what a look at every group would
-- have claimed first.  Only when that does not fill claim_limit and tasks
-- were left unread does the second pass look at every group with due tasks:
-- those of the due tasks when fewer than 1,000 are due, else one index probe
-- a group with waiting tasks (a skip scan).
CREATE FUNCTION pgtaskpy.claim_due_tasks(claim_limit integer, claimer integer, held bigint[] DEFAULT '{}')
RETURNS TABLE (id bigint, hash integer, owner name, remote text, reuse boolean)
-- A generic plan, made once per backend: planning this query again on every
-- claim costs more than running it.  enable_sort off: the reads in priority
-- order come from the indexes in that order alone.  Planned on a table whose
-- indexes were built empty and never analyzed since a bulk load, every index
-- looks empty on PostgreSQL before 15.20, and the prefix was read as all the
-- waiting tasks sorted (12 ms a claim with 100,000 planned for tomorrow).
-- jit off wherever sorts are: the cost a sort that must be then gets passes
-- any jit_above_cost, and a caller other than the scheduler (whose sessions
-- have no JIT: dispatch.py) waited 0.5 s a claim for its compiling.
-- enable_incremental_sort off too: a group's scan for due tasks could read the
-- (hash, plan) index, in order of group alone, and sort each group's due tasks
-- whole (a backlog of 100,000 in one group, for each claim).
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
    SET enable_sort = off SET enable_incremental_sort = off SET jit = off
AS $$
DECLARE
    due_groups integer[];
    due_counts integer[];  -- the first pass: due tasks of each group in the prefix
    last_max integer;  -- the first pass: the last task of the prefix
    last_id bigint;
    whole boolean := false;  -- the first pass read every waiting task
    prefix_most integer;
    task record;
    read integer := 0;
    not_due integer := 0;  -- the first pass: tasks read that are not due
    probed bigint;
    locked boolean := false;
    gate text;  -- pgtaskpy.exclusive_gate()
    claimed integer := 0;
    chosen_ids bigint[];
    taken bigint[];
    room_returns timestamptz;  -- the earliest a group left for its rate limit has room again
    n integer;
    -- Whether any group is paused, any rate-limited: when none is (the common case), the
    -- claim calls neither check for the tasks it looks at.
    pauses boolean;
    limits boolean;
    caps boolean;  -- and whether any role has a running limit
    spaced_until timestamptz;  -- and the end of the first pause of a group with a negative max (pause_group)
    -- The owners' groups whose rate limit has no room now, and the owners at their running
    -- limit: left out of each group's scan for its first due tasks, which they filled, and
    -- another role's tasks of the group waited behind theirs for as long as the limit lasted.
    full_owners name[] := '{}';
    full_groups text[] := '{}';
    capped name[] := '{}';
    paused_owners name[] := '{}';  -- the owners with a paused group: only their tasks' pauses are looked up
    held_any boolean := false;  -- any of those, or a pause
    -- A row a client holds, chosen and skipped by take_claimed (or refused by a trigger): the
    -- claim looks again, this time past rows that another transaction holds (held_probed).
    held_seen boolean := false;
    held_probed boolean := false;
BEGIN
    -- Nothing due: one probe of the plan index.  The earliest plan, not EXISTS (... plan <= now()):
    -- an EXISTS names no order, and planned where every index looks empty (above) it read
    -- through the priority index, past every task planned ahead (12 ms a turn over 100,000).
    IF claim_limit <= 0
       OR (SELECT t.plan <= now() FROM @extschema@.task AS t WHERE t.state = 'PLAN' AND t.waiting_for = 0
           ORDER BY t.plan LIMIT 1) IS NOT TRUE THEN
        RETURN;
    END IF;
    FOR pass IN 1..3 LOOP  -- (3: the second again, past held rows, when it met one first)
        IF pass = 1 THEN
            CONTINUE WHEN claim_limit > 1000;  -- (claims in every group with room: the second pass)
            prefix_most := 4 * claim_limit + 32;
            due_groups := '{}';
            due_counts := '{}';
            whole := true;
            FOR task IN
                SELECT t.hash, t.max, t.id, (t.plan <= now() AND t.plan + t.active > now()) IS TRUE AS due
                FROM @extschema@.task AS t WHERE t.state = 'PLAN' AND t.waiting_for = 0
                ORDER BY t.max DESC, t.id LIMIT prefix_most
            LOOP
                read := read + 1;
                IF task.due THEN
                    n := array_position(due_groups, task.hash);
                    IF n IS NOT NULL THEN
                        due_counts[n] := due_counts[n] + 1;
                    ELSIF cardinality(due_groups) > claim_limit THEN
                        whole := false;
                        EXIT;
                    ELSE
                        due_groups := due_groups || task.hash;
                        due_counts := due_counts || 1;
                    END IF;
                ELSE
                    -- Tasks planned ahead first in the order (a bulk planned for tomorrow):
                    -- the second pass finds the due ones from the plan index.  Reading on
                    -- through them cost 3-6 ms a claim at the launcher's claim_limit.
                    not_due := not_due + 1;
                    IF not_due > 32 THEN
                        whole := false;
                        EXIT;
                    END IF;
                END IF;
                last_max := task.max;
                last_id := task.id;
            END LOOP;
            whole := whole AND read < prefix_most;
            CONTINUE WHEN cardinality(due_groups) = 0;
        ELSE
            -- (every waiting task was read: nothing is left to look at, unless past held rows)
            EXIT WHEN whole AND NOT held_seen OR pass = 3 AND (held_probed OR NOT held_seen);
            held_probed := held_seen;
            due_counts := NULL;
            last_id := NULL;
            -- The groups with due tasks.  Few due tasks: read them from the plan
            -- index, so that tasks planned ahead cost nothing.  Many: one index
            -- probe a group with waiting tasks.
            SELECT array_agg(DISTINCT d.hash), count(*) INTO due_groups, probed
            FROM (SELECT t.hash FROM @extschema@.task AS t WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.plan <= now()
                  ORDER BY t.plan LIMIT 1000) AS d;
            IF probed >= 1000 THEN
                WITH RECURSIVE waiting_groups AS (
                    (SELECT t.hash FROM @extschema@.task AS t WHERE t.state = 'PLAN' AND t.waiting_for = 0 ORDER BY t.hash LIMIT 1)
                    UNION ALL
                    SELECT (SELECT t.hash FROM @extschema@.task AS t
                            WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.hash > w.hash ORDER BY t.hash LIMIT 1)
                    FROM waiting_groups AS w WHERE w.hash IS NOT NULL
                )
                SELECT array_agg(w.hash) INTO due_groups FROM waiting_groups AS w
                WHERE w.hash IS NOT NULL
                  AND EXISTS (SELECT FROM @extschema@.task AS e WHERE e.state = 'PLAN' AND e.waiting_for = 0 AND e.hash = w.hash
                              AND e.plan <= now());
            END IF;
            -- Nothing due left (the first pass claimed it, as with tasks planned
            -- ahead behind it): no claim to plan and run for no group.
            EXIT WHEN coalesce(cardinality(due_groups), 0) = 0;
        END IF;
        -- Every group full, as while workers go on with a busy backlog: no lock.
        -- Taking it would stall each of those workers for this turn, and a slot
        -- that frees later wakes the launchers (finish_task, wake_launchers).
        CONTINUE WHEN NOT locked
            AND EXISTS (SELECT FROM @extschema@.task AS r WHERE r.state IN ('TAKE', 'WORK'))
            AND NOT EXISTS (
                SELECT FROM unnest(due_groups) AS w(hash)
                CROSS JOIN LATERAL (SELECT f.max FROM @extschema@.task AS f WHERE f.state = 'PLAN' AND f.waiting_for = 0
                                    AND f.hash >= w.hash AND f.hash <= w.hash
                                    ORDER BY f.hash, f.max DESC, f.id LIMIT 1) AS first
                CROSS JOIN LATERAL (SELECT count(*) AS n FROM @extschema@.task AS r
                                    WHERE r.state IN ('TAKE', 'WORK') AND r.hash = w.hash) AS g
                WHERE pgtaskpy.group_has_room(first.max, g.n, 1));
        IF NOT locked THEN
            -- Before any row is locked; the claim below reads the table afresh.
            PERFORM pgtaskpy.lock_scheduling();
            locked := true;
            -- While an exclusive task is due or runs, it alone may be claimed
            -- (sql/replayed/47_workflows.sql); a due one that a client holds is not due here.
            -- (Apart: in one condition, NULL = 'due' AND f() called f, which read every waiting
            -- task, at every claim of a database with no exclusive task.)
            gate := pgtaskpy.exclusive_gate();
            IF gate = 'due' THEN
                gate := CASE WHEN pgtaskpy.due_exclusive_task_unheld(clock_timestamp()) THEN 'due' END;
            END IF;
            IF gate IS NOT NULL THEN
                RETURN QUERY SELECT * FROM pgtaskpy.claim_exclusive_task(claimer);
                RETURN;
            END IF;
            -- Read under the lock: a role's first pause, rate limit or running limit committed
            -- while this claim waited for it (another launcher's turn) was not seen, and a claim
            -- took ten of its tasks under a limit of one (a probe).  One statement: each costs
            -- 10-50 us on a lone task's way to its start.
            SELECT EXISTS (SELECT FROM pgtaskpy.group_pause), EXISTS (SELECT FROM pgtaskpy.group_limit),
                   pgtaskpy.role_running_limits_set(),
                   (SELECT min(s.until) FROM pgtaskpy.group_spacing AS s WHERE s.until > now())
            INTO pauses, limits, caps, spaced_until;
            IF spaced_until IS NOT NULL THEN
                -- (a group with a negative max in its pause: the launcher's turn ends as the first
                -- pause does, as for a rate limit's room, and claims the tasks it held back then)
                PERFORM pgtaskpy.note_rate_room_returns(spaced_until);
            END IF;
            IF limits THEN
                SELECT coalesce(array_agg(f.owner), '{}'), coalesce(array_agg(f."group"), '{}'),
                       min(pgtaskpy.rate_room_returns(f.owner, f."group"))
                INTO full_owners, full_groups, room_returns
                FROM pgtaskpy.group_limit AS f WHERE pgtaskpy.rate_room(f.owner, f."group") <= 0;
            END IF;
            IF caps THEN
                capped := pgtaskpy.owners_at_running_limit();
            END IF;
            IF pauses THEN
                -- (one probe of the pauses' key an owner: any role may write pauses of its own by
                -- the hundred thousand, and reading them all cost every claim)
                paused_owners := ARRAY(
                    WITH RECURSIVE owners AS (
                        (SELECT p.owner FROM pgtaskpy.group_pause AS p ORDER BY p.owner LIMIT 1)
                        UNION ALL
                        SELECT (SELECT p.owner FROM pgtaskpy.group_pause AS p WHERE p.owner > o.owner
                                ORDER BY p.owner LIMIT 1)
                        FROM owners AS o WHERE o.owner IS NOT NULL)
                    SELECT o.owner FROM owners AS o WHERE o.owner IS NOT NULL);
            END IF;
            held_any := pauses OR cardinality(full_owners) > 0 OR cardinality(capped) > 0;
        END IF;
        WITH running AS MATERIALIZED (
            SELECT t.hash, t.owner FROM @extschema@.task AS t WHERE t.state IN ('TAKE', 'WORK')
        ), due AS MATERIALIZED (
            -- Per group, the first due tasks in priority order: no more than can
            -- start (the group's highest max + 1), than may be claimed, nor (first
            -- pass) than the prefix holds.
            SELECT c.id, c.hash, c.max, c.owner,
                   row_number() OVER (PARTITION BY c.hash ORDER BY c.max DESC, c.id) AS rank,
                   row_number() OVER (PARTITION BY c.owner ORDER BY c.max DESC, c.id) AS owner_rank,
                   c."group", row_number() OVER (PARTITION BY c.owner, c."group" ORDER BY c.max DESC, c.id) AS group_rank
            FROM unnest(due_groups, due_counts) AS w(hash, n)
            -- The group's highest max + 1, looked up only where more than one of its tasks may
            -- be read: a plan made without statistics may look it up through another index than
            -- the group's, as below.
            CROSS JOIN LATERAL (
                SELECT CASE WHEN w.n IS NULL OR w.n > 1 THEN
                           greatest(1, (SELECT f.max FROM @extschema@.task AS f WHERE f.state = 'PLAN' AND f.waiting_for = 0
                                        AND f.hash >= w.hash AND f.hash <= w.hash
                                        ORDER BY f.hash, f.max DESC, f.id LIMIT 1)::bigint + 1) END AS n
            ) AS places
            CROSS JOIN LATERAL (
                -- "(...) IS TRUE": no index on plan may serve this scan, only the
                -- one in priority order, whatever the table's statistics say.
                -- Its group as a range, and first in ORDER BY: then that order is
                -- the (hash, max DESC, id) index's alone.  With "t.hash = w.hash" the
                -- group drops out of the order, and a plan made while the table
                -- held few waiting tasks (or had no statistics, as after a burst
                -- into a new table) may read the index of all groups in priority
                -- order, filtered by group: every group's scan reads the tasks of
                -- the groups before it, and a claim of 1,000 tasks in 1,000 groups
                -- took 191 ms, not 21 (bench/RESULTS.md).
                -- "t.plan <= now()" besides: that index checks it on each entry (its
                -- last column), so that tasks of the group planned ahead of its due
                -- ones cost an entry each, not a row each: 100,000 of them, 2 ms, not
                -- 30.  The order still comes from that index alone (sorts off).
                -- The tasks of a role its own pause, rate limit or running limit holds back are
                -- left out as the group's scan reads them, not after its first places were taken:
                -- another role's task of the group waited behind them as long as the limit lasted,
                -- and behind 65 of them for good when they were left out after 64 more rows (a
                -- probe: a role's pause of the default group held back every role's tasks there).
                -- The scan reads past them: README's Limits gives what that costs.
                -- The first pass reads no further than its prefix: the group's due tasks there and
                -- as many more as the prefix held tasks not due.  With the prefix's bound as a
                -- filter alone, the scan read the rest of the group whenever fewer tasks than its
                -- limit passed (held ones filling the prefix; a series' run while another runs):
                -- 7 ms behind 20,000.
                SELECT t.id, t.hash, t.max, t.owner, t."group"
                FROM (
                    SELECT r.id, r.hash, r.max, r.owner, r."group", r.plan, r.active, r.exclusive, r.key, r.xmax
                    FROM @extschema@.task AS r
                    WHERE r.state = 'PLAN' AND r.waiting_for = 0 AND r.hash >= w.hash AND r.hash <= w.hash
                      AND r.plan <= now()
                    ORDER BY r.hash, r.max DESC, r.id
                    LIMIT w.n + not_due  -- (NULL, all, in the second pass)
                ) AS t
                WHERE (t.plan <= now() AND t.plan + t.active > now()) IS TRUE
                  AND (last_id IS NULL OR t.max > last_max OR (t.max = last_max AND t.id <= last_id))
                  AND NOT t.exclusive  -- (claimed alone: claim_exclusive_task)
                  AND t.id <> ALL (coalesce(held, '{}'))  -- (refused a session lately: dispatch.py, HOLD_POSTPONED)
                  -- A task of a named series starts only while no other run of
                  -- the series (owner, key) is claimed or running: its runs never
                  -- overlap, also when task_schedule replaced the waiting run
                  -- while one ran.  (The same in claim_next_task.)
                  AND (t.key IS NULL OR NOT EXISTS (
                           SELECT FROM @extschema@.task AS k
                           WHERE k.state IN ('TAKE', 'WORK') AND k.owner = t.owner AND k.key = t.key))
                  -- (one that came due during its group's pause: pause_group)
                  AND NOT (spaced_until IS NOT NULL AND t.max < 0 AND EXISTS (
                               SELECT FROM pgtaskpy.group_spacing AS s
                               WHERE s.owner = t.owner AND s.hash = t.hash AND s.until > now()))
                  AND NOT (held_any AND (
                           t.owner = ANY (capped)
                           -- (the pause's key probed in the statement, not group_paused's call a
                           -- task: 3.5 us each, 70 ms a claim behind 20,000 paused tasks; not a
                           -- hash of every pause, which a role's 300,000 rows made every claim's)
                           OR (t.owner = ANY (paused_owners) AND EXISTS (
                                   SELECT FROM pgtaskpy.group_pause AS p
                                   WHERE p.owner = t.owner AND p."group" = t."group"))
                           OR (t.owner = ANY (full_owners) AND EXISTS (  -- (rate limits: 70_operating.sql)
                                   SELECT FROM unnest(full_owners, full_groups) AS f(owner, "group")
                                   WHERE f.owner = t.owner AND f."group" = t."group"))))
                  -- Once a chosen row was held (SELECT ... FOR UPDATE, an open UPDATE), not a row a
                  -- client holds: ranked here, it took its group's first place, take_claimed skipped
                  -- it, and no other task of the group started while the client held it, any role's
                  -- (a probe: one author's lock held back the default group of every role).  A row
                  -- no one ever locked (xmax 0) needs no probe; the probe's lock is the claim's own,
                  -- till the turn commits.  Only then: probed at every claim, the next task of a full
                  -- group was locked at every turn, and a client's NOWAIT on it refused (a review).
                  AND (NOT held_probed OR t.xmax = '0'::xid
                       OR EXISTS (SELECT FROM @extschema@.task AS h WHERE h.id = t.id FOR NO KEY UPDATE SKIP LOCKED))
                ORDER BY t.hash, t.max DESC, t.id
                LIMIT least(claim_limit - claimed, w.n, places.n)
            ) AS c
        ), owners AS MATERIALIZED (  -- one settings lookup an owner, not one a row
            SELECT o.owner, CASE WHEN caps THEN pgtaskpy.role_running_limit(o.owner) END AS cap,
                   (SELECT count(*) FROM running AS r WHERE r.owner = o.owner) AS n
            FROM (SELECT DISTINCT due.owner FROM due) AS o
        ), running_groups AS MATERIALIZED (
            -- The running tasks of each group, as two arrays looked up by position: a count
            -- over `running` for each due task read all of it each time (a claim of 1,000
            -- tasks beside 1,000 running ones: 65 ms, not 22), and a join may be planned the
            -- same way, for the few rows a table with few running tasks suggests.
            SELECT coalesce(array_agg(g.hash), '{}') AS hashes, coalesce(array_agg(g.n), '{}') AS counts
            FROM (SELECT r.hash, count(*) AS n FROM running AS r GROUP BY r.hash) AS g
        ), rate_rooms AS MATERIALIZED (  -- the rate-limited groups' rooms, counted once a group (70_operating.sql)
            SELECT l.owner, l."group", pgtaskpy.rate_room(l.owner, l."group") AS room
            FROM (SELECT DISTINCT due.owner, due."group" FROM due) AS l
            WHERE limits
        ), chosen AS (
            SELECT d.id
            FROM due AS d
            JOIN owners AS o ON o.owner = d.owner
            CROSS JOIN running_groups AS g
            LEFT JOIN rate_rooms AS r ON r.owner = d.owner AND r."group" = d."group"
            WHERE pgtaskpy.group_has_room(d.max, coalesce(g.counts[array_position(g.hashes, d.hash)], 0), d.rank)
              AND pgtaskpy.owner_has_room(o.cap, o.n, d.owner_rank)
              AND (r.room IS NULL OR d.group_rank <= r.room)
            ORDER BY d.max DESC, d.id
            LIMIT claim_limit - claimed
        )
        -- By id = ANY (take_claimed): a join to chosen, planned for the one row a
        -- table with few waiting tasks suggests, read the table once for each
        -- claimed task.  SKIP LOCKED there: a row a client holds (SELECT ... FOR
        -- UPDATE, an open transaction's UPDATE or task_schedule) waits for its next
        -- turn; the claim waiting for it held the scheduling lock, and every role's
        -- tasks in every group waited with it.
        SELECT ARRAY(SELECT c.id FROM chosen AS c),
               least(room_returns,
                     (SELECT min(pgtaskpy.rate_room_returns(r.owner, r."group")) FROM rate_rooms AS r WHERE r.room <= 0))
        INTO chosen_ids, room_returns;
        IF room_returns IS NOT NULL THEN
            PERFORM pgtaskpy.note_rate_room_returns(room_returns);
        END IF;
        taken := pgtaskpy.take_claimed(chosen_ids, claimer);
        held_seen := held_seen OR cardinality(taken) < cardinality(chosen_ids);
        RETURN QUERY
        SELECT t.id, t.hash, t.owner, t.remote, (t.count > 0 OR t.live > interval '0') AS reuse
        FROM @extschema@.task AS t WHERE t.id = ANY (taken);
        claimed := claimed + cardinality(taken);
        EXIT WHEN claimed >= claim_limit;
    END LOOP;
END
$$;

-- The next task of a group, claimed by the worker that has just ended one of
-- the group's tasks, in the same transaction: the worker goes on with the
-- group, and its reusable session, without a round trip through the launcher,
-- as pg_task's workers do.  The rules are claim_due_tasks'.  Marks the task
-- TAKE by the calling backend, or WORK at once in the session the worker
-- offers (session_pid) when the task is like the one that session is ready
-- for (same owner, remote, count and live) and, for a session started with a
-- task's settings (session_task), is that task; and returns the row.  Marked in the
-- statement that locked it: a lock and an update in two statements of
-- PL/Python, each its own subtransaction, would make a MultiXact of every
-- task.  NULL when the group has nothing due or no room, or when the launcher that
-- started the worker is stopping or gone (then the launcher decides; launcher
-- NULL: the caller looked lately, as that look costs more than the rest).
--
-- Workers of one group claim side by side: each hands on the slot of the task
-- it ends, and sees the tasks the others are ending still running (not yet
-- committed) or already replaced (committed), so the group never runs more
-- than its max allows; SKIP LOCKED keeps them off each other's candidate.
-- Whether the launcher whose session's pid is `launcher` still gives out work:
-- not gone, nor stopping (it drops the accepting name first).  A worker goes on
-- with its group's tasks (claim_next_task), and a burst's worker starts a task
-- whose row a client held (run_batch.py), only while it does.
CREATE FUNCTION pgtaskpy.launcher_accepts(launcher integer) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT FROM pg_stat_get_activity(launcher) AS a
                     WHERE a.application_name = pgtaskpy.name_of('launcher')) $$;

CREATE FUNCTION pgtaskpy.claim_next_task(
    group_hash integer, launcher integer,
    session_pid integer DEFAULT NULL, session_owner name DEFAULT NULL, session_remote text DEFAULT NULL,
    session_count integer DEFAULT NULL, session_live interval DEFAULT NULL, session_task bigint DEFAULT NULL)
RETURNS @extschema@.task
-- enable_sort off, and the group as a range first in ORDER BY: that order is the
-- (hash, max DESC, id) index's alone (see claim_due_tasks), even when the
-- statistics of a table just filled say "one row".  Incremental sorts off too.
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_sort = off SET enable_incremental_sort = off
    SET jit = off
AS $$
DECLARE
    claimed @extschema@.task;
    running bigint;
    cap integer;
    -- Due by the clock, not by the transaction's start: a chain's next step, released by the end
    -- of the step before in this transaction, is planned at the clock's moment of its release
    -- (resolve_dependents), after now(); with now() here the worker going on with the chain never
    -- saw it due, and every step waited for a launcher's turn, behind the group's later tasks.
    due_at timestamptz := clock_timestamp();
BEGIN
    IF launcher IS NOT NULL THEN  -- (apart: a condition with a subquery is a query run on every claim)
        IF NOT pgtaskpy.launcher_accepts(launcher) THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pgtaskpy.lock_scheduling_shared();
    IF pgtaskpy.exclusive_gate() IS NOT NULL THEN  -- (an exclusive task due or running: see claim_due_tasks)
        RETURN NULL;
    END IF;
    SELECT t.* INTO claimed
    FROM @extschema@.task AS t  -- (... IS TRUE: see claim_due_tasks)
    WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.hash >= group_hash AND t.hash <= group_hash
      AND t.plan <= due_at  -- (checked in the index: see claim_due_tasks)
      AND (t.plan <= due_at AND t.plan + t.active > due_at) IS TRUE AND NOT t.exclusive
      -- (the pause's key probed in the statement, as in claim_due_tasks: group_paused's call a task
      -- read cost a worker going on with a group 64 ms behind another role's 20,000 paused tasks.
      -- "IS TRUE": a probe a row, never an anti-join that hashes every pause, any role's.)
      AND (NOT EXISTS (SELECT FROM pgtaskpy.group_pause AS p WHERE p.owner = t.owner AND p."group" = t."group"))
          IS TRUE
      -- (nor one that came due during its group's pause: pause_group)
      AND (t.max >= 0 OR NOT EXISTS (SELECT FROM pgtaskpy.group_spacing AS s
                                     WHERE s.owner = t.owner AND s.hash = t.hash AND s.until > due_at))
      AND (t.key IS NULL OR NOT EXISTS (  -- (a named series' runs never overlap: see claim_due_tasks)
               SELECT FROM @extschema@.task AS k
               WHERE k.state IN ('TAKE', 'WORK') AND k.owner = t.owner AND k.key = t.key))
    ORDER BY t.hash, t.max DESC, t.id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Counted apart, so that the room checks are simple expressions: inlined,
    -- and not planned again on every claim.
    running := (SELECT count(*) FROM @extschema@.task AS r WHERE r.state IN ('TAKE', 'WORK') AND r.hash = group_hash);
    IF NOT pgtaskpy.group_has_room(claimed.max, running, 1) THEN
        RETURN NULL;
    END IF;
    cap := CASE WHEN pgtaskpy.role_running_limits_set() THEN pgtaskpy.role_running_limit(claimed.owner) END;
    IF cap IS NOT NULL THEN  -- an owner's count spans groups: no slot to hand on
        IF NOT pgtaskpy.try_lock_owner(claimed.owner) THEN
            RETURN NULL;
        END IF;
        running := (SELECT count(*) FROM @extschema@.task AS r
                    WHERE r.state IN ('TAKE', 'WORK') AND r.owner = claimed.owner);
        IF NOT pgtaskpy.owner_has_room(cap, running, 1) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF NOT pgtaskpy.take_start_slot(claimed.owner, claimed."group") THEN  -- (a rate limit: 70_operating.sql)
        RETURN NULL;
    END IF;
    IF session_pid IS NOT NULL AND claimed.owner = session_owner
       AND claimed.remote IS NOT DISTINCT FROM session_remote  -- (hash of another group and remote)
       AND claimed.count = session_count AND claimed.live = session_live
       AND (session_task IS NULL OR claimed.id = session_task)  -- (its settings are that task's)
       AND claimed.target IS NULL THEN  -- (workers offer only sessions here: a standby task opens its own)
        claimed := pgtaskpy.start_task(claimed.id, NULL, session_pid);
    ELSE
        UPDATE @extschema@.task AS t SET state = 'TAKE', worker = pg_backend_pid() WHERE t.id = claimed.id
        RETURNING t.* INTO claimed;
    END IF;
    RETURN claimed;
END
$$;

-- The tasks of a running task's group that are due now, in the order its
-- group's claims take them (claim_next_task), then those due once it ends (in
-- a chain, the steps between: each waits for the one before alone), up to
-- `most`: those whose sessions a worker going on with the group starts ahead.
-- enable_sort off, as claim_next_task: planned on a table just filled, the
-- group's due tasks were read whole by plan and sorted, a read of every due
-- task of the group for each task it ran (0.44 ms a task of 1,000 in one
-- group), where the priority index gives the first `most` at once.
CREATE FUNCTION pgtaskpy.upcoming_in_group(group_hash integer, most integer, running_task bigint,
                                           group_owner name, group_name text)
RETURNS TABLE (id bigint, "group" text, timeout_s float8, max integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off SET enable_incremental_sort = off
    SET jit = off
AS $$
BEGIN
    -- None for a group paused or under a rate limit, whose next claims may take none of them: a
    -- limited group's sessions ahead, closed unused as they connected, were two a task, and each
    -- left the server's log "connection to client lost" (a probe).  The group's own keys, probed.
    -- Nor for another owner's tasks of a group of the same name (the hash is of group and
    -- remote): the sessions ahead are the running task's owner's, which those cannot use, and
    -- their group may be paused where this one is not (a review: 33 sessions for 10 tasks).
    IF EXISTS (SELECT FROM pgtaskpy.group_pause AS p WHERE p.owner = group_owner AND p."group" = group_name)
       OR EXISTS (SELECT FROM pgtaskpy.group_limit AS l WHERE l.owner = group_owner AND l."group" = group_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    (SELECT t.id, t."group", extract(epoch FROM t.timeout)::float8, t.max FROM @extschema@.task AS t
     WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.hash >= group_hash AND t.hash <= group_hash
       AND t.plan <= now() AND t.owner = group_owner
     ORDER BY t.hash, t.max DESC, t.id LIMIT most)
    UNION ALL
    (WITH RECURSIVE later (id, steps) AS (
         SELECT e.dependent, 1 FROM pgtaskpy.pending_prerequisite AS e WHERE e.prerequisite = running_task
         UNION ALL
         SELECT e.dependent, l.steps + 1 FROM later AS l
         JOIN pgtaskpy.pending_prerequisite AS e ON e.prerequisite = l.id WHERE l.steps < most)
     SELECT t.id, t."group", extract(epoch FROM t.timeout)::float8, t.max FROM later AS l
     JOIN @extschema@.task AS t ON t.id = l.id
     WHERE t.state = 'PLAN' AND t.waiting_for = 1 AND t.hash = group_hash AND t.plan <= now()
       AND t.owner = group_owner
     ORDER BY l.steps, t.id)
    LIMIT most;
END
$$;

-- TAKE -> PLAN: claimed tasks that were not started wait again, those of
-- `task_ids` (NULL: any) claimed by `claimer` (NULL: anyone).  A launcher
-- takes back a task its worker did not take, a worker one whose session
-- found no free connection, recovery those of dead claimers.  A row a
-- client holds (SELECT ... FOR UPDATE) is skipped, not waited for, as the
-- claims skip it: the launcher's turn that waited held the scheduling lock,
-- and every role's tasks with it.  It stays TAKE, and housekeeping takes it
-- back in a later second (recover_orphaned_tasks, unclaim_strays).
CREATE FUNCTION pgtaskpy.unclaim_tasks(task_ids bigint[], claimer integer) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unclaimed integer;
    taken bigint[];
    keyed record;
BEGIN
    IF task_ids IS NULL AND claimer IS NULL THEN
        RAISE EXCEPTION 'unclaim_tasks needs the tasks or their claimer';
    END IF;
    taken := ARRAY(SELECT l.id FROM @extschema@.task AS l
                   WHERE l.state = 'TAKE' AND (task_ids IS NULL OR l.id = ANY (task_ids))
                     AND (claimer IS NULL OR l.worker = claimer)
                   FOR NO KEY UPDATE SKIP LOCKED);
    UPDATE @extschema@.task AS t SET state = 'PLAN', worker = NULL
    WHERE t.id = ANY (taken) AND t.state = 'TAKE' AND t.key IS NULL;
    GET DIAGNOSTICS unclaimed = ROW_COUNT;
    -- A claimed task of a key may have got a waiting task of the key meanwhile (task_enqueue and
    -- task_schedule take a claimed one for started): back to PLAN it is the key's second waiting
    -- task, which task_key_waiting refuses, and the unique violation failed every launcher turn
    -- that tried.  It never ran: it ends STOP, and the key's waiting task goes on for it.
    FOR keyed IN SELECT t.id, t.owner, t.key FROM @extschema@.task AS t
                 WHERE t.id = ANY (taken) AND t.state = 'TAKE' AND t.key IS NOT NULL ORDER BY t.id
    LOOP
        BEGIN
            UPDATE @extschema@.task AS t SET state = 'PLAN', worker = NULL WHERE t.id = keyed.id;
            unclaimed := unclaimed + 1;
        EXCEPTION WHEN unique_violation THEN
            UPDATE @extschema@.task AS t
            SET state = 'STOP', worker = NULL, stop = clock_timestamp(), error = format(
                'ERROR:  task %s of key %s waits in its place: it was inserted while this one was claimed, which'
                ' then could not start; this one never ran',
                (SELECT w.id FROM @extschema@.task AS w WHERE w.owner = keyed.owner AND w.key = keyed.key
                   AND w.state = 'PLAN'), quote_literal(keyed.key))
            WHERE t.id = keyed.id;
        END;
    END LOOP;
    RETURN unclaimed;
END
$$;

-- TAKE -> WORK: the task claimed by `claimer` starts in the session whose
-- backend is `session_pid`, supervised by the calling worker; returns the
-- row, or NULL when it is no longer that claimer's (stopped, or taken back
-- after the claimer died).  claimer NULL: a waiting task the caller has just
-- locked and checked (claim_next_task) goes straight from PLAN to WORK.
CREATE FUNCTION pgtaskpy.start_task(task_id bigint, claimer integer, session_pid integer)
RETURNS @extschema@.task
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    started @extschema@.task;
    paused boolean;
BEGIN
    -- (Tried again when the group was paused as the UPDATE read it and is not as the row is
    -- read again: a resume committed between the two.  Read as a DBA's trigger's doing, the
    -- task ended FAIL 09000 without having run: a probe pausing and resuming in a loop.)
    FOR attempt IN 1..3 LOOP
        UPDATE @extschema@.task AS t
        SET state = 'WORK', start = clock_timestamp(), pid = session_pid, worker = pg_backend_pid()
        WHERE t.id = task_id
          AND CASE WHEN claimer IS NULL THEN t.state = 'PLAN' ELSE t.state = 'TAKE' AND t.worker = claimer END
          AND NOT pgtaskpy.group_paused(t.owner, t."group")  -- (70_operating.sql)
        RETURNING t.* INTO started;
        EXIT WHEN started.id IS NOT NULL;
        SELECT pgtaskpy.group_paused(t.owner, t."group") INTO paused FROM @extschema@.task AS t
        WHERE t.id = task_id
          AND CASE WHEN claimer IS NULL THEN t.state = 'PLAN' ELSE t.state = 'TAKE' AND t.worker = claimer END;
        IF NOT FOUND THEN
            RETURN NULL;  -- not this claimer's any more: stopped, or taken back
        ELSIF paused THEN
            -- Claimed before task_pause committed (a claim reads the pauses before it waits for
            -- the scheduling lock, and a claimed task started up to 115 ms after the pause had
            -- returned): it waits again, unstarted, with its group.  (claimer NULL: it waits still.)
            IF claimer IS NOT NULL THEN
                PERFORM pgtaskpy.unclaim_tasks(ARRAY[task_id], claimer);
            END IF;
            RETURN NULL;
        END IF;
    END LOOP;
    IF started.id IS NULL THEN
        -- Still this claimer's, and not paused: a DBA's BEFORE UPDATE trigger returned NULL for
        -- the start.  Taken as "stopped meanwhile", the task was given back and claimed again
        -- 50 times a second, for good, the log silent; its worker fails it with this error.
        RAISE EXCEPTION 'a trigger on task made its start no start (returned NULL)'
            USING ERRCODE = 'triggered_action_exception';
    END IF;
    PERFORM pgtaskpy.note_start(started);  -- (a rate limit's window: 70_operating.sql)
    -- WORK is on disk before the input runs: with synchronous_commit off, a crash lost its
    -- commit, the task was waiting again after recovery and ran a second time.  (Local: a
    -- stricter value of the database's stays; kept to the commit, as SET LOCAL is.)
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN started;
END
$$;

-- A WORK task whose session the server ended for being idle (idle_session_timeout) before it
-- read the input moves to a new session (run_task.py): its pid is that session's, so that
-- task_cancel reaches the query, and its start is when the input goes.  False when the task is
-- not this worker's running task any more (task_cancel ended it meanwhile).
CREATE FUNCTION pgtaskpy.move_task_to_session(task_id bigint, session_pid integer)
RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    WITH moved AS (
        UPDATE @extschema@.task AS t SET pid = session_pid, start = clock_timestamp()
        WHERE t.id = task_id AND t.state = 'WORK' AND t.worker = pg_backend_pid()
        RETURNING t.id
    )
    SELECT EXISTS (SELECT FROM moved)
$$;

-- 1.1's claim_next_in_group, for a worker that
-- runs 1.1 code while the extension is updated under it: it goes on with its
-- group until its call returns.  Kept: an update from 1.1 straight to a later
-- version replaces it too, under workers still running 1.1 code.
CREATE FUNCTION pgtaskpy.claim_next_in_group(group_hash integer, claimer integer, launcher integer)
RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT c.id FROM pgtaskpy.claim_next_task(group_hash, launcher) AS c $$;

-- A setting of a role's sessions in this database, as written, and the command
-- that set it (value NULL: not set): pg_task_py.role_running_limit, or one a
-- burst's worker reads (run_batch.py).  In PostgreSQL's order for a session's
-- defaults: ALTER ROLE ... IN DATABASE (this one), ALTER ROLE, ALTER DATABASE
-- (this one), ALTER ROLE ALL; not postgresql.conf's.  Read from the catalog:
-- the owner's settings are not this session's.
CREATE FUNCTION pgtaskpy.role_setting_found(role name, setting text, OUT value text, OUT set_by text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL keeps the plan (an SQL function plans again on every call) and
    -- the (setdatabase, setrole) index is used: this runs on every claim.
    SELECT substr(c, length(setting) + 2),
           CASE WHEN s.setrole = 0 AND s.setdatabase = 0 THEN 'ALTER ROLE ALL'
                WHEN s.setrole = 0 THEN format('ALTER DATABASE %I', current_database())
                WHEN s.setdatabase = 0 THEN format('ALTER ROLE %I', role)
                ELSE format('ALTER ROLE %I IN DATABASE %I', role, current_database()) END
    INTO value, set_by
    FROM pg_db_role_setting AS s
    CROSS JOIN unnest(s.setconfig) AS c
    WHERE s.setrole IN (0, to_regrole(quote_ident(role)))
      AND s.setdatabase IN (0, (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()))
      AND split_part(c, '=', 1) = setting
    ORDER BY s.setrole <> 0 DESC, s.setdatabase <> 0 DESC
    LIMIT 1;
END
$$;

-- pg_task_py.role_running_limit of a role, as written (NULL: not set).
CREATE FUNCTION pgtaskpy.role_running_limit_setting(role name) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (pgtaskpy.role_setting_found(role, 'pg_task_py.role_running_limit')).value;
END
$$;

-- Whether any role has pg_task_py.role_running_limit set (ALTER ROLE ... SET, in
-- this database or any; ALTER DATABASE, ALTER ROLE ALL for every role): when
-- none has (the common case), a claim looks up no
-- owner's limit, which costs two calls and a catalog read an owner (0.14 ms of
-- a lone task's claim).  PL/pgSQL without SET (every name qualified), so that
-- its plan is kept.
CREATE FUNCTION pgtaskpy.role_running_limits_set() RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM pg_catalog.pg_db_role_setting AS s CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c
                   WHERE c OPERATOR(pg_catalog.~~) E'pg\\_task\\_py.role\\_running\\_limit=%')
        OR EXISTS (SELECT FROM pg_catalog.pg_roles AS r  -- (a CONNECTION LIMIT: see role_running_limit)
                   WHERE r.rolconnlimit OPERATOR(pg_catalog.>=) 0 AND NOT r.rolsuper);
END
$$;

-- pg_task_py.role_running_limit: most tasks of one owner running at once (NULL:
-- no limit).  A value that is not a whole number claims none of the owner's
-- tasks: fail_misconfigured_tasks fails them with an error naming the setting
-- and the role, and nobody else's claims are disturbed.  The role's CONNECTION
-- LIMIT (superusers have none) is one too, the lower one counts: each running
-- task holds a session of its owner, and a task claimed past it was refused
-- its session, claimed again and refused, turn after turn.
CREATE FUNCTION pgtaskpy.role_running_limit(role name) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := pgtaskpy.role_running_limit_setting(role);
    connections integer := (SELECT nullif(r.rolconnlimit, -1) FROM pg_roles AS r
                            WHERE r.rolname = role AND NOT r.rolsuper);
BEGIN
    IF setting IS NULL THEN
        RETURN connections;
    ELSIF setting ~ E'^\\s*[0-9]+\\s*$' THEN
        RETURN least(setting::numeric, 2147483647, connections)::integer;  -- (more than any server runs at once)
    END IF;
    RETURN 0;
END
$$;

-- The owners whose claimed and running tasks reach their role_running_limit
-- (0 included): those with a limit, a setting or a CONNECTION LIMIT (see
-- role_running_limits_set), and every role that may log in when a database's
-- or every role's default is set; looked at once a claim.
CREATE FUNCTION pgtaskpy.owners_at_running_limit() RETURNS name[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(r.rolname), '{}')
    FROM pg_roles AS r
    WHERE (r.rolconnlimit >= 0 AND NOT r.rolsuper
           OR EXISTS (SELECT FROM pg_db_role_setting AS s CROSS JOIN LATERAL unnest(s.setconfig) AS c
                      WHERE (s.setrole = r.oid OR s.setrole = 0 AND r.rolcanlogin)
                        AND c LIKE E'pg\\_task\\_py.role\\_running\\_limit=%'))
      AND pgtaskpy.role_running_limit(r.rolname)
          <= (SELECT count(*) FROM @extschema@.task AS t WHERE t.state IN ('TAKE', 'WORK') AND t.owner = r.rolname)
$$;

-- Due tasks of owners whose pg_task_py.role_running_limit is not a whole
-- number end FAIL, saying which setting of which role to fix (role_running_limit
-- claims none of them).  Housekeeping, once a second.
CREATE FUNCTION pgtaskpy.fail_misconfigured_tasks() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
    failed integer := 0;
BEGIN
    FOR bad IN
        WITH setters AS (
            SELECT DISTINCT s.setrole FROM pg_db_role_setting AS s CROSS JOIN unnest(s.setconfig) AS c
            WHERE c LIKE E'pg\\_task\\_py.role\\_running\\_limit=%')
        SELECT r.rolname, f.value AS setting, f.set_by
        FROM pg_roles AS r
        CROSS JOIN LATERAL pgtaskpy.role_setting_found(r.rolname, 'pg_task_py.role_running_limit') AS f
        WHERE r.oid IN (SELECT w.setrole FROM setters AS w)
           OR r.rolcanlogin AND EXISTS (SELECT FROM setters AS w WHERE w.setrole = 0)  -- (a default for every role)
    LOOP
        CONTINUE WHEN bad.setting IS NULL OR bad.setting ~ E'^\\s*[0-9]+\\s*$';  -- (the whole numbers role_running_limit reads)
        failed := failed + pgtaskpy.fail_waiting_tasks(
            ARRAY(SELECT t.id FROM @extschema@.task AS t
                  WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.owner = bad.rolname AND t.plan <= now()
                  ORDER BY t.id LIMIT 1000),
            format(E'ERROR:  invalid value for setting "pg_task_py.role_running_limit" of role "%s": "%s"\n'
                   'HINT:  It must be a whole number of tasks: %s SET pg_task_py.role_running_limit = 4, '
                   'or RESET it.', bad.rolname, bad.setting, bad.set_by),
            '22023');  -- invalid_parameter_value
    END LOOP;
    RETURN failed;
END
$$;

-- What a drifting series counts its next run from: the run's stop, or its plan
-- when that is later (a waiting run skipped ahead of its time, task_cancel:
-- counted from the cancel, the run after it came before it).
CREATE FUNCTION pgtaskpy.drift_from(task @extschema@.task) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT greatest(COALESCE(task.stop, clock_timestamp()), task.plan)
$$;

-- The next planned time of a repeating task.  cron: the first match after
-- the old plan that is in the future (missed matches are skipped; drift does
-- not apply).  repeat: old plan + k * repeat, the first such time in the
-- future, or stop + repeat when the task drifts.  A repeat's days, months and
-- years are counted in the task's tz, as cron is read in it (plus_in_zone).
CREATE FUNCTION pgtaskpy.next_plan(task @extschema@.task) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k bigint;  -- (plan and repeat are bounded, so that k * repeat stays exact)
    zone text := COALESCE(task.tz, 'UTC');
BEGIN
    IF current_setting('timezone_abbreviations') <> 'Default' THEN
        RETURN pgtaskpy.next_plan_by_default_abbreviations(task);  -- (as cron_next)
    ELSIF task.cron IS NOT NULL THEN
        -- (cron_next, as the backend computed it for an earlier end: this runs
        -- at every end of a series)
        RETURN to_timestamp(pgtaskpy.cron_next_kept(
            task.cron, zone, extract(epoch FROM greatest(task.plan, clock_timestamp()))::float8));
    ELSIF date_part('day', task.repeat) <> 0 OR date_part('month', task.repeat) <> 0
          OR date_part('year', task.repeat) <> 0 THEN
        RETURN pgtaskpy.next_plan_in_zone(task, zone);
    ELSIF task.drift THEN
        RETURN pgtaskpy.drift_from(task) + task.repeat;
    END IF;
    -- Estimate k with arithmetic, then step to the first k whose time is in
    -- the future (next_plan_in_zone estimates a little short: months and days
    -- have no fixed length, a month counts 30 days, a day under daylight
    -- saving 23 to 25 hours).  plan + k * repeat, not plan + repeat + repeat
    -- ...: 31 Jan + 2 months is 31 Mar, where stepping a month at a time gives 28 Mar.
    k := greatest(floor(extract(epoch FROM clock_timestamp() - task.plan) / extract(epoch FROM task.repeat)), 1);
    WHILE task.plan + task.repeat * k <= clock_timestamp() LOOP
        k := k + 1;
    END LOOP;
    RETURN task.plan + task.repeat * k;
END
$$;

-- next_plan in a session whose timezone_abbreviations is not the scheduler's Default: a
-- tz that is an abbreviation is read as the scheduler reads it (a task_cancel of a series'
-- waiting run, in such a session, planned the next run by another offset).
CREATE FUNCTION pgtaskpy.next_plan_by_default_abbreviations(task @extschema@.task) RETURNS timestamptz
LANGUAGE sql STABLE SET timezone_abbreviations = 'Default'
AS $$ SELECT pgtaskpy.next_plan(task) $$;

-- next_plan of a repeat of days, months or years, counted in `zone`.
CREATE FUNCTION pgtaskpy.next_plan_in_zone(task @extschema@.task, zone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k bigint;
BEGIN
    IF task.drift THEN
        RETURN pgtaskpy.plus_in_zone(pgtaskpy.drift_from(task), task.repeat, zone);
    END IF;
    k := greatest(floor(extract(epoch FROM clock_timestamp() - task.plan) / extract(epoch FROM task.repeat) * 0.95), 1);
    WHILE pgtaskpy.plus_in_zone(task.plan, task.repeat * k, zone) <= clock_timestamp() LOOP
        k := k + 1;
    END LOOP;
    RETURN pgtaskpy.plus_in_zone(task.plan, task.repeat * k, zone);
END
$$;

-- `moment` + `step` as PostgreSQL adds them in a session whose TimeZone is `zone`
-- (the months on the local calendar, then the days on it, each step taken to
-- the zone's time, then the time of day as elapsed time), whatever the
-- session's own: it counted a daily task's days in the TimeZone of whichever
-- session ended a run.  The months and the days in two steps, as PostgreSQL
-- does: a month landing in a spring-forward gap moves an hour on before the
-- days are added (in one step, 5 sums in 100,000 of `1 mon 1 day` differed).
-- AT TIME ZONE rather than a TimeZone set for the moment, which refuses the
-- abbreviations a task's tz may be (PST: UTC-8 all year, as cron reads it).
-- A step of hours or less is the same in every zone.
CREATE FUNCTION pgtaskpy.plus_in_zone(moment timestamptz, step interval, zone text) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.moment + (step - c.months - c.days)
    FROM (SELECT make_interval(months => (date_part('year', step) * 12 + date_part('month', step))::integer)
                 AS months, make_interval(days => date_part('day', step)::integer) AS days) AS c
    CROSS JOIN LATERAL (SELECT CASE WHEN c.months = interval '0' THEN moment
                                    ELSE ((moment AT TIME ZONE zone) + c.months) AT TIME ZONE zone END AS moment) AS m
    CROSS JOIN LATERAL (SELECT CASE WHEN c.days = interval '0' THEN m.moment
                                    ELSE ((m.moment AT TIME ZONE zone) + c.days) AT TIME ZONE zone END AS moment) AS d
$$;

-- End a task: record its result (and its error's SQLSTATE), insert what
-- follows it (exactly once: only the transaction that moves the row out of
-- from_states does it), delete a task that produced nothing when asked to,
-- and wake the launchers (not when the caller goes on with the group's next
-- task: no slot is freed).
--
-- What follows a task's end (follow_task: its retry, its series' next run,
-- its group's pause) runs in its own subtransaction, and only for tasks that
-- have something to follow: if it fails (a DBA's trigger refuses the next
-- run, say), the task ends FAIL with that error, and the worker or the
-- launcher's turn that ended it goes on with everyone else's tasks.
CREATE FUNCTION pgtaskpy.finish_task(
    task_id bigint, end_state @extschema@.state, task_output text, task_error text,
    from_states @extschema@.state[] DEFAULT '{TAKE,WORK}', task_notice text DEFAULT NULL,
    wake boolean DEFAULT true, task_sqlstate text DEFAULT NULL, task_stop timestamptz DEFAULT NULL)
RETURNS @extschema@.state
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t @extschema@.task;
    retry_id bigint;
    failure text;
    failure_sqlstate text;
    -- (read before the UPDATE: one that waits for a client's lock on the row, as an open
    -- transaction's UPDATE of `data` holds it, would read the clock after that wait; a burst's
    -- worker, which writes such an end once the client lets the row go, gives the time its
    -- task ended as task_stop)
    ended_at timestamptz := coalesce(task_stop, clock_timestamp());
BEGIN
    PERFORM set_config('pgtaskpy.counting_ends', 'on', true);  -- (task_ended counts it: 70_operating.sql)
    UPDATE @extschema@.task AS task
    SET state = end_state, stop = ended_at, output = task_output, error = task_error,
        notice = task_notice, worker = NULL, sqlstate = CASE WHEN end_state = 'FAIL' THEN task_sqlstate END
    WHERE task.id = task_id AND task.state = ANY (from_states)
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    IF t.repeat > interval '0' OR t.cron IS NOT NULL OR (t.state = 'FAIL' AND t.attempt <= t.retry) THEN
        BEGIN
            retry_id := pgtaskpy.follow_task(t, quiet => NOT wake);
        EXCEPTION WHEN deadlock_detected OR lock_not_available THEN
            -- Not a failure of what follows: the server broke a cycle of locks (a
            -- client holding the series' lock, then wanting this row), or a
            -- launcher's end_task_safely gave up waiting for the series' lock.  The
            -- whole end fails and is written again (the worker's finish_task in
            -- task_rows.py; a launcher's end_task_safely, next turn).
            RAISE;
        WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT, failure_sqlstate = RETURNED_SQLSTATE;
            t.error := concat_ws(E'\n', t.error, 'ERROR:  what follows the task failed: ' || failure);
            t.state := 'FAIL';
            -- (counted once, below: not as a hand repair too, task_recount_changed_update)
            PERFORM set_config('pgtaskpy.ending_task', t.id::text, true);
            UPDATE @extschema@.task AS task SET state = t.state, error = t.error, sqlstate = failure_sqlstate
            WHERE task.id = t.id;
            PERFORM set_config('pgtaskpy.ending_task', '', true);
        END;
    END IF;

    -- Its dependents count it down or stop, before a row that produced
    -- nothing is deleted (sql/replayed/47_workflows.sql); those of a failed
    -- run that is retried wait for the retry instead.
    IF retry_id IS NOT NULL THEN
        PERFORM pgtaskpy.pass_dependents_on(t.id, retry_id);
    ELSE
        PERFORM pgtaskpy.resolve_dependents(t.id, t.state, CASE WHEN NOT wake THEN t.hash END);
    END IF;
    IF t.max < 0 AND t.start IS NOT NULL THEN  -- (a pause between runs: none after one that never ran)
        PERFORM pgtaskpy.pause_group(t);
    END IF;
    PERFORM pgtaskpy.task_ended(t);  -- counters and the event of its end (70_operating.sql)

    -- (nor a row whose notices hold a WARNING: a task whose only result was one left no trace, a
    -- probe; plain NOTICEs, "table ... does not exist, skipping", go with the row.  Nor a
    -- retry's: beside its failed attempt, which is kept, it tells that the task did its work in
    -- the end, and a dependent of that attempt follows it there, one inserted later too: deleted,
    -- it could not be followed, and the dependent stopped, "prerequisite ended FAIL", after the
    -- retry had done the work (a review).  Retention takes it later.)
    IF t.delete AND t.output IS NULL AND t.error IS NULL AND (t.notice IS NULL OR t.notice !~ '(^|\n)WARNING:  ')
       AND t.attempt = 1 THEN
        -- (not while an open transaction locks the row FOR KEY SHARE, as a foreign key does or an
        -- INSERT of a task `after` it: the end would wait for it; retention deletes the row later)
        DELETE FROM @extschema@.task AS task
        WHERE task.id = (SELECT l.id FROM @extschema@.task AS l WHERE l.id = t.id FOR UPDATE SKIP LOCKED);
    END IF;

    IF wake THEN
        PERFORM pgtaskpy.wake_launchers();
    END IF;
    RETURN t.state;
END
$$;

-- finish_task's end for many waiting tasks at once, in a few statements where
-- finish_task takes several a task: those of ids still waiting that have
-- nothing to follow their end (finish_task's follow_task: no series, no
-- negative max, no retry) and an error (so that none is deleted).  The same
-- steps as finish_task's: the UPDATE, the dependents, the counters and event
-- of each end, and one wake.  Keep the two in step.  Returns the ids it
-- ended; the caller ends the others one by one.
CREATE FUNCTION pgtaskpy.end_waiting_tasks(ids bigint[], end_state @extschema@.state, task_error text)
RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ended @extschema@.task[];
    ended_ids bigint[];
    prerequisite bigint;
BEGIN
    PERFORM set_config('pgtaskpy.counting_ends', 'on', true);  -- (task_ended counts them: 70_operating.sql)
    WITH ended_now AS (
        UPDATE @extschema@.task AS task
        SET state = end_state, stop = clock_timestamp(), output = NULL, error = task_error, notice = NULL,
            worker = NULL, sqlstate = NULL
        WHERE task.id = ANY (ids) AND task.state = 'PLAN' AND task_error IS NOT NULL
          AND NOT (task.repeat > interval '0' OR task.cron IS NOT NULL OR task.max < 0
                   OR (end_state = 'FAIL' AND task.attempt <= task.retry))
        RETURNING task.*
    )
    SELECT coalesce(array_agg(e), '{}'), coalesce(array_agg(e.id), '{}') INTO ended, ended_ids FROM ended_now AS e;
    FOR prerequisite IN
        SELECT DISTINCT p.prerequisite FROM pgtaskpy.pending_prerequisite AS p
        WHERE p.prerequisite = ANY (ended_ids) ORDER BY p.prerequisite
    LOOP
        PERFORM pgtaskpy.resolve_dependents(prerequisite, end_state);
    END LOOP;
    PERFORM pgtaskpy.task_ended(e) FROM unnest(ended) AS e;  -- (counters and the event of its end)
    IF cardinality(ended) > 0 THEN
        PERFORM pgtaskpy.wake_launchers();
    END IF;
    RETURN ended_ids;
END
$$;

-- The SQLSTATE of a run the scheduler lost while it ran: its worker backend
-- died, or its session's connection broke.  It may have done its work.
CREATE FUNCTION pgtaskpy.lost_run_sqlstate() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '08006' $$;

-- When failed run t is tried again, or NULL when it is not: its SQLSTATE is
-- one retry_on names (a five-character code, its two-character class, or
-- '*'), and it has attempts left.  Never a STOP or GONE (not failures), nor a
-- run task_cancel cancelled, whatever ended it after that (a terminate, a
-- launcher's stop); a timeout of the task's own only when retry_on names 57014 itself.
-- A lost run (its worker died, its session broke or was ended while it ran)
-- may have done its work: tried again only when the task says it is safe
-- (retry_unsafe), and not before a minute, so that an operator can step in.
-- The delay doubles from retry_delay with each attempt, is spread by +-10 %
-- so that tasks failing together do not retry together, and is at most
-- retry_max: a delay the cap cuts is spread over the cap's last 10 % (capped
-- after the spread, tasks failing together retried at one time again); a lost
-- run's minute, over the 10 % after it, for the same reason (a crash's runs).
CREATE FUNCTION pgtaskpy.retry_plan(t @extschema@.task) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- (a session a DBA or a shutdown ended while it ran, 57P01 or 57P02, is lost the same way)
    lost boolean := t.sqlstate IN (pgtaskpy.lost_run_sqlstate(), '57P01', '57P02') AND t.start IS NOT NULL;
    -- The scheduler's own errors of a run whose input had run to its end, its work committed
    -- perhaps (sql/plpython/run_task.py, output.py: their words): its output past
    -- pg_task_py.output_limit, 54000, and a COPY's ENCODING, 22021.  Retried as any 54000 or 22021
    -- of the server's (which rolls the work back), they ran committed work again (a probe).
    done_perhaps boolean := t.sqlstate = '54000' AND t.error LIKE 'ERROR:  task output exceeds % characters%'
                            OR t.sqlstate = '22021'
                               AND t.error LIKE 'ERROR:  the task''s output holds bytes that are not text%';
    delay float8;
BEGIN
    IF t.state <> 'FAIL' OR t.attempt > t.retry OR t.sqlstate IS NULL THEN
        RETURN NULL;
    ELSIF EXISTS (SELECT FROM pgtaskpy.cancelled_run AS c WHERE c.task_id = t.id AND NOT c.by_stop) THEN
        -- Somebody wanted it to stop: its end is not retried, whether the cancel ended it, or a
        -- pg_terminate_backend or a launcher's stop after a cancel the task caught (a probe).
        RETURN NULL;
    ELSIF lost THEN
        IF NOT t.retry_unsafe THEN
            RETURN NULL;
        END IF;
    ELSIF done_perhaps AND NOT t.retry_unsafe THEN
        RETURN NULL;
    ELSIF t.sqlstate = '57014' AND EXISTS (SELECT FROM pgtaskpy.cancelled_run AS c WHERE c.task_id = t.id AND c.by_stop) THEN
        -- A launcher's stop past its --grace (a deploy, a restart): nobody asked the task to end,
        -- and its transaction was rolled back.  Retried as any error (a probe: a workflow's step
        -- with retry_on '{*}' failed for good, and the workflow stopped, where a SIGKILL of the
        -- launcher let the step finish).
        IF NOT (t.retry_on && ARRAY['*', '57014', '57']) THEN
            RETURN NULL;
        END IF;
    ELSIF t.sqlstate = '57014' THEN  -- query_canceled: a timeout of its own, or a cancel
        -- (task_cancel's is marked, above; a DBA's pg_cancel_backend, or a task_cancel rolled back
        -- after its signal, is told by its words, when the server's messages are in English, else
        -- by the time: a run that lasted its timeout was taken for one)
        IF NOT ('57014' = ANY (t.retry_on) AND t.timeout > interval '0' AND t.stop - t.start >= t.timeout)
           OR t.error LIKE 'ERROR:  canceling statement due to user request%' THEN
            RETURN NULL;
        END IF;
    ELSIF NOT (t.retry_on && ARRAY['*', t.sqlstate, left(t.sqlstate, 2)]) THEN
        RETURN NULL;
    END IF;
    -- (seconds as float8: retry_delay * 2^60 would overflow an interval; both are at most 1000 years)
    delay := extract(epoch FROM t.retry_delay) * 2.0 ^ least(t.attempt - 1, 60) * (0.9 + 0.2 * random());
    IF delay > extract(epoch FROM t.retry_max) THEN
        delay := extract(epoch FROM t.retry_max) * (0.9 + 0.1 * random());
    END IF;
    IF lost AND delay < greatest(extract(epoch FROM t.retry_delay), 60) THEN
        delay := greatest(extract(epoch FROM t.retry_delay), 60) * (1 + 0.1 * random());
    END IF;
    RETURN t.stop + make_interval(secs => delay);
END
$$;

-- Whether a later attempt of the failed run `task_id` (its retry, or that one's, and so on) still
-- waits or runs.  Retention and keep_runs keep such a run of a series: the retry's end finds the
-- series' beat in its first attempt (series_plan), and with that attempt deleted, the series
-- went on from the retry's own plan, off its beat for good (a probe: keep_runs = 1).
CREATE FUNCTION pgtaskpy.retry_pending(task_id bigint, task_attempt integer, task_owner name) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE later AS (
        SELECT c.id, c.attempt, c.state FROM @extschema@.task AS c
        WHERE c.parent = task_id AND c.attempt = task_attempt + 1 AND c.owner = task_owner
        UNION ALL
        SELECT c.id, c.attempt, c.state FROM later AS l JOIN @extschema@.task AS c
        ON c.parent = l.id AND c.attempt = l.attempt + 1 AND c.owner = task_owner)
    SELECT EXISTS (SELECT FROM later AS l WHERE l.state IN ('PLAN', 'TAKE', 'WORK'))
$$;

-- The plan of the regular run of t's series that t is an attempt of: a
-- retry's own plan is off the series' beat (repeat without drift counts
-- from it).  Its attempts are its parents, each one attempt back.
CREATE FUNCTION pgtaskpy.series_plan(t @extschema@.task) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE attempts AS (
        SELECT t.parent AS id, t.attempt - 1 AS attempt
        UNION ALL
        SELECT p.parent, a.attempt - 1
        FROM attempts AS a JOIN @extschema@.task AS p ON p.id = a.id AND p.owner = t.owner
        WHERE a.attempt > 1)
    SELECT COALESCE((SELECT p.plan FROM attempts AS a JOIN @extschema@.task AS p ON p.id = a.id
                     WHERE a.attempt = 1 AND p.attempt = 1 AND p.owner = t.owner),
                    t.plan)  -- (the first attempt deleted meanwhile: keep the retry's beat)
$$;

-- No next run nor retry follows the end of task_id: its series ends with it
-- (follow_task inserts a next run only while repeat > 0 or cron is set, a
-- retry only while retry > 0).  task_cancel's stop_series; a worker's task
-- whose owner role is gone (run_task.py).
CREATE FUNCTION pgtaskpy.end_series(task_id bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ UPDATE @extschema@.task SET repeat = interval '0', cron = NULL, retry = 0 WHERE id = task_id $$;

-- The waiting run of the key of task t, which goes on for t's series (its parent t, a
-- cron run moved past the matches it missed meanwhile) or takes the place of t's retry:
-- its id, or NULL when there is none.  (SKIP LOCKED: a user stopping it right now has the
-- last word; nobody waits here for a row while holding the series.)
CREATE FUNCTION pgtaskpy.waiting_run_goes_on(t @extschema@.task, series boolean) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    waiting bigint;
BEGIN
    SELECT w.id INTO waiting FROM @extschema@.task AS w
    WHERE w.state = 'PLAN' AND w.owner = t.owner AND w.key = t.key;
    IF FOUND AND series THEN
        UPDATE @extschema@.task AS w
        SET parent = t.id,
            plan = CASE WHEN w.cron IS NOT NULL AND w.plan < clock_timestamp()
                        THEN pgtaskpy.cron_next(w.cron, w.tz, clock_timestamp()) ELSE w.plan END
        WHERE w.id = (SELECT l.id FROM @extschema@.task AS l WHERE l.id = waiting AND l.state = 'PLAN'
                      FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    RETURN waiting;
END
$$;

-- The columns of task that the extension makes (every version's, as its update leaves
-- them): a column not among them is one a user added, as pg_task lets a user do.  ("null"
-- quoted: unquoted in an array's text it is a NULL, and <> ALL of it no column.)
CREATE FUNCTION pgtaskpy.own_columns() RETURNS name[]
LANGUAGE sql IMMUTABLE
AS $$ SELECT '{id,parent,plan,start,stop,active,live,repeat,timeout,count,hash,max,pid,state,delete,drift,header,string,
               delimiter,escape,quote,data,error,group,input,"null",output,remote,save,owner,worker,notice,cron,tz,key,
               retry,retry_delay,retry_max,retry_on,retry_unsafe,attempt,sqlstate,after,after_any,waiting_for,exclusive,
               target,paused}'::name[] $$;

-- The next run or the retry `copy` of task t gets the values of t's columns that a user
-- added (pg_task copies every column but the run's own): they were NULL (or their default)
-- there.  Apart from the INSERT, which names the columns it knows: a column that is NOT
-- NULL with no default fails that INSERT, as it fails task_enqueue's (README).  Any role's
-- (task_retry's, as its caller): it updates a row as its caller may.
CREATE FUNCTION pgtaskpy.copy_user_columns(t @extschema@.task, copy bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    columns text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns
    FROM pg_catalog.pg_attribute AS a
    WHERE a.attrelid = '@extschema@.task'::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attgenerated = '' AND a.attname <> ALL (pgtaskpy.own_columns());
    IF columns IS NOT NULL AND copy IS NOT NULL THEN
        EXECUTE format('UPDATE %2$s AS n SET (%1$s) = (SELECT %1$s FROM (SELECT ($1).*) AS t)'
                       ' WHERE n.id = $2', columns, '@extschema@.task'::pg_catalog.regclass)
            USING t, copy;
    END IF;
END
$$;

-- What follows the end of task t: its retry, when it failed and retry_plan
-- says so; else the next run of its series (repeat or cron), when the retry
-- would not come before that run (a series never has two waiting runs; its
-- runs keep their plan).  Returns the id of the retry, if one was inserted.  quiet: the caller wakes
-- the launchers itself when it does not go on with the group (a worker), so
-- the row it inserts sends no NOTIFY (see task_notify_insert).
CREATE FUNCTION pgtaskpy.follow_task(t @extschema@.task, quiet boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql  -- (no SET clause: it runs with finish_task's search_path, as task_ended does)
AS $$
DECLARE
    series boolean := t.repeat > interval '0' OR t.cron IS NOT NULL;
    waiting bigint;
    retry_at timestamptz := CASE WHEN t.state = 'FAIL' AND t.attempt <= t.retry THEN pgtaskpy.retry_plan(t) END;
    next_at timestamptz;
    next_id bigint;
BEGIN
    IF t.key IS NOT NULL AND (series OR retry_at IS NOT NULL) THEN
        -- A named series that got a waiting run while this one ran (the
        -- series replaced by task_schedule, a task enqueued again under its
        -- key) goes on with that run; this one is not retried.
        PERFORM pgtaskpy.lock_series(t.owner, t.key);
        waiting := pgtaskpy.waiting_run_goes_on(t, series);
    END IF;

    IF waiting IS NULL AND (series OR retry_at IS NOT NULL) THEN
        IF series THEN
            IF t.attempt > 1 THEN
                t.plan := pgtaskpy.series_plan(t);
            END IF;
            next_at := pgtaskpy.next_plan(t);
            IF retry_at > next_at THEN
                retry_at := NULL;  -- the series' next run comes first
            END IF;
        END IF;
        -- (planned 2 s or more ahead, or quiet, it wakes no launcher: see task_notify_insert)
        PERFORM set_config('pgtaskpy.next_run', CASE WHEN quiet THEN 'quiet' ELSE 'on' END, true);
        INSERT INTO @extschema@.task (
            parent, plan, active, live, repeat, timeout, count, max, delete, drift, header,
            string, delimiter, escape, quote, data, "group", input, "null", remote, save, owner,
            cron, tz, key, retry, retry_delay, retry_max, retry_on, retry_unsafe, attempt, exclusive, target)
        VALUES (
            t.id, COALESCE(retry_at, next_at), t.active - t.paused, t.live, t.repeat, t.timeout, t.count,
            t.max, t.delete, t.drift, t.header, t.string, t.delimiter, t.escape, t.quote,
            t.data, t."group", t.input, t."null", t.remote, t.save, t.owner,
            t.cron, t.tz, t.key, t.retry, t.retry_delay, t.retry_max, t.retry_on, t.retry_unsafe,
            CASE WHEN retry_at IS NOT NULL THEN t.attempt + 1 ELSE 1 END, t.exclusive, t.target)
        -- A waiting run of the key that another transaction inserted, not committed when this end
        -- looked (task_enqueue in an application's transaction takes no series lock): the INSERT
        -- waits for that transaction, and once it has committed, this run ended FAIL, `duplicate
        -- key value violates unique constraint "task_key_waiting"`, its series gone (a probe).
        -- That run goes on, as one found above.
        ON CONFLICT (owner, key) WHERE state = 'PLAN' AND key IS NOT NULL DO NOTHING
        RETURNING id INTO next_id;
        PERFORM set_config('pgtaskpy.next_run', 'off', true);
        -- (Only where the table has more columns, dropped ones too, than the extension makes: the
        -- call, and its look at the names, cost 15-25 us of every end of a series, columns or none.)
        IF next_id IS NOT NULL
           AND (SELECT c.relnatts FROM pg_catalog.pg_class AS c WHERE c.oid = '@extschema@.task'::pg_catalog.regclass)
               > cardinality(pgtaskpy.own_columns()) THEN
            PERFORM pgtaskpy.copy_user_columns(t, next_id);
        END IF;
        IF next_id IS NULL AND t.key IS NOT NULL THEN
            waiting := pgtaskpy.waiting_run_goes_on(t, series);
        END IF;
    END IF;

    RETURN CASE WHEN retry_at IS NOT NULL THEN next_id END;
END
$$;

-- pg_task's pause of a group whose task ended with a negative max: its waiting
-- tasks wait -max ms.  After the task's dependents are resolved, so that one
-- it released into its group waits too (it ran 10 ms after the task: a probe).
CREATE FUNCTION pgtaskpy.pause_group(t @extschema@.task) RETURNS void
LANGUAGE plpgsql  -- (no SET clause: it runs with finish_task's search_path, as follow_task does)
AS $$
DECLARE
    pause interval := make_interval(secs => -(t.max::bigint) / 1000.0);  -- (a row of 1.2 may hold -2^31)
    anchor timestamptz;  -- what a pause without drift counts from
    paused_until timestamptz;
BEGIN
    PERFORM pgtaskpy.lock_scheduling();  -- these rows may be being claimed
    -- pg_task's pause: the group's waiting tasks wait -max ms after this
    -- one's stop (drift) or until the first multiple of it after this one's
    -- plan that is in the future (no drift, as a repeat's next run: plan +
    -- the pause alone was past for a group running late, and its tasks ran
    -- with no pause at all); the first of them to run pushes the rest on
    -- again when it ends.  Only the owner's own tasks: groups are shared by
    -- roles, and one role's task must not hold back another's for up to 24 days.
    IF t.drift THEN
        paused_until := t.stop + pause;
    ELSE
        -- (from the end of the pause the task waited for, when that is later than its plan: one
        -- that came due during a pause keeps its plan, and the next pause, counted from that
        -- plan, was over 0.14 s after it ran, a review)
        anchor := greatest(t.plan, (SELECT s.until FROM pgtaskpy.group_spacing AS s
                                    WHERE s.owner = t.owner AND s.hash = t.hash));
        paused_until := anchor + pause * greatest(ceil(extract(epoch FROM clock_timestamp() - anchor)
                                                      / extract(epoch FROM pause)), 1);
        IF paused_until <= clock_timestamp() THEN
            paused_until := paused_until + pause;
        END IF;
    END IF;
    -- (those with a negative max alone: one of max 2 in the group runs up to three at once, with
    -- no pause; nor one whose `active` has run out, which expires rather than run after the pause.
    -- Not one a client holds, SKIP LOCKED: waited for under the scheduling lock, a task author's
    -- SELECT ... FOR UPDATE of one held back every role's tasks, a probe; waited for before the
    -- lock, an end in a burst or a launcher's turn waited, and clients locking two deadlocked with
    -- it, a review.  The pause's row below holds it back all the same, its plan unchanged, as one
    -- that comes due during the pause: its `active` counts on, README's `max`.)
    UPDATE @extschema@.task AS task
    SET plan = paused_until
    WHERE task.id = ANY (ARRAY(
        SELECT w.id FROM @extschema@.task AS w
        WHERE w.hash = t.hash AND w.state = 'PLAN' AND w.waiting_for = 0 AND w.owner = t.owner
          AND w.max < 0 AND w.plan < paused_until AND w.plan + w.active > clock_timestamp()
        FOR NO KEY UPDATE SKIP LOCKED));
    -- Those that come due during the pause wait for its end too (claims pass over them).
    INSERT INTO pgtaskpy.group_spacing AS s (owner, hash, until) VALUES (t.owner, t.hash, paused_until)
    ON CONFLICT (owner, hash) DO UPDATE SET until = greatest(s.until, excluded.until);
END
$$;

-- Whether the owner's group is in the pause after one of its tasks with a negative max ran
-- (pause_group) at `at`: its tasks with a negative max wait for its end.  A probe of the key.
CREATE FUNCTION pgtaskpy.group_spaced(task_owner name, group_hash integer, at timestamptz) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT FROM pgtaskpy.group_spacing AS s
                   WHERE s.owner = task_owner AND s.hash = group_hash AND s.until > at)
$$;

-- End waiting tasks FAIL with the same error (a bad setting, say) and SQLSTATE, each in its
-- own subtransaction so that one that cannot end does not hold back the rest
-- nor the launcher's turn.  Returns how many ended.
CREATE FUNCTION pgtaskpy.fail_waiting_tasks(ids bigint[], error text, error_sqlstate text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    waiting record;
    failed integer := 0;
BEGIN
    FOR waiting IN
        SELECT t.id, t.input FROM @extschema@.task AS t
        WHERE t.id = ANY (ids) AND t.state = 'PLAN'
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        IF pgtaskpy.end_task_safely(waiting.id, 'FAIL', error || E'\nSTATEMENT:  ' || replace(waiting.input, E'\n', E'\n\t'),
                                    '{PLAN}', error_sqlstate) THEN
            failed := failed + 1;
        END IF;
    END LOOP;
    RETURN failed;
END
$$;

-- finish_task for housekeeping, which ends other roles' tasks one by one: an
-- error ending one is logged as a warning, and the next is ended all the same.
-- A lock it waits for a second (a named series' advisory key, which any role
-- may hold; a client's row) is such an error: the launcher ends the task at a
-- later turn, rather than wait under the scheduling lock, holding up every
-- claim, for as long as the holder likes.
CREATE FUNCTION pgtaskpy.end_task_safely(
    task_id bigint, end_state @extschema@.state, task_error text, from_states @extschema@.state[],
    task_sqlstate text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET lock_timeout = '1s'
AS $$
BEGIN
    RETURN pgtaskpy.finish_task(task_id, end_state, NULL, task_error, from_states,
                                task_sqlstate => task_sqlstate) IS NOT NULL;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pg_task_py: could not end task % %: %', task_id, end_state, SQLERRM;
    RETURN false;
END
$$;

-- Whether `backend` is a live backend of this database with the name of one of
-- the scheduler's `kinds` (pgtaskpy.name_of) that started no later than `since`
-- (NULL: any time).  A pid alone is not enough: a restored copy of the database
-- holds pids of another database's backends, and pids are reused.  A claim
-- (TAKE) is held by a launcher or a worker; a run (WORK) by a worker only, which
-- started before it: after a failover the new primary's launcher, connected
-- while it was a standby, can have the pid of a run's worker on the old primary
-- (the run stayed WORK, and held its group's slot, as long as that launcher ran).
CREATE FUNCTION pgtaskpy.scheduler_backend_alive(backend integer, since timestamptz, kinds text[]) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT FROM pg_catalog.pg_stat_get_activity(backend) AS a  -- (NULL would list every backend)
        WHERE backend IS NOT NULL
          AND a.datid = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = pg_catalog.current_database())
          AND a.application_name OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT pgtaskpy.name_of(k) FROM unnest(kinds) AS k))
          AND (since IS NULL OR a.backend_start OPERATOR(pg_catalog.<=) since))
$$;

-- Whether a backend (its role's oid, its start, its application_name) can be the session of
-- the running task t: one started before the task, logged in as its owner, or named as the
-- scheduler names a task's session (the owner renamed or dropped under the running session,
-- another role perhaps made with its name).  The pid is the scheduler's to write, but a row an
-- administrator wrote by hand with another backend's pid in it must not reach that backend (a
-- superuser's query).
CREATE FUNCTION pgtaskpy.may_be_task_session(t @extschema@.task, session_role oid, session_start timestamptz,
                                             session_name text)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT session_start <= t.start
       AND (session_role = to_regrole(quote_ident(t.owner)) OR session_name = pgtaskpy.name_of('task'))
$$;

-- Whether the session of a run whose worker is gone has ended.  The worker
-- was the session's only client, but a backend notices a closed client only
-- when it next reads or writes: a running query goes on, may commit, and a
-- series' next run would start beside it.  So a local session still there (a
-- backend of this database that may_be_task_session: a pid alone may be
-- reused) is terminated, and the run ends once
-- it is gone (a later call: the next housekeeping turn).  So is a standby
-- task's when it is here after all: run here for want of a standby, or on the
-- standby this server was until its promotion (its pid fits as a local one's).
-- A remote task's session is too when it is on this server (another database
-- of it), named as a task's session; on another server, or a standby's
-- elsewhere, it is out of reach: true.
-- False, and nothing done, while the worker is alive: the run is not lost.
-- Only a backend that runs the task's input (or ran it last, or commits it) is
-- terminated: after a failover the row's pid is the old primary's, and a backend
-- here of that pid, the owner's, older than the run (an application's session on
-- the standby this server was) was terminated (a probe).  A session the worker left
-- before the input ends by itself: its client is gone, and it is idle.
CREATE FUNCTION pgtaskpy.lost_session_ended(t @extschema@.task) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old_level text := current_setting('client_min_messages');
BEGIN
    IF t.state <> 'WORK' OR pgtaskpy.scheduler_backend_alive(t.worker, t.start, '{worker}') THEN
        RETURN false;
    END IF;
    IF t.pid IS NULL OR NOT EXISTS (
        SELECT FROM pg_stat_get_activity(t.pid) AS a
        -- (a remote task's on this server, another database of it: its query ran on beside the
        -- series' next run, one key's two runs at once, a probe.  Named as a task's session, as
        -- the worker names it: a pid of another server's may be a local application's, running
        -- the same query, which a review's call terminated.)
        WHERE (a.datid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
               OR t.remote IS NOT NULL AND a.application_name = pgtaskpy.name_of('task')
                  -- (not while the row's worker runs on in another database of this server: the
                  -- row is a copy of that database's run, restored beside it by pg_restore, and
                  -- the copy's launcher terminated the source's live run, a probe)
                  AND NOT EXISTS (SELECT FROM pg_stat_get_activity(t.worker) AS w  -- (NULL: every backend)
                                  WHERE t.worker IS NOT NULL
                                    AND w.datid <> (SELECT d.oid FROM pg_database AS d
                                                    WHERE d.datname = current_database())
                                    AND w.application_name = pgtaskpy.name_of('worker')
                                    AND w.backend_start <= t.start))
          AND pgtaskpy.may_be_task_session(t, a.usesysid, a.backend_start, a.application_name)
          AND (a.query <> '' AND starts_with(t.input, a.query) OR a.query = 'COMMIT' AND a.state = 'active')) THEN
        RETURN true;
    END IF;
    -- (a session that ends between the look and the signal makes the signal warn "PID ... is
    -- not a PostgreSQL backend process", which the launcher logs: it ended, as was wanted)
    PERFORM set_config('client_min_messages', 'error', true);
    PERFORM pg_terminate_backend(t.pid);
    PERFORM set_config('client_min_messages', old_level, true);
    RETURN false;
END
$$;

-- Tasks whose backend is gone.  TAKE: the claiming launcher died before a
-- worker started the task, so it never ran: back to PLAN.  WORK: the task may
-- have run in part, so it is not run again (at most once): FAIL once its
-- session has ended (lost_session_ended), and a repeating task goes on with
-- its next run.  Housekeeping, once a second.
CREATE FUNCTION pgtaskpy.recover_orphaned_tasks() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    orphan @extschema@.task;
    recovered integer := 0;
BEGIN
    recovered := pgtaskpy.unclaim_tasks(
        ARRAY(SELECT t.id FROM @extschema@.task AS t
              WHERE t.state = 'TAKE' AND NOT pgtaskpy.scheduler_backend_alive(t.worker, NULL,
                                                                '{launcher,stopping launcher,worker}')), NULL);

    FOR orphan IN
        SELECT t.* FROM @extschema@.task AS t
        WHERE t.state = 'WORK' AND NOT pgtaskpy.scheduler_backend_alive(t.worker, t.start, '{worker}')
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        IF pgtaskpy.lost_session_ended(orphan) AND pgtaskpy.end_task_safely(orphan.id, 'FAIL',
            E'ERROR:  task worker ended before the task finished\n'
            || E'HINT:  its backend was terminated, the server restarted, or the worker could not write the end'
            || E' (a launcher''s role that lost SUPERUSER, a trigger on task that failed it: see the launcher''s log);'
            || CASE WHEN orphan.retry_unsafe AND orphan.attempt <= orphan.retry
                         AND NOT EXISTS (SELECT FROM pgtaskpy.cancelled_run AS c  -- (a user's cancel: retry_plan)
                                         WHERE c.task_id = orphan.id AND NOT c.by_stop)
                    THEN E' its retry_unsafe runs it again, a minute from now at the earliest\n'
                    ELSE E' the task is not run again\n' END
            || 'STATEMENT:  ' || replace(orphan.input, E'\n', E'\n\t'), '{WORK}', pgtaskpy.lost_run_sqlstate()) THEN
            recovered := recovered + 1;
        END IF;
    END LOOP;
    -- (the marks of cancels whose tasks have ended: read by their ends already)
    DELETE FROM pgtaskpy.cancelled_run AS c
    WHERE NOT EXISTS (SELECT FROM @extschema@.task AS t WHERE t.id = c.task_id AND t.state IN ('TAKE', 'WORK'));
    -- (pauses that are over, once no task of the group runs: pause_group counts on from it)
    DELETE FROM pgtaskpy.group_spacing AS s
    WHERE s.until <= now()
      AND NOT EXISTS (SELECT FROM @extschema@.task AS r
                      WHERE r.state IN ('TAKE', 'WORK') AND r.hash = s.hash AND r.owner = s.owner);
    RETURN recovered;
END
$$;

-- A scheduler setting (pg_task_py.*) as set for this database (ALTER DATABASE
-- ... SET), else in the server's configuration files.  Read afresh on each
-- call, from the catalog and the files: worker backends and the launcher's
-- session live long and keep the values they connected with (an ALTER
-- DATABASE ... RESET would go unseen), and a task's own session could change
-- them.  The files are read only when the session has a value at all.
CREATE FUNCTION pgtaskpy.scheduler_setting(name text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN COALESCE(
        (SELECT substr(c, length(name) + 2)
         FROM pg_db_role_setting AS s CROSS JOIN unnest(s.setconfig) AS c
         WHERE s.setrole = 0 AND starts_with(c, name || '=')
           AND s.setdatabase = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())),
        CASE WHEN current_setting(name, true) IS NOT NULL THEN
            (SELECT f.setting FROM pg_file_settings AS f
             WHERE f.name = scheduler_setting.name AND f.error IS NULL
             ORDER BY f.seqno DESC LIMIT 1)
        END);
END
$$;

-- Where a scheduler setting comes from, for messages: 'database "app"' or
-- 'the server configuration'.
CREATE FUNCTION pgtaskpy.scheduler_setting_source(name text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN EXISTS (
        SELECT FROM pg_db_role_setting AS s CROSS JOIN unnest(s.setconfig) AS c
        WHERE s.setrole = 0 AND starts_with(c, name || '=')
          AND s.setdatabase = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()))
    THEN format('database %I', current_database()) ELSE 'the server configuration' END
$$;

-- A scheduler setting the scheduler ignores, said once per value in a backend:
-- the launcher reads its settings every second, and the server's log got the
-- same line each time (86,400 a day).  `whose`: 'of database "app"', 'for role
-- app'.  The launcher shows its session's warnings in its own log too.
CREATE FUNCTION pgtaskpy.warn_ignored_setting(name text, setting text, whose text, why text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    said text := 'pgtaskpy.warned_' || md5(name || ' ' || whose);
BEGIN
    IF current_setting(said, true) IS DISTINCT FROM setting THEN
        RAISE WARNING 'pg_task_py: ignoring % = "%" %: %', name, setting, whose, why;
        PERFORM set_config(said, setting, false);
    END IF;
END
$$;

-- Delete the finished tasks `ids` (locked by the caller) for retention or
-- keep_runs, all in one statement.  A row that another table still references
-- by a foreign key without ON DELETE CASCADE or SET NULL, or whose DELETE a
-- DBA's trigger refuses, fails that statement, and the whole batch with it
-- (a refusal failed every launcher turn, and no task of the database started):
-- then they are deleted one at a time, each in a
-- subtransaction of its own, those refused kept, for the first of them only
-- (at most 100 such deletes a call of delete_old_tasks, in all: the session's
-- pgtaskpy.one_by_one_left).  `looked`: how many of the first ids were
-- dealt with (all, unless the batch failed); `one_by_one`: the batch failed.
-- The kept ones are counted in pgtaskpy.retention_kept, which the launcher
-- reports.
--
-- No deletion waits for a lock more than 10 ms: the rows an ON DELETE CASCADE or SET NULL
-- reaches are another table's, which a client may hold (SELECT ... FOR UPDATE of its own row
-- that references a task), and housekeeping holds the scheduling lock: the wait held back
-- every role's tasks for as long as that client's transaction lasted (a probe).  A row whose
-- deletion would wait is kept (counted), and the ones after it are left to the next call.
CREATE FUNCTION pgtaskpy.delete_finished(ids bigint[], OUT deleted integer, OUT looked integer,
                                        OUT one_by_one boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    budget integer := COALESCE(NULLIF(current_setting('pgtaskpy.one_by_one_left', true), ''), '0')::integer;
    task_id bigint;
    n integer;
    kept integer := 0;
    refusal_sqlstate text;
    lock_wait text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '10ms', true);
    BEGIN
        DELETE FROM @extschema@.task AS t WHERE t.id = ANY (ids);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        looked := cardinality(ids);
        one_by_one := false;
        PERFORM set_config('lock_timeout', lock_wait, true);
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS refusal_sqlstate = RETURNED_SQLSTATE;
        IF pgtaskpy.server_trouble(refusal_sqlstate) AND refusal_sqlstate <> '55P03' THEN  -- (lock_not_available)
            PERFORM set_config('lock_timeout', lock_wait, true);
            RAISE;
        END IF;
        deleted := 0;
        one_by_one := true;
    END;
    looked := 0;
    FOREACH task_id IN ARRAY ids[1:least(cardinality(ids), budget)] LOOP
        looked := looked + 1;
        BEGIN
            DELETE FROM @extschema@.task AS t WHERE t.id = task_id;
            GET DIAGNOSTICS n = ROW_COUNT;
            deleted := deleted + n;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS refusal_sqlstate = RETURNED_SQLSTATE;
            IF pgtaskpy.server_trouble(refusal_sqlstate) AND refusal_sqlstate <> '55P03' THEN
                PERFORM set_config('lock_timeout', lock_wait, true);
                RAISE;
            END IF;
            kept := kept + 1;
            EXIT WHEN refusal_sqlstate = '55P03';  -- (one wait a call at most)
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', lock_wait, true),
            set_config('pgtaskpy.one_by_one_left', (budget - looked)::text, false),
            set_config('pgtaskpy.retention_kept',
                       (COALESCE(NULLIF(current_setting('pgtaskpy.retention_kept', true), ''), '0')::integer
                        + kept)::text, false);
END
$$;

-- pg_task_py.retention: finished tasks (DONE, FAIL, GONE, STOP) whose stop is
-- older than this are deleted, a batch at a time, so the table stays small.
-- DONE and FAIL rows keep their own time when pg_task_py.retention_done or
-- pg_task_py.retention_fail is set; then pg_task_py.keep_runs trims long
-- series (70_operating.sql).  One batch a call, in all: housekeeping holds
-- the scheduling lock meanwhile.
--
-- Rows that other tables still reference are kept (delete_finished), and the
-- rows after them are deleted all the same: each state's rows are read on
-- after the last one looked at one by one (pgtaskpy.retention_after, in this
-- session), and from the oldest again 10 s after such a pass began, once
-- none is left past it, for the rows whose references are gone by then.
CREATE FUNCTION pgtaskpy.delete_old_tasks(batch integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    retention interval := pgtaskpy.retention_setting('pg_task_py.retention', NULL);
    policy record;  -- a state and how long its rows are kept
    -- {state: [stop, id, epoch when the pass began]} of the last row kept a state
    after jsonb := COALESCE(NULLIF(current_setting('pgtaskpy.retention_after', true), ''), '{}')::jsonb;
    resume jsonb;
    ids bigint[];
    stops timestamptz[];
    result record;
    deleted integer := 0;
BEGIN
    -- (A deferred foreign key is checked at the deletion, not at the launcher's commit: its
    -- turn makes constraints immediate, Context.make_constraints_immediate in plans.py.)
    PERFORM set_config('pgtaskpy.one_by_one_left', '100', false),  -- (see delete_finished)
            set_config('pgtaskpy.retention_kept', '0', false);
    FOR policy IN
        SELECT s.state, s.retention
        FROM (VALUES ('DONE'::@extschema@.state, pgtaskpy.retention_setting('pg_task_py.retention_done', retention)),
                     ('FAIL', pgtaskpy.retention_setting('pg_task_py.retention_fail', retention)),
                     ('GONE', retention), ('STOP', retention)) AS s(state, retention)
        WHERE s.retention IS NOT NULL
    LOOP
        resume := after -> policy.state::text;
        -- (state, stop): the index of finished rows by state, so that rows one
        -- state keeps longer are never read for another's
        SELECT array_agg(f.id ORDER BY f.stop, f.id), array_agg(f.stop ORDER BY f.stop, f.id) INTO ids, stops
        FROM (SELECT f.id, f.stop FROM @extschema@.task AS f
              WHERE f.state IN ('DONE', 'FAIL', 'GONE', 'STOP') AND f.state = policy.state
                AND f.stop < now() - policy.retention
                -- (a failed run whose retry waits or runs: a series' retry finds the beat in it, and a
                -- dependent whose INSERT was open as it failed follows it to its retry; deleted, a
                -- one-off's let that dependent stop, and task_retry run it again beside its retry)
                AND NOT (f.state = 'FAIL' AND f.attempt <= f.retry AND pgtaskpy.retry_pending(f.id, f.attempt, f.owner))
                AND (resume IS NULL OR f.stop >= (resume ->> 0)::timestamptz
                                       AND (f.stop, f.id) > ((resume ->> 0)::timestamptz, (resume ->> 1)::bigint))
              ORDER BY f.state, f.stop, f.id LIMIT batch - deleted
              FOR UPDATE SKIP LOCKED) AS f;
        IF ids IS NULL THEN
            IF resume IS NOT NULL AND extract(epoch FROM now()) - (resume ->> 2)::float8 >= 10 THEN
                after := after - policy.state::text;  -- a new pass, from the oldest
            END IF;
            CONTINUE;
        END IF;
        result := pgtaskpy.delete_finished(ids);
        deleted := deleted + result.deleted;
        IF result.one_by_one AND result.looked > 0 THEN  -- some may be kept: on after the last looked at
            after := jsonb_set(after, ARRAY[policy.state::text],
                               jsonb_build_array(stops[result.looked], ids[result.looked],
                                                 COALESCE((resume ->> 2)::float8, extract(epoch FROM now()))));
        END IF;
        EXIT WHEN deleted >= batch;
    END LOOP;
    PERFORM set_config('pgtaskpy.retention_after', after::text, false);
    IF deleted >= batch THEN
        RETURN deleted;
    END IF;
    RETURN deleted + pgtaskpy.delete_surplus_runs(batch - deleted);
END
$$;

-- A retention setting (pg_task_py.retention*) as an interval: `fallback` when
-- it is not set, NULL (keep all) with a warning in the server log when it is
-- not an interval of zero or more.
CREATE FUNCTION pgtaskpy.retention_setting(name text, fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := NULLIF(pgtaskpy.scheduler_setting(name), '');
    retention interval;
BEGIN
    IF setting IS NULL THEN
        RETURN fallback;
    END IF;
    -- A number without a unit reads as seconds: `retention_fail = 30`, meant as days, deleted every
    -- failure older than half a minute (a probe).  Refused, also last after others (`1 day 30`,
    -- `@ 30`), but for a lone 0, which is 0 in any unit.
    IF setting ~ '(^|[\s@])[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$'
       AND setting !~ '^\s*[-+]?(0+\.?0*|\.0+)([eE][-+]?[0-9]+)?\s*$' THEN
        PERFORM pgtaskpy.warn_ignored_setting(name, setting, 'of ' || pgtaskpy.scheduler_setting_source(name),
                                              'a number without a unit: write one, as ''30 days'' or ''12 hours''');
        RETURN NULL;
    END IF;
    BEGIN
        retention := setting::interval;
    EXCEPTION WHEN data_exception THEN
        retention := interval '-1 s';
    END;
    IF retention < interval '0' THEN
        PERFORM pgtaskpy.warn_ignored_setting(name, setting, 'of ' || pgtaskpy.scheduler_setting_source(name),
                                              'not an interval of zero or more');
        RETURN NULL;
    END IF;
    -- (longer keeps no more: no row is that old, and now() - '7000 years' is out of range, which
    -- failed every launcher turn of the database)
    RETURN least(retention, interval '1000 years');
END
$$;

-- Waiting tasks that were not started within `active` after their plan, up to
-- 1,000 a call (the launcher calls again soon while it gets a full batch).
-- Most have nothing to follow their end: those end together
-- (end_waiting_tasks), at a fifth of the cost of a finish_task each.  That
-- matters after a launcher was down for longer than `active`: 100,000 expired
-- tasks cost each claim of their group a row each until they are gone (90 ms
-- a claim), and ending them one by one held the scheduling lock 0.3-0.5 s a
-- second for 100 s.  The others (a series' run, and a batch that a trigger of
-- the DBA's refuses) end one by one, as before.
CREATE FUNCTION pgtaskpy.expire_inactive_tasks() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    late bigint[];
    together bigint[] := '{}';
    one bigint;
    expired integer := 0;
BEGIN
    late := ARRAY(
        SELECT t.id FROM @extschema@.task AS t
        WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.plan <= now() AND t.plan + t.active <= now()
          AND NOT pgtaskpy.group_paused(t.owner, t."group")  -- (a paused group's tasks wait: 70_operating.sql)
        ORDER BY t.plan LIMIT 1000
        FOR NO KEY UPDATE SKIP LOCKED);
    BEGIN
        together := pgtaskpy.end_waiting_tasks(late, 'GONE', 'ERROR:  task not active');
    EXCEPTION WHEN OTHERS THEN
        NULL;  -- (each one by one below: end_task_safely logs the one that cannot end)
    END;
    FOR one IN SELECT l.id FROM unnest(late) AS l(id) EXCEPT SELECT g.id FROM unnest(together) AS g(id) LOOP
        IF pgtaskpy.end_task_safely(one, 'GONE', 'ERROR:  task not active', '{PLAN}') THEN
            expired := expired + 1;
        END IF;
    END LOOP;
    RETURN expired + cardinality(together);
END
$$;

-- Seconds until a waiting task may be claimed that this turn's claim could
-- not (NULL: none): the earliest planned task that is not due yet, or the
-- earliest a group the claim left for its rate limit has room again
-- (pgtaskpy.rate_room_returns, noted for the transaction by claim_due_tasks).
-- ORDER BY ... LIMIT 1 rather than min(): a table not analyzed since a bulk
-- insert looks one row long, and min() was then computed over every waiting
-- task (12 ms a turn with 50,000).  PL/pgSQL, like groups_due_soon: its plan
-- is kept, where an SQL function with SET is planned on every call (0.15 ms).
-- enable_sort off: read from the plan index alone, as claim_due_tasks.
CREATE FUNCTION pgtaskpy.seconds_to_next_plan() RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off SET jit = off
AS $$
BEGIN
    RETURN least(
        (SELECT extract(epoch FROM t.plan - clock_timestamp())::double precision
         FROM @extschema@.task AS t
         WHERE t.state = 'PLAN' AND t.waiting_for = 0 AND t.plan > now() AND isfinite(t.plan)  -- (rows from before the bounds)
         ORDER BY t.plan LIMIT 1),
        nullif(current_setting('pgtaskpy.rate_room_returns', true), '')::double precision
            - extract(epoch FROM clock_timestamp())::double precision);
END
$$;

-- How many groups (at most `most`) have waiting tasks coming due within
-- `seconds`: the launcher has as many workers ready by then (dispatch.py,
-- warm_workers), so that a minute's cron runs start at once.  It reads the
-- tasks coming due in plan order, at most 4 most + 32 of them, so that its
-- cost does not grow with the tasks planned further ahead: the window's bounds
-- are subqueries, computed once and so bounds of the plan index, where
-- clock_timestamp() in the condition itself made it read every waiting task
-- (23 ms a turn with 50,000 planned for tomorrow).  (clock_timestamp: a task
-- that came due since the turn began is the next turn's to claim, not one to
-- warm a worker for.)  enable_sort off: from the plan index alone, as
-- claim_due_tasks (a table never analyzed since a bulk load had the priority
-- index read whole and sorted: 37 ms a turn with 100,000 planned for tomorrow).
CREATE FUNCTION pgtaskpy.groups_due_soon(seconds double precision, most integer) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off SET jit = off
AS $$
BEGIN
    RETURN (SELECT least(count(DISTINCT s.hash), most)::integer FROM (
                SELECT t.hash FROM @extschema@.task AS t
                WHERE t.state = 'PLAN' AND t.waiting_for = 0
                  AND t.plan > (SELECT clock_timestamp())
                  AND t.plan <= (SELECT clock_timestamp() + seconds * interval '1 second')
                ORDER BY t.plan
                LIMIT 4 * most + 32) AS s);
END
$$;

-- Whose session a spare worker starts ahead (run_task's warm-up, dispatch.py
-- warm_workers): the owner of the task coming due next within `seconds`, else
-- of the latest task.  A lone task is most often of the role whose tasks came
-- before it, and finds a session of its owner started; a session of the
-- launcher's role was of use only to that role's tasks, and every other role's
-- lone task waited for a new session (7.1 ms from plan to start, not 2.7:
-- bench/RESULTS.md).  The worker's own role (a superuser, whom no connection
-- limit counts) for an empty table, for a role that cannot log in, and for one
-- a connection limit counts (CONNECTION LIMIT of the role or the database): a
-- session held ahead would take one of its slots.
CREATE FUNCTION pgtaskpy.owner_to_start_ahead(seconds double precision) RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off SET jit = off  -- (as groups_due_soon)
AS $$
DECLARE
    likely name;
BEGIN
    likely := coalesce(
        (SELECT t.owner FROM @extschema@.task AS t
         WHERE t.state = 'PLAN' AND t.waiting_for = 0
           AND t.plan > (SELECT clock_timestamp())
           AND t.plan <= (SELECT clock_timestamp() + seconds * interval '1 second')
         ORDER BY t.plan LIMIT 1),
        (SELECT t.owner FROM @extschema@.task AS t ORDER BY t.id DESC LIMIT 1));
    IF likely IS DISTINCT FROM current_user AND NOT EXISTS (
        SELECT FROM pg_roles AS r
        WHERE r.rolname = likely AND r.rolcanlogin
          AND (r.rolsuper OR (r.rolconnlimit = -1 AND (SELECT d.datconnlimit FROM pg_database AS d
                                                       WHERE d.datname = current_database()) = -1))) THEN
        likely := NULL;
    END IF;
    RETURN coalesce(likely, current_user);
END
$$;

-- Only the launcher (a superuser) schedules.
REVOKE ALL ON FUNCTION pgtaskpy.take_claimed(bigint[], integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.fail_skipped_claims(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.claim_due_tasks(integer, integer, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.warn_ignored_setting(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.groups_due_soon(double precision, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.owner_to_start_ahead(double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.lock_scheduling() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.lock_scheduling_shared() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.try_lock_owner(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.launcher_accepts(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.claim_next_task(integer, integer, integer, name, text, integer, interval, bigint)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.claim_next_in_group(integer, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.upcoming_in_group(integer, integer, bigint, name, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.unclaim_tasks(bigint[], integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.start_task(bigint, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.move_task_to_session(bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.finish_task(bigint, @extschema@.state, text, text, @extschema@.state[], text, boolean, text,
                                         timestamptz)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.follow_task(@extschema@.task, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.pause_group(@extschema@.task) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.group_spaced(name, integer, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.waiting_run_goes_on(@extschema@.task, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.end_series(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.retry_plan(@extschema@.task) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.retry_pending(bigint, integer, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.fail_waiting_tasks(bigint[], text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.end_waiting_tasks(bigint[], @extschema@.state, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.end_task_safely(bigint, @extschema@.state, text, @extschema@.state[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.fail_misconfigured_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.recover_orphaned_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.lost_session_ended(@extschema@.task) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.expire_inactive_tasks() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.delete_old_tasks(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.delete_finished(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.retention_setting(text, interval) FROM PUBLIC;
