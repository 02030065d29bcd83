-- The two PL/Python entry points of the scheduler.  Their source is in
-- sql/plpython/*.py; sql/build.py pastes it between the $python$ quotes.

-- Runs in a worker backend (a dblink connection of the launcher's session).
-- A procedure, so that it can commit WORK before the input runs and the end
-- state after.  No SET clause: a procedure with one cannot commit, so every
-- name inside is schema-qualified instead.  `report` comes back to the
-- launcher: the tasks the worker started and ended (it may go on with its
-- group's next tasks) and the session it keeps.
CREATE PROCEDURE pgtaskpy.run_task(task_id bigint, claimer integer, INOUT report jsonb DEFAULT NULL)
LANGUAGE plpython3u
AS $python$
{{ plans.py libpq.py output.py sessions.py task_rows.py run_task.py }}
$python$;

-- The same for a burst's tasks that each start a new local session: one worker
-- runs them all side by side (dispatch.py gives it up to TASKS_A_WORKER).
CREATE PROCEDURE pgtaskpy.run_tasks(task_ids bigint[], claimer integer, INOUT report jsonb DEFAULT NULL)
LANGUAGE plpython3u
AS $python$
{{ plans.py libpq.py output.py sessions.py task_rows.py run_task.py run_batch.py }}
$python$;

-- One turn of the scheduler, in the launcher's session.
CREATE FUNCTION pgtaskpy.dispatch(
    run_limit integer, cancel_running boolean DEFAULT false,
    OUT events jsonb, OUT wake_in double precision, OUT running integer)
LANGUAGE plpython3u SET search_path = pg_catalog, pg_temp
AS $python$
{{ plans.py dispatch.py }}
$python$;

REVOKE ALL ON PROCEDURE pgtaskpy.run_task(bigint, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON PROCEDURE pgtaskpy.run_tasks(bigint[], integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.dispatch(integer, boolean) FROM PUBLIC;
