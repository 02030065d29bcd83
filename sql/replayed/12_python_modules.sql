-- The worker's and the scheduler's Python (sql/plpython/*.py), compiled once by
-- this script rather than by every new backend: a new worker compiled the 2,600
-- lines of its body (about 20-30 ms of its start's CPU) before its first task.
-- sql/build.py writes the routines that run them as short loaders of these
-- modules.

-- Each module's bytecode for the server's Python, by its file name: marshal's,
-- compressed (zlib) and in base64, which a new backend reads in about a
-- millisecond (marshal's in hex took 10 ms to parse).
CREATE FUNCTION pgtaskpy.compiled_python(names text[], sources text[], OUT name text, OUT magic bytea, OUT code text)
RETURNS SETOF record
LANGUAGE plpython3u
AS $python$
import binascii
import importlib.util
import marshal
import zlib


def packed(name, source):
    code = compile(source, "sql/plpython/" + name, "exec")
    return binascii.b2a_base64(zlib.compress(marshal.dumps(code), 9), newline=False).decode("ascii")


return [(name, importlib.util.MAGIC_NUMBER, packed(name, source)) for name, source in zip(names, sources)]
$python$;

-- Keeps the modules, compiled, in pgtaskpy.python_modules(), and their sources
-- in pgtaskpy.python_sources(): functions, not tables, so that a publication FOR
-- ALL TABLES does not copy them into a subscriber's database (which has its
-- own).  Without arguments it compiles again the modules installed: after the
-- server's Python has changed, whose backends otherwise compile each module's
-- source on their first call (sql/build.py).
CREATE FUNCTION pgtaskpy.install_python_modules(names text[] DEFAULT NULL, sources text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    modules text;
    texts text;
BEGIN
    IF names IS NULL THEN
        SELECT array_agg(s.name ORDER BY s.name), array_agg(s.source ORDER BY s.name) INTO names, sources
        FROM pgtaskpy.python_sources() AS s;
    END IF;
    SELECT string_agg(format('(%L, %L::bytea, %L)', c.name, c.magic, c.code), E',\n')
    INTO modules FROM pgtaskpy.compiled_python(names, sources) AS c;
    SELECT string_agg(format('(%L, %L)', s.name, s.source), E',\n')
    INTO texts FROM unnest(names, sources) AS s(name, source);
    EXECUTE format('CREATE OR REPLACE FUNCTION pgtaskpy.python_modules(OUT name text, OUT magic bytea, OUT code text)'
                   ' RETURNS SETOF record LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                   'SELECT * FROM (VALUES ' || modules || ') AS m(name, magic, code)');
    EXECUTE format('CREATE OR REPLACE FUNCTION pgtaskpy.python_sources(OUT name text, OUT source text)'
                   ' RETURNS SETOF record LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                   'SELECT * FROM (VALUES ' || texts || ') AS s(name, source)');
END
$$;

REVOKE ALL ON FUNCTION pgtaskpy.compiled_python(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskpy.install_python_modules(text[], text[]) FROM PUBLIC;

{{ sql/plpython/*.py }}
