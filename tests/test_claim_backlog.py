"""The launcher's claim over a backlog (pgtaskpy.claim_due_tasks): it reads the waiting tasks of
only a few groups first, yet claims exactly what a look at every group claims: the first
claim_limit tasks in priority order (higher max, then lower id) whose groups have room.

Each claim is called in a transaction that is rolled back, against a model of the rule written
here in Python; the last test runs the launcher over a table that grew after it started."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest


@dataclass
class Waiting:
    id: int
    group: str
    max: int
    due: bool


def expected_claims(waiting: list[Waiting], running: dict[str, int], paused: set[str], limit: int) -> list[int]:
    """pg_task's rule over every group: per group, the first due tasks in priority order, as
    many as its first waiting task's max allows (max + 1, at least one) and at most `limit`; the
    rank-th of them has room while rank + running <= its max + 1 (negative max: only the first,
    while none runs); of those with room, the first `limit` in priority order."""
    order = sorted(waiting, key=lambda t: (-t.max, t.id))
    first_max = {}
    for task in order:
        first_max.setdefault(task.group, task.max)
    ranks: dict[str, int] = {}
    with_room = []
    for task in order:
        if not task.due or task.group in paused:
            continue
        rank = ranks[task.group] = ranks.get(task.group, 0) + 1
        if rank > min(limit, max(1, first_max[task.group] + 1)):
            continue
        busy = running.get(task.group, 0)
        if (rank + busy <= task.max + 1) if task.max >= 0 else (rank == 1 and busy == 0):
            with_room.append(task.id)
    return with_room[:limit]


def claims(db, limit: int) -> list[int]:
    """What claim_due_tasks(limit) claims now, in priority order (rolled back)."""
    with db.connect() as conn:
        conn.execute("BEGIN")
        rows = conn.execute("SELECT c.id FROM pgtaskpy.claim_due_tasks(%s, pg_backend_pid()) AS c"
                            " JOIN task AS t USING (id) ORDER BY t.max DESC, t.id", [limit]).fetchall()
        conn.execute("ROLLBACK")
    return [row[0] for row in rows]


def fill(db, rng: random.Random, groups: int, tasks: int) -> tuple[list[Waiting], dict[str, int], set[str]]:
    """A backlog of `tasks` waiting tasks in `groups` groups (in runs of one group, as bulk
    inserts make them), some planned ahead, some groups running tasks, one group paused."""
    names = [f"g{i}" for i in range(groups)]
    rows = []
    while len(rows) < tasks:
        group = rng.choice(names)
        rows += [(group, rng.choice((-1, 0, 0, 1, 3)), rng.random() < 0.8) for _ in range(rng.randint(1, 60))]
    db.sql("INSERT INTO task (\"group\", max, plan, input, delete)"
           " SELECT g, m, CASE WHEN d THEN now() - interval '1 s' ELSE now() + interval '1 day' END, 'SELECT 1', false"
           " FROM unnest(%s::text[], %s::int[], %s::bool[]) WITH ORDINALITY AS r(g, m, d, i) ORDER BY i",
           [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]])
    running = {name: rng.choice((0, 0, 1, 2, 4)) for name in names}
    for name, n in running.items():
        db.sql("INSERT INTO task (\"group\", state, worker, input) SELECT %s, 'TAKE', 1, 'SELECT 1'"
               " FROM generate_series(1, %s)", [name, n])
    paused = {rng.choice(names)}
    for name in paused:
        db.sql("SELECT task_pause(%s)", [name])
    waiting = [Waiting(*row) for row in db.sql(
        "SELECT id, \"group\", max, plan <= now() FROM task WHERE state = 'PLAN'")]
    return waiting, running, paused


@pytest.mark.parametrize("seed", range(6))
def test_a_claim_over_a_backlog_takes_what_a_look_at_every_group_takes(db, seed):
    rng = random.Random(seed)
    waiting, running, paused = fill(db, rng, groups=rng.choice((3, 12, 40)), tasks=rng.choice((200, 1500)))
    for limit in (1, 2, 5, 20, 2000, 2147483647):  # (the launcher without --run: the most there is)
        assert claims(db, limit) == expected_claims(waiting, running, paused, limit), f"claim_limit {limit}"


def test_full_groups_first_in_priority_do_not_hide_the_others(db):
    # 500 tasks of a full group come first in priority order; the claim still finds the others.
    db.sql("INSERT INTO task (\"group\", max, input) SELECT 'busy', 5, 'SELECT 1' FROM generate_series(1, 500)")
    db.sql("INSERT INTO task (\"group\", max, state, worker, input)"
           " SELECT 'busy', 5, 'WORK', 1, 'SELECT 1' FROM generate_series(1, 6)")
    other = db.value("INSERT INTO task (\"group\", input) VALUES ('other', 'SELECT 1') RETURNING id")
    assert claims(db, 1) == [other]


def test_tasks_planned_ahead_first_in_priority_do_not_hide_a_due_one(db):
    db.sql("INSERT INTO task (\"group\", max, plan, input)"
           " SELECT 'g' || (i % 50), 1, now() + interval '1 day', 'SELECT 1' FROM generate_series(1, 1000) AS i")
    due = db.value("INSERT INTO task (\"group\", input) VALUES ('g7', 'SELECT 1') RETURNING id")
    assert claims(db, 1) == [due]


def test_due_tasks_behind_many_planned_ahead_are_claimed_as_a_look_at_every_group_claims(db):
    # In priority order: 40 tasks planned ahead (the first pass stops reading after 32), then due
    # tasks of 6 groups, one of them running; the second pass claims what the rule claims.
    db.sql("INSERT INTO task (\"group\", max, plan, input)"
           " SELECT 'g' || (i % 3), 2, now() + interval '1 day', 'SELECT 1' FROM generate_series(1, 40) AS i")
    db.sql("INSERT INTO task (\"group\", max, input)"
           " SELECT 'd' || (i % 6), 1, 'SELECT 1' FROM generate_series(1, 30) AS i")
    db.sql("INSERT INTO task (\"group\", max, state, worker, input) VALUES ('d2', 1, 'WORK', 1, 'SELECT 1')")
    waiting = [Waiting(*row) for row in db.sql(
        "SELECT id, \"group\", max, plan <= now() FROM task WHERE state = 'PLAN'")]
    for limit in (1, 5, 20):
        assert claims(db, limit) == expected_claims(waiting, {"d2": 1}, set(), limit), f"claim_limit {limit}"


def test_a_paused_group_first_in_priority_does_not_hide_the_others(db):
    db.sql("INSERT INTO task (\"group\", max, input) SELECT 'held', 2, 'SELECT 1' FROM generate_series(1, 300)")
    db.sql("SELECT task_pause('held')")
    free = db.value("INSERT INTO task (\"group\", input) VALUES ('free', 'SELECT 1') RETURNING id")
    assert claims(db, 3) == [free]


def test_a_claim_takes_no_task_of_the_first_groups_past_a_better_one_of_another(db):
    # In priority order: b1, c1, e1 (their groups full), d1, b2.  The first look covers groups b,
    # c and e only (claim_limit + 1); b2 has room too, but d1 comes first.
    def insert(group: str, max: int) -> int:
        return db.value("INSERT INTO task (\"group\", max, input) VALUES (%s, %s, 'SELECT 1') RETURNING id",
                        [group, max])
    b1, _c1, _e1, d1, _b2 = insert("b", 3), insert("c", 3), insert("e", 3), insert("d", 2), insert("b", 1)
    db.sql("INSERT INTO task (\"group\", max, state, worker, input)"
           " SELECT g, 3, 'WORK', 1, 'SELECT 1' FROM unnest('{c,e}'::text[]) AS g, generate_series(1, 4)")
    assert claims(db, 2) == [b1, d1]


def test_a_launcher_started_on_an_empty_table_starts_tasks_at_once_after_a_bulk_load(db):
    """Scheduler backends keep their plans for their life, and those made on an almost empty
    table read it whole.  After a bulk load of 100,000 tasks planned for tomorrow (before any
    ANALYZE: autovacuum is off for the table here), each statement of a turn read every row
    (tens of ms each); the plans are made again for the grown table, and a task starts as soon
    as before.  Before PostgreSQL 15.20 the indexes built on the empty table still look empty
    then, and the plans made again read the load through whichever index (45-60 ms a start on
    15.18) until the reads named an order one index alone gives; the check for anything due at
    all named none until 1.3 and read the load through the priority index in some runs (12 ms a
    turn, and a start's median 31 ms later beside another test process): see the next test."""
    db.sql("ALTER TABLE task SET (autovacuum_enabled = false)")
    db.launcher()
    for _ in range(3):  # plans made on a table of a few rows, in the launcher and in a worker
        db.wait_done(db.insert("SELECT 1", delete=False))

    def start_delays() -> list[float]:
        delays = []
        for _ in range(7):
            row = db.wait_done(db.insert("SELECT 1", delete=False))
            delays.append((row["start"] - row["plan"]).total_seconds())
        return delays

    before = start_delays()
    with db.connect() as bulk:
        bulk.execute("SET session_replication_role = replica")  # a bulk load: no trigger fires
        bulk.execute("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'g' || (i % 100),"
                     " now() + interval '1 day' FROM generate_series(1, 100000) AS i")
    after = start_delays()
    # Against the same run's starts before the load, not a fixed bound: alone a start takes 2.5-10
    # ms, beside the other test process on 2 cores a median of 31 ms was seen.  The plans that read
    # the load through the wrong index added 35-50 ms to every start, so to the quickest one too,
    # which a stall of the machine's does not move.
    assert min(after) - min(before) < 0.025, (before, after)


def test_a_claim_with_nothing_due_reads_a_few_pages_however_many_tasks_are_planned_ahead(db):
    """The claim's first check, whether anything is due at all, runs on every turn.  Planned as
    a scheduler backend plans it again after a bulk load (DISCARD PLANS; no ANALYZE, indexes
    built empty), it reads the earliest plan from the plan index: a dozen pages.  Before, as an
    EXISTS with no order, it read every task planned ahead through another index: 118 pages here
    through the (hash, plan) index, 5,088 in a launcher through the priority index."""
    db.sql("ALTER TABLE task SET (autovacuum_enabled = false)")
    with db.connect() as scheduler:
        scheduler.execute("SELECT * FROM pgtaskpy.claim_due_tasks(1, 0)")  # plans made on an empty table
        with db.connect() as bulk:
            bulk.execute("SET session_replication_role = replica")
            bulk.execute("INSERT INTO task (input, \"group\", plan) SELECT 'SELECT 1', 'g' || (i % 100),"
                         " now() + interval '1 day' FROM generate_series(1, 100000) AS i")
        scheduler.execute("DISCARD PLANS")
        [plan] = scheduler.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
                                   " SELECT * FROM pgtaskpy.claim_due_tasks(1, 0)").fetchone()[0]
    assert plan["Plan"]["Actual Rows"] == 0
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert pages < 40, plan


