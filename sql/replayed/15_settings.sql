-- Column defaults come from pg_task.<column> settings (SET, ALTER ROLE/DATABASE ... SET,
-- postgresql.conf), read when a row is inserted; a bad value names the setting.

-- Plain SQL without SET, every name and operator qualified (NULLIF would look `=` up on the
-- caller's search_path), so that the planner inlines it, and setting_default with it.
CREATE FUNCTION pgtaskpy.setting(name text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('pg_task.' OPERATOR(pg_catalog.||) name, true) OPERATOR(pg_catalog.=) ''
                THEN NULL
                ELSE pg_catalog.current_setting('pg_task.' OPERATOR(pg_catalog.||) name, true) END
$$;

CREATE FUNCTION pgtaskpy.invalid_setting(name text, type text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'invalid value for setting "pg_task.%": "%"', name, pgtaskpy.setting(name)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = format('pg_task.%s must be a valid %s; fix it with SET, ALTER ROLE ... SET or ALTER DATABASE ... SET.', name, type);
END
$$;

-- A value that parses but breaks its column's rule (SET pg_task.delimiter = ';;') fails the
-- INSERT with the rule, which names the column: this says which of the columns the rule names
-- took its default from a setting now set, for the rule's HINT.  NULL when none did.
CREATE FUNCTION pgtaskpy.settings_behind(rule text, relation regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'The INSERT took its default from ' || string_agg(
               format('pg_task.%s = %L', a.attname, pgtaskpy.setting(a.attname)), ', ' ORDER BY a.attnum)
           || ' (SET, ALTER ROLE ... SET, ALTER DATABASE ... SET or postgresql.conf) unless it gave the column:'
           || ' fix the setting, or give the column a value.'
    FROM pg_attribute AS a
    WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped
      AND rule ~ ('(^|[^a-z_])' || a.attname || '($|[^a-z_])')
      AND pgtaskpy.setting(a.attname) IS NOT NULL
$$;

-- One cast per type, each catching only a bad value: the common path (setting
-- absent) enters no exception block.
CREATE FUNCTION pgtaskpy.cast_setting(name text, fallback anyelement) RETURNS anyelement
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    result fallback%TYPE;
BEGIN
    EXECUTE format('SELECT $1::%s', pg_typeof(fallback)) INTO result USING pgtaskpy.setting(name);
    RETURN result;
EXCEPTION WHEN data_exception THEN
    PERFORM pgtaskpy.invalid_setting(name, pg_typeof(fallback)::text);
    RETURN NULL;
END
$$;

-- Inlined into the table's column defaults (setting above): a row's 21 defaults cost no
-- function call while their settings are unset.  As PL/pgSQL with SET search_path, each was
-- a call and a save and restore of the setting: an insert of 20,000 rows took 0.13 ms a
-- row, not 0.04, and a lone insert 0.5 ms, not 0.35 (bench/RESULTS.md).
CREATE FUNCTION pgtaskpy.setting_default(name text, fallback anyelement) RETURNS anyelement
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN pgtaskpy.setting(name) IS NULL THEN fallback ELSE pgtaskpy.cast_setting(name, fallback) END
$$;
