-- Who may see and change which tasks.  A task runs as its owner, so a role
-- that could edit another role's task could run SQL with that role's
-- privileges: row-level security confines each role to its own tasks.
-- Superusers (the launcher) bypass it; members of pgtaskpy_admin see all.

GRANT USAGE ON SCHEMA pgtaskpy TO PUBLIC;  -- column defaults and triggers call into it

DO $$
BEGIN
    -- Roles are cluster-wide: the first database to create the extension makes them.  Two
    -- databases' scripts at once may both find a role missing; the later CREATE ROLE then
    -- fails on pg_authid's key once the other commits (a probe: 3 of 4 CREATE EXTENSION at
    -- once failed), and the role is there, which is all the script needs.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgtaskpy_admin') THEN
        BEGIN
            CREATE ROLE pgtaskpy_admin NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgtaskpy_user') THEN
        BEGIN
            CREATE ROLE pgtaskpy_user NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$$;

-- What a task author needs, in one role: GRANT pgtaskpy_user TO alice.  Row-level
-- security below still confines each role to its own tasks.
GRANT USAGE ON SCHEMA @extschema@ TO pgtaskpy_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.task TO pgtaskpy_user;
GRANT USAGE ON SEQUENCE @extschema@.task_id_seq TO pgtaskpy_user;
-- An admin is a task author too: granted pgtaskpy_admin alone, a role could steer everyone's
-- groups but not read the table or task_stats.  (Once: roles are cluster-wide, and a second
-- grant says so in a NOTICE.)
DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('pgtaskpy_admin', 'pgtaskpy_user', 'MEMBER') THEN
        GRANT pgtaskpy_user TO pgtaskpy_admin;
    END IF;
END
$$;

ALTER TABLE @extschema@.task ENABLE ROW LEVEL SECURITY;

CREATE POLICY task_owner_or_admin ON @extschema@.task
    USING (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'))
    WITH CHECK (owner = current_user OR pg_catalog.pg_has_role('pgtaskpy_admin', 'MEMBER'));

-- The caller's right to a task, for the privileged (SECURITY DEFINER) halves of task_cancel,
-- task_unschedule and a stopped series' next run.  There, current_user is their owner, and
-- session_user may be a superuser's session that called a task author's SECURITY DEFINER
-- function (which then acted on any role's tasks): neither is the calling role.  The public
-- half inserts a row here in the same transaction, which row-level security lets through
-- only for a task the calling role sees, or for that role's own name; the privileged half
-- takes it (pgtaskpy.take_steering_proof).  Nobody but the scheduler reads or deletes one.
CREATE TABLE pgtaskpy.steering_proof (
    xact xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    task_id bigint,
    owner name
);
CREATE INDEX steering_proof_xact ON pgtaskpy.steering_proof (xact);  -- (a role may insert millions)
ALTER TABLE pgtaskpy.steering_proof REPLICA IDENTITY FULL;  -- (no key: see group_count_changes')
ALTER TABLE pgtaskpy.steering_proof ENABLE ROW LEVEL SECURITY;
CREATE POLICY seen_by_the_caller ON pgtaskpy.steering_proof FOR INSERT
    WITH CHECK (xact = pg_catalog.pg_current_xact_id()
                AND (task_id IS NULL OR EXISTS (SELECT FROM @extschema@.task AS t WHERE t.id = task_id))
                AND (owner IS NULL OR owner = current_user));
GRANT INSERT ON pgtaskpy.steering_proof TO PUBLIC;  -- (task_cancel is any task author's, granted by hand too)
