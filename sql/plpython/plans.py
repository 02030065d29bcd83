"""Prepared plans and names shared by the PL/Python entry points (pasted first into each body).

Queries name the extensions' schemas as `{ext}.` (pg_task_py) and `dblink.`:
the schemas are looked up at run time rather than pasted in by CREATE
EXTENSION, where a schema name that needs quotes would break the Python source.
"""


def schema_of(extension):
    """The schema an extension lives in, quoted, looked up once per backend."""
    key = "schema:" + extension
    if key not in SD:
        SD[key] = plpy.execute(
            "SELECT pg_catalog.quote_ident(n.nspname) AS s FROM pg_catalog.pg_extension AS e"
            " JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace"
            " WHERE e.extname = " + plpy.quote_literal(extension)
        )[0]["s"]
    return SD[key]


def prepared(name, query, types=()):
    """A plan prepared once per backend (SD lives as long as it)."""
    if name not in SD:
        query = query.replace("{ext}.", schema_of("pg_task_py") + ".")
        if "dblink." in query:
            query = query.replace("dblink.", schema_of("dblink") + ".")
        SD[name] = plpy.prepare(query, list(types))
    return SD[name]


def run(name, query, types=(), args=()):
    return plpy.execute(prepared(name, query, types), list(args))


def name_of(what):
    """A name other processes see (the NOTIFY channel, a kind of backend's application_name),
    from its one home, pgtaskpy.name_of, once per backend."""
    key = "name:" + what
    if key not in SD:
        SD[key] = run(key, "SELECT pgtaskpy.name_of($1) AS n", ["text"], [what])[0]["n"]
    return SD[key]
