-- The names of the extension's schemas are fixed.  Its SQL and PL/pgSQL
-- functions name the task table, the state type and pgtaskpy as text, as they
-- were when the extension was installed: were the extension's schema renamed
-- (the database's owner owns `public`, and may rename it), a role could create
-- a view `task` under the old name, and the scheduler and the SECURITY DEFINER
-- halves of the API would read it with their rights (a superuser's).  An
-- ALTER SCHEMA that renames either is refused, whoever runs it.

CREATE FUNCTION pgtaskpy.refuse_schema_rename() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    renamed record;
BEGIN
    FOR renamed IN
        SELECT n.nspname AS now_named, n.oid = e.extnamespace AS of_tables
        FROM pg_event_trigger_ddl_commands() AS c
        JOIN pg_namespace AS n ON c.classid = 'pg_namespace'::regclass AND n.oid = c.objid
        CROSS JOIN pg_extension AS e
        WHERE e.extname = 'pg_task_py'
          AND (n.oid = e.extnamespace OR EXISTS (
                   SELECT FROM pg_depend AS d
                   WHERE d.classid = 'pg_namespace'::regclass AND d.objid = n.oid
                     AND d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid AND d.deptype = 'e'))
    LOOP
        -- (@extschema@ as the script wrote it: quoted as an identifier where it needs to be)
        IF quote_ident(renamed.now_named) <> (CASE WHEN renamed.of_tables THEN '@extschema@' ELSE 'pgtaskpy' END) THEN
            RAISE EXCEPTION 'schema "%" cannot be renamed: the extension pg_task_py lives in it, and its functions name it',
                CASE WHEN renamed.of_tables THEN '@extschema@' ELSE 'pgtaskpy' END
                USING ERRCODE = 'dependent_objects_still_exist',
                      HINT = 'Another role could then create objects under the old name that the scheduler would use.';
        END IF;
    END LOOP;
END
$$;

-- Created once, by the install or the update that brings it (an event trigger
-- has no CREATE OR REPLACE).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger WHERE evtname = 'pg_task_py_schema_names') THEN
        CREATE EVENT TRIGGER pg_task_py_schema_names ON ddl_command_end WHEN TAG IN ('ALTER SCHEMA')
            EXECUTE FUNCTION pgtaskpy.refuse_schema_rename();
    END IF;
END
$$;
