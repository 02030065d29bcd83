"""The worker's libpq binding: our hand-written ctypes binding (sql/plpython/libpq.py) against
psycopg's low-level layer (psycopg.pq), measured inside a PostgreSQL 15 backend running PL/Python.

Why: before extending libpq.py for multiplexing, measure psycopg.pq (the same asynchronous calls,
typed and maintained) against it, on the two costs a worker pays:

1. Import cost per worker backend: a fresh backend's first call either defines libpq.py (its
   source run with exec() in a fresh namespace, compilation included, as a worker's first call
   compiles the body that sql/build.py pastes it into) or runs `import psycopg.pq` (the Debian
   package python3-psycopg, for the server's /usr/bin/python3).  Timed inside the function
   (time.perf_counter), and the whole first call by the client's clock, which also holds
   PL/Python's start in the backend: the `none` row, a first call that imports nothing, is that
   floor.  Each in `--backends` new connections, in turns, after one untimed warm-up of each.
2. Per-query overhead on a warm loopback connection opened from inside PL/Python (over the
   server's Unix socket): QUERIES round trips of `SELECT 1`, each sent and read as the worker
   does (single-row mode, waiting on the socket while libpq is busy, every value decoded), with
   the simple protocol (libpq.py's `Session.execute(query)`, psycopg's `send_query`) and the
   extended one (`Session.execute(query, [])`, `send_query_params`): µs a query, the median of
   `--rounds` rounds taken in turns, and the best round (other work on the machine only ever
   adds); and the CPU µs a query of the backend running the loop (time.process_time: the
   binding's work and libpq's, not the loopback backend's), which that work swings less.

On a throw-away cluster of its own (pg_task_py_testing, as bench/bench.py), with plpython3u only.

    .venv/bin/python bench/pq_binding.py
    .venv/bin/python bench/pq_binding.py --rounds 9     # steadier per-query figures on a busy machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pg_task_py_testing import Cluster, throwaway_cluster

LIBPQ_SOURCE = (Path(__file__).resolve().parent.parent / "sql" / "plpython" / "libpq.py").read_text()
DATABASE = "pq_binding"
QUERIES = 2000  # round trips a round
WARM_UP = 50  # untimed round trips before each timed loop

# The loopback session's keywords, as a worker's own session gets them.
KEYWORDS_SQL = ("SELECT trim(split_part(current_setting('unix_socket_directories'), ',', 1)) AS host,"
                " current_setting('port') AS port, current_database() AS dbname, current_user AS user")

FUNCTIONS = [
    """CREATE FUNCTION first_call_none() RETURNS float8 LANGUAGE plpython3u AS $$
return 0.0
$$""",
    """CREATE FUNCTION first_call_libpq(source text) RETURNS float8 LANGUAGE plpython3u AS $$
import time
started = time.perf_counter()
exec(source, {"__name__": "libpq"})
return 1000 * (time.perf_counter() - started)
$$""",
    """CREATE FUNCTION first_call_psycopg() RETURNS float8 LANGUAGE plpython3u AS $$
import time
started = time.perf_counter()
import psycopg.pq
return 1000 * (time.perf_counter() - started)
$$""",
    """CREATE FUNCTION psycopg_info() RETURNS text LANGUAGE plpython3u AS $$
import json, sys
import psycopg, psycopg.pq
return json.dumps({"psycopg": psycopg.__version__, "impl": psycopg.pq.__impl__,
                   "libpq": psycopg.pq.version(), "python": sys.version.split()[0]})
$$""",
    f"""CREATE FUNCTION loop_libpq(source text, protocol text, queries int) RETURNS float8[]
LANGUAGE plpython3u AS $$
import time
if "libpq" not in SD:
    SD["libpq"] = {{"__name__": "libpq"}}
    exec(source, SD["libpq"])
session = SD["libpq"]["Session"](plpy.execute("{KEYWORDS_SQL}")[0])
params = None if protocol == "simple" else []
try:
    for _ in range({WARM_UP}):
        session.execute("SELECT 1", params)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(queries):
        rows = session.execute("SELECT 1", params)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
finally:
    session.close()
assert rows == [["1"]], rows
return [1e6 * elapsed / queries, 1e6 * cpu / queries]
$$""",
    f"""CREATE FUNCTION loop_psycopg(protocol text, queries int) RETURNS float8[] LANGUAGE plpython3u AS $$
import select, time
from psycopg import pq
FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
MESSAGE_PRIMARY = pq.DiagnosticField.MESSAGE_PRIMARY
keywords = plpy.execute("{KEYWORDS_SQL}")[0]
conn = pq.PGconn.connect(" ".join(f"{{k}}='{{v}}'" for k, v in keywords.items()).encode())
if conn.status != pq.ConnStatus.OK:
    raise Exception(conn.error_message.decode())

def execute(query, simple):
    # libpq.py's Session.execute, in psycopg.pq's calls.
    if simple:
        conn.send_query(query)
    else:
        conn.send_query_params(query, None)
    conn.set_single_row_mode()
    rows, error = [], None
    while True:
        while conn.is_busy():
            readable, _, _ = select.select([conn.socket], [], [], 1.0)
            if readable:
                conn.consume_input()
        result = conn.get_result()
        if result is None:
            break
        if result.status == FATAL_ERROR:
            error = result.error_field(MESSAGE_PRIMARY)
        for r in range(result.ntuples):
            rows.append([None if value is None else value.decode("utf-8", "replace")
                         for value in (result.get_value(r, c) for c in range(result.nfields))])
        result.clear()
    if error:
        raise Exception(error.decode())
    return rows

