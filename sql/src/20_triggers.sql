-- The table's row checks and the wake-up of launchers.  Replayed by every
-- upgrade script (sql/build.py): functions and triggers only.

-- Rejects what a task row cannot hold, with the error a CHECK constraint of that
-- name would raise (SQLSTATE 23514), so the name says what is wrong.  A trigger
-- rather than constraints: CHECK constraints are prepared again by every UPDATE
-- statement, the scheduler's too, which never touches these columns; this
-- trigger fires only when they are written.
CREATE FUNCTION pgtaskpy.check_task() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    violated text;
BEGIN
    -- (NULL passes, as in a CHECK constraint: NOT NULL rejects it.)
    violated := CASE
        WHEN NOT NEW.active > interval '0' THEN 'task.active must be a positive interval'
        WHEN NOT NEW.live >= interval '0' THEN 'task.live must not be negative'
        WHEN NOT NEW.repeat >= interval '0' THEN 'task.repeat must not be negative'
        WHEN NOT NEW.timeout >= interval '0' THEN 'task.timeout must not be negative'
        WHEN NOT NEW.count >= 0 THEN 'task.count must not be negative'
        WHEN NOT btrim(NEW.input, E' \t\r\n;') <> '' THEN 'task.input must not be empty'
        WHEN NOT length(NEW.delimiter) = 1 THEN 'task.delimiter must be exactly one character'
        WHEN NOT length(NEW.quote) <= 1 THEN 'task.quote must be at most one character'
        WHEN NOT length(NEW.escape) <= 1 THEN 'task.escape must be at most one character'
    END;
    IF violated IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, violated
            USING ERRCODE = 'check_violation', CONSTRAINT = violated,
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.owner IS NOT DISTINCT FROM OLD.owner THEN
        RETURN NEW;
    END IF;
    -- A task runs as its owner, so naming another role would borrow its privileges.
    IF NEW.owner IS DISTINCT FROM current_user
       AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = NEW.owner)
                AND pg_has_role(current_user, NEW.owner, 'MEMBER')) THEN
        RAISE EXCEPTION 'permission denied to set task.owner to "%"', NEW.owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Leave owner at its default (current_user), or be a member of that role.';
    END IF;
    IF TG_OP = 'UPDATE' AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'permission denied to change task.owner'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER task_check
    BEFORE INSERT OR UPDATE OF active, live, repeat, timeout, count, input, delimiter, quote, escape, owner
    ON @extschema@.task
    FOR EACH ROW EXECUTE FUNCTION pgtaskpy.check_task();

-- Launchers LISTEN on this channel: a new or re-planned task wakes them at once
-- instead of at the next poll.  Identical notifications of one transaction are
-- delivered once, so a bulk INSERT sends one.
CREATE FUNCTION pgtaskpy.notify_launchers() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('pg_task_py', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER task_notify_insert
    AFTER INSERT ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state = 'PLAN')
    EXECUTE FUNCTION pgtaskpy.notify_launchers();

CREATE TRIGGER task_notify_update
    AFTER UPDATE OF state, plan ON @extschema@.task
    FOR EACH ROW WHEN (NEW.state = 'PLAN' AND (OLD.state <> 'PLAN' OR NEW.plan < OLD.plan))
    EXECUTE FUNCTION pgtaskpy.notify_launchers();