@pytest.mark.parametrize("scan", [
    "SELECT id FROM pgtaskpy.claim_due_tasks(5, 0)",
    "SELECT id FROM pgtaskpy.claim_next_task(%(hash)s, NULL) WHERE id IS NOT NULL",
    "SELECT id FROM pgtaskpy.upcoming_in_group(%(hash)s, 2, 0, 'postgres', 'group')",
], ids=["claim_due_tasks", "claim_next_task", "upcoming_in_group"])
def test_a_group_scan_reads_past_its_own_tasks_planned_ahead_in_the_index(db, scan):
    """A group's scans for due tasks read it in priority order, where tasks planned ahead (here
    100,000 of the group's, inserted first) come before a task due now.  Each reads past them in
    the index alone, an entry each (about 500 pages), not a row each: 5,100 pages, and a start in
    that group 31 ms after its plan, not 3.5-4.3 (bench/RESULTS.md, `crowded`)."""
    db.sql("ALTER TABLE task SET (autovacuum_enabled = false)")  # (as filled just now: no statistics)
    db.sql("INSERT INTO task (input, plan) SELECT 'SELECT 1', now() + interval '1 day' FROM generate_series(1, 100000)")
    due, group_hash = db.sql("INSERT INTO task (input) VALUES ('SELECT 2') RETURNING id, hash")[0]
    with db.connect() as scheduler:
        scheduler.execute("BEGIN")  # (the claims are undone)
        assert scheduler.execute(scan, {"hash": group_hash}).fetchall() == [(due,)]  # (and its plans made)
        scheduler.execute("ROLLBACK")
        scheduler.execute("BEGIN")
        [plan] = scheduler.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + scan,
                                   {"hash": group_hash}).fetchone()[0]
        scheduler.execute("ROLLBACK")
    assert plan["Plan"]["Actual Rows"] == 1
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert pages < 1500, plan


