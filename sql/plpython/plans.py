"""What a PL/Python entry point passes to the code it calls, and the JSON a worker returns (pasted
first into each body).

PL/Python gives a routine's body `plpy`, `GD` and `SD` and the routine's
arguments as globals; sql/build.py passes them to the entry point, `main`,
which hands a Context on.  So no module here reads a PL/Python global, and
each imports in plain Python (tests/unit/test_plpython_imports.py).

Queries name the extensions' schemas as `{ext}.` (pg_task_py) and `dblink.`:
the schemas are looked up at run time rather than pasted in by CREATE
EXTENSION, where a schema name that needs quotes would break the Python source.
"""

# A scheduler backend makes its plans again once the task table has grown past twice the size
# it had when they were made, and past this many bytes (replan_after_growth).
REPLAN_LEAST_BYTES = 256 * 1024
# Seconds ahead: workers are connected and warm for the groups whose tasks come due this soon
# (a cron minute's burst starts in workers that are ready, not after a connection each), and a
# warm worker's session ahead is of the owner of the first of them (run_task.py).
WARM_AHEAD = 3.0

# The SQLSTATEs of a plan that names a schema or function no longer there (undefined_function,
# invalid_schema_name, undefined_table): Context.run then forgets dblink's schema.
MOVED_SQLSTATES = ("42883", "3F000", "42P01")

# JSON's escapes of the characters a string may not hold as they are.
_JSON_ESCAPES = {**{code: f"\\u{code:04x}" for code in range(0x20)}, ord('"'): '\\"', ord("\\"): "\\\\"}


class Context:
    """One call's PL/Python: `plpy`; `GD`, the backend's dict, shared by every
    PL/Python routine and kept across ALTER EXTENSION UPDATE; `SD`, this
    routine's, which lives as long as the routine's code in this backend and
    holds the plans prepared once per backend."""

    __slots__ = ("plpy", "GD", "SD")

    def __init__(self, plpy, GD, SD):
        self.plpy = plpy
        self.GD = GD
        self.SD = SD

    def schema_of(self, extension):
        """The schema an extension lives in, quoted, looked up once per backend."""
        key = "schema:" + extension
        if key not in self.SD:
            self.SD[key] = self.plpy.execute(
                "SELECT pg_catalog.quote_ident(n.nspname) AS s FROM pg_catalog.pg_extension AS e"
                " JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace"
                " WHERE e.extname = " + self.plpy.quote_literal(extension)
            )[0]["s"]
        return self.SD[key]

    def prepared(self, name, query, types=()):
        """A plan prepared once per backend (SD lives as long as it)."""
        if name not in self.SD:
            query = query.replace("{ext}.", self.schema_of("pg_task_py") + ".")
            if "dblink." in query:
                query = query.replace("dblink.", self.schema_of("dblink") + ".")
                self.SD.setdefault("dblink_plans", set()).add(name)
            self.SD[name] = self.plpy.prepare(query, list(types))
        return self.SD[name]

    def run(self, name, query, types=(), args=()):
        """Run the plan `name`, prepared from `query` on its first use in this backend."""
        try:
            return self.plpy.execute(self.prepared(name, query, types), list(args))
        except self.plpy.SPIError as exc:
            if "dblink." in query and getattr(exc, "sqlstate", None) in MOVED_SQLSTATES:
                self.forget_dblink_plans()
            raise

    def forget_dblink_plans(self):
        """Look dblink's schema up again, and prepare again the plans that name it: dblink was
        moved (ALTER EXTENSION dblink SET SCHEMA, its schema renamed) under a running launcher,
        whose plans, made again from their text, named the old schema at every turn for good."""
        for key in ["schema:dblink", *self.SD.pop("dblink_plans", ())]:
            self.SD.pop(key, None)

    def make_constraints_immediate(self):
        """Deferred constraints and constraint triggers (a DBA's on task) are checked at the end of
        each statement of the scheduler's transactions, not at their commit: a refusal then fails
        that statement, which the scheduler catches (a claim, an end, a deletion), where at the
        commit it failed the launcher's whole turn, or the worker's call, at every try.  Called
        first thing in a call, and after each commit (SET CONSTRAINTS lasts a transaction)."""
        self.run("constraints_immediate", "SET CONSTRAINTS ALL IMMEDIATE")

    def commit(self):
        self.plpy.commit()
        self.make_constraints_immediate()

    def name_of(self, what):
        """A name other processes see (the NOTIFY channel, a kind of backend's application_name),
        from its one home, pgtaskpy.name_of, once per backend."""
        key = "name:" + what
        if key not in self.SD:
            self.SD[key] = self.run(key, "SELECT pgtaskpy.name_of($1) AS n", ["text"], [what])[0]["n"]
        return self.SD[key]


def replan_after_growth(ctx):
    """Have this backend's plans made again when the task table has grown past twice its size
    at the time they were made: called at the start of each launcher turn and worker call.

    A plan is kept for the backend's life (claim_due_tasks even forces a generic one), and the
    plans made on a small table scan it whole.  A launcher started on an almost empty table
    then read a whole bulk load's rows several times a turn until autovacuum's ANALYZE came:
    a lone task's start took 2.8 -> 245 ms after a load of 400,000 rows (bench/RESULTS.md,
    `grown`).  Plans made again see the table's size on disk, analyzed or not.  Doubling keeps
    them within half of it at a cost of a few replans over the table's life; a table that
    shrinks needs none (index scans suit a small table too).
    """
    # (NULL when the table was dropped under this turn, by a restore with --clean in one
    # transaction: the turn's error is then the missing table's, not a TypeError here)
    size = ctx.run("task_size", "SELECT coalesce(pg_catalog.pg_relation_size('{ext}.task'::pg_catalog.regclass), 0)"
                   " AS b")[0]["b"]
    planned_at = ctx.GD.setdefault("pgtaskpy.plans_made_at_size", size)
    if size > max(2 * planned_at, REPLAN_LEAST_BYTES):
        ctx.plpy.execute("DISCARD PLANS")  # every plan of this backend, PL/Python's and PL/pgSQL's
        ctx.GD["pgtaskpy.plans_made_at_size"] = size


def to_json(value):
    """JSON text of a worker's report (None, booleans, numbers, strings, and lists, tuples and
    dicts of them), which the procedure returns as its jsonb.  Written here rather than by the json
    module: importing json, and the re module it imports, cost a new worker backend about 10 ms
    of its first call (bench/RESULTS.md), where the report is a few ids and states."""
    kind = type(value)
    if kind is str:
        if '"' not in value and "\\" not in value and value.isprintable():  # (most: ids' states, first lines)
            return '"' + value + '"'
        return '"' + value.translate(_JSON_ESCAPES) + '"'
    if kind is int or kind is float:
        return repr(value)  # (a report's floats are durations: never inf or nan)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is dict:
        return "{" + ", ".join([to_json(str(key)) + ": " + to_json(item) for key, item in value.items()]) + "}"
    if kind is list or kind is tuple:
        return "[" + ", ".join([to_json(item) for item in value]) + "]"
    for base in (str, int, float, dict, list):  # a subclass of one (the exact types are above)
        if isinstance(value, base):
            return to_json(base(value))
    raise TypeError(f"no JSON for a {kind.__name__}")
