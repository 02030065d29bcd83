"""The least a PL/Python worker can do for one-off tasks: bench.py's `least_serial` and
`least_parallel`, the bound beside `serial` and `parallel`.

A procedure runs its list of tasks one after another, as a worker going on with its group
does, each in a new session logged in with the task's settings in its startup packet, but with
none of the scheduler's rules: for each task one statement (the task before DONE with its
output, this one WORK with its session's pid) and one commit, then `SELECT 1` in the task's
session, read as the worker reads it, and the session closed.  The next task's session starts
while the task runs.  Its table has no trigger and one index, and nothing decides which task
comes next: the procedure is given their ids.

What separates `serial` from `least_serial` in the same run is what pg_task_py's rules cost
(the claim's checks, the end's retries, series and dependents, the lookahead, the login
fingerprint); what separates `least_serial` from `new_sessions_per_s` is what any worker of
this shape costs (a PL/Python backend, a statement and a commit a task, libpq through ctypes).

The procedure's body is sql/plpython/libpq.py (the worker's own binding) followed by this file,
assembled by `procedure_sql`; only `least_worker` runs in the server.
"""

import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # defined by sql/plpython/libpq.py, which precedes this file in the body
    from libpq import PGRES_SINGLE_TUPLE, PGRES_TUPLES_OK, Session, startup_options

TABLE = "least_task"
TABLE_SQL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'PLAN',"
             " output text, pid integer, start timestamptz, stop timestamptz)")
# One statement a task: the task before ends, this one starts (either may be NULL).
STEP_SQL = (f"WITH ended AS (UPDATE {TABLE} SET state = 'DONE', output = $2, stop = clock_timestamp() WHERE id = $1)"
            f" UPDATE {TABLE} SET state = 'WORK', pid = $4, start = clock_timestamp() WHERE id = $3")


def least_worker(plpy, task_ids, table_oid):
    """Run the tasks `task_ids` in order; the CPU seconds this backend spent on them."""
    place = plpy.execute("SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
                         " current_setting('port') AS port, current_database() AS db, current_user AS me")[0]
    step = plpy.prepare(STEP_SQL, ["bigint", "text", "bigint", "integer"])

    def session_of(task_id):
        # The settings a task's session of pg_task_py starts with (sessions.py, TASK_SETTINGS).
        options = startup_options({"pg_task.id": str(task_id), "pg_task.group": "default", "pg_task.schema": "public",
                                   "pg_task.table": TABLE, "pg_task.oid": str(table_oid), "statement_timeout": "0ms"})
        return Session({"host": place["host"], "port": place["port"], "dbname": place["db"], "user": place["me"],
                        "application_name": "least worker task", "client_encoding": "UTF8", "options": options},
                       wait=False)

    started_cpu = time.process_time()
    ended, output = None, None
    upcoming = session_of(task_ids[0])
    for index, task_id in enumerate(task_ids):
        session = upcoming
        upcoming = session_of(task_ids[index + 1]) if index + 1 < len(task_ids) else None
        session.wait_connected()
        plpy.execute(step, [ended, output, task_id, session.pid])
        plpy.commit()
        session.send("SELECT 1")
        rows = []
        for result in session.results():
            with result:
                if result.status in (PGRES_SINGLE_TUPLE, PGRES_TUPLES_OK):
                    rows.extend(result.rows())
        output = "\n".join("\t".join("" if value is None else str(value) for value in row) for row in rows)
        session.close()
        if upcoming is not None:
            upcoming.advance()
        ended = task_id
    plpy.execute(step, [ended, output, None, None])
    plpy.commit()
    return time.process_time() - started_cpu


def procedure_sql() -> str:
    """CREATE PROCEDURE least_worker(task_ids, table_oid, INOUT cpu_s): libpq.py, then this file."""
    here = Path(__file__).resolve().parent
    body = "\n".join([(here.parent / "sql" / "plpython" / "libpq.py").read_text(), Path(__file__).read_text(),
                      "return (least_worker(plpy, task_ids, table_oid),)"])
    quote = "$" + "least" + "$"  # (written apart: the body holds this text)
    return ("CREATE OR REPLACE PROCEDURE least_worker(task_ids bigint[], table_oid oid, INOUT cpu_s float8)"
            f" LANGUAGE plpython3u AS {quote}{body}{quote}")
