"""`make demo`: a throw-away cluster (testing.postgresql), the real launcher and a handful of example tasks.

Prints each task's row as it ends, then stops the launcher and removes the cluster.
"""

from __future__ import annotations

import time

from pg_task_py_testing import Launcher, throwaway_cluster

EXAMPLES = [
    ("an immediate task", "INSERT INTO task (input) VALUES ('SELECT now()')"),
    ("planned 2 s later", "INSERT INTO task (plan, input) VALUES (now() + interval '2 s', 'SELECT ''planned''')"),
    ("a failing task", "INSERT INTO task (input) VALUES ('SELECT 1/0')"),
    ("a repeating task (every second, three runs shown)",
     "INSERT INTO task (repeat, \"group\", input) VALUES ('1 s', 'repeat', 'SELECT ''tick''')"),
    ("group one: max 1, two at a time", "INSERT INTO task (\"group\", max, input)"
     " SELECT 'one', 1, 'SELECT pg_sleep(0.5), ' || i FROM generate_series(1, 4) AS i"),
    ("group two: max 1, beside group one", "INSERT INTO task (\"group\", max, input)"
     " SELECT 'two', 1, 'SELECT pg_sleep(0.5), ' || i FROM generate_series(1, 4) AS i"),
    ("several statements, with a header", "INSERT INTO task (input) VALUES ('SELECT 1 AS a, 2 AS b; SELECT 3 AS c')"),
]

COLUMNS = "id, \"group\", state, to_char(plan, 'HH24:MI:SS.MS'), to_char(start, 'HH24:MI:SS.MS')," \
          " to_char(stop, 'HH24:MI:SS.MS'), pid, input, output, error"


def show(row: tuple) -> str:
    task_id, group, state, plan, start, stop, pid, input_, output, error = row
    result = output if state == "DONE" else error
    result = (result or "").replace("\n", "\\n").replace("\t", "\\t")
    return (f"{task_id:>3} {group:<6} {state:<4} plan {plan} start {start} stop {stop}"
            f" pid {pid}  {input_[:38]:<38} -> {result[:70]}")


def main() -> None:
    with throwaway_cluster() as cluster:
        print(f"cluster on {cluster.socket_dir}, port {cluster.port}")
        cluster.create_database("demo")
        launcher = Launcher(cluster.dsn("demo")).start()
        try:
            launcher.wait_active()
            with cluster.connect("demo") as conn:
                for title, sql in EXAMPLES:
                    print(f"-- {title}\n   {sql}")
                    conn.execute(sql)
                seen: set[int] = set()
                deadline = time.monotonic() + 20
                repeats = 0
                while time.monotonic() < deadline and (repeats < 3 or len(seen) < 13):
                    for row in conn.execute(f"SELECT {COLUMNS} FROM task WHERE state NOT IN ('PLAN', 'TAKE', 'WORK')"
                                            " ORDER BY stop").fetchall():
                        if row[0] not in seen:
                            seen.add(row[0])
                            repeats += row[1] == "repeat"
                            print(show(row))
                    time.sleep(0.1)
                conn.execute("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")  # end the repeat series
        finally:
            status = launcher.stop()
            print(f"-- launcher stopped (exit {status}); its log:")
            print(launcher.output())


if __name__ == "__main__":
    main()
