"""The claim rule under concurrency, without timing: at most max + 1 tasks of a group are TAKE or
WORK at once, across launchers (pgtaskpy.claim_due_tasks) and workers handing on their slot
(pgtaskpy.claim_next_task, in the transaction that ends their task).

No launcher runs.  Each session is one backend that the test steps through explicit BEGIN and
COMMIT statements (psycopg adds none of its own), so the test decides the interleaving; where a
session must wait for another's lock, the test runs its statement in a thread and checks through
pg_locks and pg_blocking_pids that it waits, and on whom, before going on.  After every step the
group's TAKE/WORK rows are counted from outside (what is committed)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from pg_task_py_testing import wait_until

MAX = 1  # so at most two of the group at once


class Session:
    """One backend, as a launcher's turn or a worker would use it."""

    def __init__(self, db) -> None:
        self.conn = db.connect()
        self.pid = self.conn.info.backend_pid

    def begin(self) -> None:
        self.conn.execute("BEGIN")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def claim_due(self, limit: int = 10) -> list[int]:
        """A launcher's claim: PLAN -> TAKE of the due tasks whose groups have room."""
        return sorted(row[0] for row in self.conn.execute(
            "SELECT id FROM pgtaskpy.claim_due_tasks(%s, pg_backend_pid())", [limit]).fetchall())

    def end(self, task_id: int) -> None:
        """A worker ends its task (DONE)."""
        self.conn.execute("SELECT pgtaskpy.finish_task(%s, 'DONE', 'done', NULL)", [task_id])

    def claim_next(self, group_hash: int) -> int | None:
        """A worker, ending a task, claims its group's next (launcher NULL: no check that one runs)."""
        return self.conn.execute("SELECT (pgtaskpy.claim_next_task(%s, NULL)).id", [group_hash]).fetchone()[0]

    def waiting_for(self, observer) -> list[int]:
        """The backends this one waits for, if it waits for the scheduling lock (else [])."""
        row = observer.execute(
            "SELECT pg_blocking_pids(l.pid) FROM pg_locks AS l"
            " WHERE l.pid = %s AND l.relation = 'pgtaskpy.scheduling_lock'::regclass AND NOT l.granted",
            [self.pid]).fetchone()
        return row[0] if row else []

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def group(db):
    """Six due tasks of group g (max 1), the sessions, a thread for the calls that must wait."""
    db.sql("INSERT INTO task (\"group\", max, input, delete)"
           " SELECT 'g', %s, 'SELECT ' || i, false FROM generate_series(1, 6) AS i", [MAX])
    sessions: list[Session] = []
    with ThreadPoolExecutor(1) as background:
        def session() -> Session:
            sessions.append(Session(db))
            return sessions[-1]
        yield Group(db, session, background)
        for s in sessions:
            s.close()


class Group:
    def __init__(self, db, session, background: ThreadPoolExecutor) -> None:
        self.db = db
        self.session = session
        self.background = background
        self.ids = [row[0] for row in db.sql("SELECT id FROM task WHERE \"group\" = 'g' ORDER BY id")]
        self.hash = db.value("SELECT hash FROM task WHERE \"group\" = 'g' LIMIT 1")

    def running(self) -> list[int]:
        """The group's TAKE/WORK tasks, as committed; never more than max + 1."""
        ids = [row[0] for row in self.db.sql(
            "SELECT id FROM task WHERE \"group\" = 'g' AND state IN ('TAKE', 'WORK') ORDER BY id")]
        assert len(ids) <= MAX + 1, ids
        return ids

    def blocked(self, waiter: Session, holder: Session, call: Future) -> None:
        """`call` of `waiter` waits for the scheduling lock that `holder` has."""
        wait_until(lambda: waiter.waiting_for(self.db.conn) == [holder.pid], 10,
                   message=f"backend {waiter.pid} to wait for {holder.pid}'s lock")
        assert not call.done()


def test_two_launchers_claim_one_after_the_other(group):
    first, second = group.session(), group.session()
    first.begin()
    assert first.claim_due() == group.ids[:MAX + 1]
    assert group.running() == []  # not committed yet
    second.begin()
    claim = group.background.submit(second.claim_due)
    group.blocked(second, first, claim)  # the claims of launchers are serialized
    first.commit()
    assert group.running() == group.ids[:2]
    assert claim.result(10) == []  # it counts the first's claims
    second.commit()
    assert group.running() == group.ids[:2]


def test_a_launcher_does_not_claim_from_a_full_group_nor_wait_for_its_workers(group):
    launcher = group.session()
    launcher.begin()
    assert launcher.claim_due() == group.ids[:2]
    launcher.commit()
    assert group.running() == group.ids[:2]
    worker = group.session()
    worker.begin()
    worker.end(group.ids[0])
    assert worker.claim_next(group.hash) == group.ids[2]  # holds the scheduling lock, shared
    assert group.running() == group.ids[:2]
    launcher.begin()
    assert group.background.submit(launcher.claim_due).result(10) == []  # g is full as far as it can see
    launcher.commit()
    worker.commit()
    assert group.running() == group.ids[1:3]


def test_workers_hand_on_their_slots_side_by_side(group):
    launcher = group.session()
    launcher.begin()
    assert launcher.claim_due() == group.ids[:2]
    launcher.commit()
    assert group.running() == group.ids[:2]
    one, two = group.session(), group.session()
    one.begin()
    one.end(group.ids[0])
    assert one.claim_next(group.hash) == group.ids[2]
    two.begin()
    two.end(group.ids[1])
    # Not blocked (the lock is shared between workers); the task `one` took is locked: the next.
    assert group.background.submit(two.claim_next, group.hash).result(10) == group.ids[3]
    assert group.running() == group.ids[:2]
    one.commit()
    assert group.running() == [group.ids[1], group.ids[2]]
    two.commit()
    assert group.running() == group.ids[2:4]


def test_a_worker_waits_for_a_launchers_claim_and_counts_it(group):
    launcher = group.session()
    launcher.begin()
    assert launcher.claim_due(1) == group.ids[:1]
    launcher.commit()
    assert group.running() == group.ids[:1]
    launcher.begin()
    assert launcher.claim_due() == group.ids[1:2]  # the group's last slot
    assert group.running() == group.ids[:1]
    worker = group.session()
    worker.begin()
    worker.end(group.ids[0])
    claim = group.background.submit(worker.claim_next, group.hash)
    group.blocked(worker, launcher, claim)
    launcher.commit()
    assert group.running() == group.ids[:2]
    # It counts the launcher's claim: the slot it hands on is the one of the task it ended.
    assert claim.result(10) == group.ids[2]
    assert group.running() == group.ids[:2]  # (its own end and claim are not committed yet)
    worker.commit()
    assert group.running() == group.ids[1:3]


def test_a_worker_that_ends_its_task_without_handing_on_frees_the_slot_for_a_launcher(group):
    launcher = group.session()
    launcher.begin()
    assert launcher.claim_due() == group.ids[:2]
    launcher.commit()
    worker = group.session()
    worker.begin()
    worker.end(group.ids[0])
    launcher.begin()
    assert group.background.submit(launcher.claim_due).result(10) == []  # the end is not committed
    launcher.commit()
    assert group.running() == group.ids[:2]
    worker.commit()
    assert group.running() == group.ids[1:2]
    launcher.begin()
    assert launcher.claim_due() == group.ids[2:3]
    launcher.commit()
    assert group.running() == group.ids[1:3]