simple = protocol == "simple"
try:
    for _ in range({WARM_UP}):
        execute(b"SELECT 1", simple)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(queries):
        rows = execute(b"SELECT 1", simple)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
finally:
    conn.finish()
assert rows == [["1"]], rows
return [1e6 * elapsed / queries, 1e6 * cpu / queries]
$$""",
]

# First-call variants: the function and its arguments.
FIRST_CALLS = {
    "none": ("SELECT first_call_none()", []),
    "libpq.py": ("SELECT first_call_libpq(%s)", [LIBPQ_SOURCE]),
    "psycopg.pq": ("SELECT first_call_psycopg()", []),
}
# Per-query variants: (binding, protocol) and the loop's call.
LOOPS = {
    ("libpq.py", "simple"): ("SELECT loop_libpq(%s, 'simple', %s)", [LIBPQ_SOURCE, QUERIES]),
    ("psycopg.pq", "simple"): ("SELECT loop_psycopg('simple', %s)", [QUERIES]),
    ("libpq.py", "params"): ("SELECT loop_libpq(%s, 'params', %s)", [LIBPQ_SOURCE, QUERIES]),
    ("psycopg.pq", "params"): ("SELECT loop_psycopg('params', %s)", [QUERIES]),
}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def prepare(cluster: Cluster) -> dict:
    """The database with plpython3u and the functions; psycopg's version and implementation as
    the server's Python imports it."""
    cluster.create_database(DATABASE, extension=False)
    with cluster.connect(DATABASE) as conn:
        conn.execute("CREATE EXTENSION plpython3u")
        for function in FUNCTIONS:
            conn.execute(function)
        return json.loads(conn.execute("SELECT psycopg_info()").fetchone()[0])


def first_call(cluster: Cluster, query: str, params: list) -> tuple[float, float]:
    """In a new backend: the ms the function timed, and the ms of the whole call by the client."""
    with cluster.connect(DATABASE) as conn:
        started = time.perf_counter()
        inside = conn.execute(query, params).fetchone()[0]
        return inside, 1000 * (time.perf_counter() - started)


def first_calls(cluster: Cluster, backends: int) -> list[dict]:
    """Each first-call variant in `backends` fresh backends, in turns (one untimed warm-up each, so
    that reading the files from disk once does not count)."""
    inside: dict[str, list[float]] = {name: [] for name in FIRST_CALLS}
    wall: dict[str, list[float]] = {name: [] for name in FIRST_CALLS}
    for query, params in FIRST_CALLS.values():
        first_call(cluster, query, params)
    for _ in range(backends):
        for name, (query, params) in FIRST_CALLS.items():
            timed, whole = first_call(cluster, query, params)
            inside[name].append(timed)
            wall[name].append(whole)
    return [{"figure": "first_call", "binding": name, "median_ms": round(statistics.median(inside[name]), 2),
             "p95_ms": round(percentile(inside[name], 0.95), 2),
             "wall_median_ms": round(statistics.median(wall[name]), 2),
             "wall_p95_ms": round(percentile(wall[name], 0.95), 2), "backends": backends}
            for name in FIRST_CALLS]


def per_query(cluster: Cluster, rounds_wanted: int) -> list[dict]:
    """Each loop variant `rounds_wanted` times, in turns, in one warm backend: elapsed and CPU µs a query."""
    rounds: dict[tuple[str, str], list[float]] = {variant: [] for variant in LOOPS}
    cpu: dict[tuple[str, str], list[float]] = {variant: [] for variant in LOOPS}
    with cluster.connect(DATABASE) as conn:
        for _ in range(rounds_wanted):
            for variant, (query, params) in LOOPS.items():
                elapsed_us, cpu_us = conn.execute(query, params).fetchone()[0]
                rounds[variant].append(round(elapsed_us, 2))
                cpu[variant].append(round(cpu_us, 2))
    return [{"figure": "per_query", "binding": binding, "protocol": protocol,
             "median_us": statistics.median(rounds[binding, protocol]), "best_us": min(rounds[binding, protocol]),
             "rounds_us": rounds[binding, protocol], "cpu_median_us": statistics.median(cpu[binding, protocol]),
             "queries": QUERIES}
            for binding, protocol in LOOPS]


def print_results(info: dict, results: list[dict]) -> None:
    print(f"psycopg {info['psycopg']} (psycopg.pq implementation: {info['impl']}, libpq {info['libpq']},"
          f" server's Python {info['python']})")
    print(f"  {'first call':<22} {'inside median':>13} {'p95':>8} {'wall median':>12} {'p95':>8}  (ms)")
    for result in results:
        if result["figure"] == "first_call":
            print(f"  {result['binding']:<22} {result['median_ms']:>13} {result['p95_ms']:>8}"
                  f" {result['wall_median_ms']:>12} {result['wall_p95_ms']:>8}")
    print(f"  {'per query':<22} {'median':>13} {'best':>8} {'cpu':>8}  rounds  (µs, {QUERIES} x SELECT 1)")
    for result in results:
        if result["figure"] == "per_query":
            print(f"  {result['binding'] + ' ' + result['protocol']:<22} {result['median_us']:>13}"
                  f" {result['best_us']:>8} {result['cpu_median_us']:>8}  {result['rounds_us']}")
    print(json.dumps({"figure": "psycopg", **info}))
    for result in results:
        print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=int, default=30, help="fresh backends a first-call variant (30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each per-query loop (3)")
    args = parser.parse_args()
    with throwaway_cluster() as cluster:
        info = prepare(cluster)
        results = first_calls(cluster, args.backends) + per_query(cluster, args.rounds)
    print_results(info, results)


if __name__ == "__main__":
    main()
