"""`make demo-ha`: a primary and a streaming standby (pg_basebackup -R) on this machine, a launcher on
each, tasks running, the primary killed, the standby promoted, tasks going on there; then the old
primary rejoins as a standby (pg_rewind) and its launcher runs nothing.  Removes everything at the end.
"""

from __future__ import annotations

import time

from pg_task_py_testing import Launcher, replicated_pair, wait_until

WHERE = "SELECT 'ran on port ' || current_setting('port')"
STATES = "SELECT state::text, count(*) FROM task GROUP BY 1 ORDER BY 1"


def show_log(title: str, launcher: Launcher, since: int = 0) -> None:
    print(f"-- {title}")
    for line in launcher.output()[since:].splitlines():
        if "task " not in line:  # the task lines are many; the rest tells the story
            print(f"   {line}")


def main() -> None:
    with replicated_pair() as pair:
        first, second = pair.primary, pair.standby
        print(f"primary on port {first.port}, standby on port {second.port} (pg_basebackup -R), streaming")
        with first.connect() as conn:
            conn.execute("CREATE DATABASE demo")
        with first.connect("demo") as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
        launchers = [Launcher(node.dsn("demo")).start() for node in (first, second)]
        try:
            launchers[0].wait_active()
            wait_until(lambda: "waiting for a promotion" in launchers[1].output(), 30)
            with first.connect("demo") as conn:
                # (Each in a group of its own: a group runs max + 1 = 1 task at a time.)
                conn.execute("INSERT INTO task (input, repeat, \"group\", delete) VALUES (%s, '0.5 s', 'series',"
                             " false)", [WHERE])
                conn.execute("INSERT INTO task (input, \"group\", delete)"
                             " VALUES ('SELECT pg_sleep(30)', 'long', false)")
                conn.execute("INSERT INTO task (input, plan, \"group\", delete) SELECT %s, now() + i * interval '1 s',"
                             " 'planned', false FROM generate_series(1, 6) AS i", [WHERE])
            time.sleep(2)
            pair.wait_replayed()
            print("-- the primary stops (immediate: as if it crashed); the standby is promoted")
            since = len(launchers[1].output())
            pair.fail_over("immediate")
            promoted = time.monotonic()
            wait_until(lambda: "scheduling (active)" in launchers[1].output()[since:], 10)
            print(f"   the standby's launcher took over {time.monotonic() - promoted:.2f} s after the promotion")
            time.sleep(6)
            with second.connect("demo") as conn:
                conn.execute("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")  # end the series
                print("-- where each task ran, and how it ended (on the new primary):")
                for row in conn.execute("SELECT id, \"group\", state::text, to_char(plan, 'HH24:MI:SS.MS'),"
                                        " coalesce(output, split_part(error, E'\\n', 1), '') FROM task"
                                        " ORDER BY \"group\", id"):
                    print("   {:>3} {:<7} {:<4} plan {} {}".format(*row))
                print("   (ids jump: a new primary's sequence goes on past the values its primary logged ahead)")
                print(f"   states: {conn.execute(STATES).fetchall()}")
            print("-- the old primary rejoins as a standby of the new one (pg_rewind)")
            since = len(launchers[0].output())
            pair.rejoin("pg_rewind")
            wait_until(lambda: "waiting for a promotion" in launchers[0].output()[since:], 30)
            show_log("the old primary's launcher", launchers[0])
            show_log("the standby's launcher, now the primary's", launchers[1])
        finally:
            for launcher in launchers:
                launcher.stop(10)


if __name__ == "__main__":
    main()
