"""How fast the scheduling moves to a promoted standby (figures in bench/RESULTS.md).

A primary and a streaming standby (testkit's ReplicatedPair), a launcher on each node and one with
both nodes and target_session_attrs=read-write; ROUNDS failovers, immediate and fast in turn, each
followed by the old primary's pg_rewind back as the standby.  Per round: from the end of
`pg_ctl promote -w` to the standby launcher's "scheduling (active)"; from then, a task's insert to
its DONE on the new primary; from the primary's stop to the multi-host launcher's "scheduling
(active)" (promotion included).

    .venv/bin/python bench/failover.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

from pg_task_py_testing import Launcher, multi_host_dsn, replicated_pair, wait_until

ACTIVE = "scheduling (active)"


def log_shows(launcher: Launcher, text: str, since: int) -> bool:
    return text in launcher.output()[since:]


def one_round(pair, nodes: list, on_node: list[Launcher], multi: Launcher, rejoined_at: dict[int, int],
              mode: str) -> tuple[float, float, float]:
    """One failover and the old primary's rejoin; the round's three figures, in seconds."""
    standby = nodes.index(pair.standby)
    waiting = on_node[standby]
    wait_until(lambda: log_shows(waiting, "waiting for a promotion", rejoined_at[standby]), 60)
    marks = len(waiting.output()), len(multi.output())
    stopped = time.monotonic()
    pair.primary.stop(mode)
    pair.standby.promote()
    promoted = time.monotonic()
    wait_until(lambda: log_shows(waiting, ACTIVE, marks[0]), 10, 0.005)
    takeover = time.monotonic() - promoted
    with pair.standby.connect("bench") as conn:
        task_id = conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
        inserted = time.monotonic()
        wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM task WHERE id = %s AND state <> 'DONE'",
                                        [task_id]).fetchone()[0], 10, 0.005)
        first_task = time.monotonic() - inserted
    wait_until(lambda: log_shows(multi, ACTIVE, marks[1]), 30, 0.005)
    follow = time.monotonic() - stopped
    pair.old_primary, pair.primary, pair.standby = pair.primary, pair.standby, pair.primary
    rejoined_at[1 - standby] = len(on_node[1 - standby].output())
    pair.rejoin("pg_rewind")
    return takeover, first_task, follow


def main(rounds: int) -> None:
    figures = []
    with replicated_pair() as pair:
        nodes = [pair.primary, pair.standby]
        with pair.primary.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with pair.primary.connect("bench") as conn:
            conn.execute("CREATE EXTENSION pg_task_py CASCADE")
        pair.wait_replayed()
        on_node = [Launcher(node.dsn("bench")).start() for node in nodes]
        multi = Launcher(multi_host_dsn(nodes, "bench", target_session_attrs="read-write")).start()
        rejoined_at = {0: 0, 1: 0}  # where each node's launcher log stood when the node last rejoined
        for round_ in range(rounds):
            figures.append(one_round(pair, nodes, on_node, multi, rejoined_at,
                                     "immediate" if round_ % 2 == 0 else "fast"))
        for launcher in [*on_node, multi]:
            launcher.stop(10)
    for name, values in zip(("standby launcher, promotion to scheduling (active)",
                             "a task on the new primary, insert to DONE",
                             "multi-host launcher, primary stop to scheduling (active)"), zip(*figures)):
        print(f"{name}: median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
              f" ({len(values)} rounds)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