def test_exclusive_tasks_planned_ahead_cost_the_claims_nothing(db):
    """Every claim, the launcher's and each worker's, first asks whether an exclusive task runs or
    is due (pgtaskpy.exclusive_gate).  It reads the running ones and the due ones only: 20,000
    exclusive tasks planned for tomorrow (a nightly job for each tenant, say) cost it a few pages,
    where it read every one of them (0.45 ms a claim a thousand)."""
    db.sql("INSERT INTO task (input, exclusive, plan) SELECT 'SELECT 1', true, now() + interval '1 day'"
           " FROM generate_series(1, 20000)")

    def gate() -> tuple[str | None, int]:
        [plan] = db.value("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT pgtaskpy.exclusive_gate()")
        return db.value("SELECT pgtaskpy.exclusive_gate()"), plan["Plan"]["Shared Hit Blocks"] + plan["Plan"][
            "Shared Read Blocks"]

    db.value("SELECT pgtaskpy.exclusive_gate()")  # (its plans made: not counted)
    state, pages = gate()
    assert (state, pages < 60) == (None, True), pages
    due = db.value("INSERT INTO task (input, exclusive) VALUES ('SELECT 1', true) RETURNING id")
    assert gate()[0] == "due"
    db.sql("UPDATE task SET state = 'WORK', worker = 1 WHERE id = %s", [due])
    state, pages = gate()
    assert (state, pages < 60) == ("running", True), pages
