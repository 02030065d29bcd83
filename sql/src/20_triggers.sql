-- Row checks that a CHECK constraint cannot express, and the wake-up of launchers.

CREATE FUNCTION pgtaskpy.check_owner() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A task runs as its owner, so naming another role would borrow its privileges.
    IF NEW.owner IS DISTINCT FROM current_user
       AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT (EXISTS (SELECT FROM pg_roles WHERE rolname = NEW.owner)
                AND pg_has_role(current_user, NEW.owner, 'MEMBER')) THEN
        RAISE EXCEPTION 'permission denied to set task.owner to "%"', NEW.owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Leave owner at its default (current_user), or be a member of that role.';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.owner IS DISTINCT FROM OLD.owner
       AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'permission denied to change task.owner'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER task_check_owner
    BEFORE INSERT OR UPDATE OF owner ON @extschema@.task
    FOR EACH ROW EXECUTE FUNCTION pgtaskpy.check_owner();

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
