"""`make bench-peers`: pg_task_py beside pg_cron (Debian's postgresql-15-cron, 1.4: schedules of
whole minutes), each on a throw-away cluster of its own, in the same minutes: 20 jobs of
`* * * * *` running `SELECT 1` in pg_cron, 20 series of the same schedule in pg_task_py
(task_schedule: each series in a group of its own, side by side as pg_cron's jobs), and how late
each run starts after its minute: `start_time` in cron.job_run_details, `start - plan` in task
(a cron run's plan is its minute).

    make bench-peers                 # installs postgresql-15-cron when it is missing
    .venv/bin/python bench/peers.py --minutes 5 --jobs 50
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

from pg_task_py_testing import Launcher, throwaway_cluster

from bench import percentile  # (bench/bench.py, beside this script)

# pg_cron runs its jobs in background workers (no loopback login to set up), as many at once as
# there are jobs; its launcher connects to the database `postgres`.
PG_CRON_SETTINGS = {
    "shared_preload_libraries": "pg_cron",
    "cron.database_name": "postgres",
    "cron.use_background_workers": "on",
    "cron.max_running_jobs": "100",
    "max_worker_processes": "128",
}


def summary(offsets_ms: list[float]) -> dict:
    if not offsets_ms:
        return {"runs": 0}
    return {"runs": len(offsets_ms), "p50_ms": round(percentile(offsets_ms, 0.5), 1),
            "p95_ms": round(percentile(offsets_ms, 0.95), 1), "max_ms": round(max(offsets_ms), 1),
            "min_ms": round(min(offsets_ms), 1)}


def wait_for_second(low: float, high: float) -> None:
    """Until the clock is between `low` and `high` seconds into a minute."""
    while not low <= time.time() % 60 < high:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20, help="jobs (series) of each (default 20)")
    parser.add_argument("--minutes", type=int, default=3, help="whole minutes measured (default 3)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        cron_cluster = stack.enter_context(throwaway_cluster(PG_CRON_SETTINGS))
        ours = stack.enter_context(throwaway_cluster())
        ours.create_database("bench")
        launcher = Launcher(ours.dsn("bench")).start()
        stack.callback(launcher.stop)
        launcher.wait_active()
        with cron_cluster.connect() as cron, ours.connect("bench") as conn:
            cron.execute("CREATE EXTENSION pg_cron")
            # Scheduled a few seconds after a minute, so that the first minute measured is whole.
            wait_for_second(5, 40)
            for job in range(args.jobs):
                cron.execute("SELECT cron.schedule(%s, '* * * * *', 'SELECT 1')", [f"job{job}"])
                conn.execute("SELECT task_schedule(%s, '* * * * *', 'SELECT 1')", [f"job{job}"])
            first = cron.execute("SELECT date_trunc('minute', now()) + interval '1 minute'").fetchone()[0]
            last = cron.execute("SELECT %s::timestamptz + %s * interval '1 minute'",
                                [first, args.minutes - 1]).fetchone()[0]
            # Each minute's runs have started and ended some seconds after it.
            while cron.execute("SELECT now() < %s::timestamptz + interval '20 s'", [last]).fetchone()[0]:
                time.sleep(1)
            pg_cron = [float(row[0]) for row in cron.execute(
                "SELECT extract(epoch FROM start_time - date_trunc('minute', start_time)) * 1000"
                " FROM cron.job_run_details WHERE date_trunc('minute', start_time) BETWEEN %s AND %s",
                [first, last])]
            pg_cron_failed = cron.execute("SELECT count(*) FROM cron.job_run_details WHERE status <> 'succeeded'"
                                          " AND date_trunc('minute', start_time) BETWEEN %s AND %s",
                                          [first, last]).fetchone()[0]
            pg_cron_version = cron.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'").fetchone()[0]
            ours_offsets = [float(row[0]) for row in conn.execute(
                "SELECT extract(epoch FROM start - plan) * 1000 FROM task"
                " WHERE key IS NOT NULL AND start IS NOT NULL AND plan BETWEEN %s AND %s", [first, last])]
            ours_failed = conn.execute("SELECT count(*) FROM task WHERE key IS NOT NULL AND state NOT IN"
                                       " ('PLAN', 'TAKE', 'WORK', 'DONE') AND plan BETWEEN %s AND %s",
                                       [first, last]).fetchone()[0]
    expected = args.jobs * args.minutes
    results = [
        {"peer": f"pg_cron {pg_cron_version}", "expected_runs": expected, "not_succeeded": pg_cron_failed,
         **summary(pg_cron)},
        {"peer": "pg_task_py", "expected_runs": expected, "not_succeeded": ours_failed, **summary(ours_offsets)},
    ]
    print(f"start after the scheduled minute, {args.jobs} jobs of '* * * * *' over {args.minutes} minutes")
    for result in results:
        figures = ", ".join(f"{k} {v}" for k, v in result.items() if k != "peer")
        print(f"{result['peer']:<12} {figures}")
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
