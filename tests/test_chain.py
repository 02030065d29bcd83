"""Workers going on with their group: a worker that ends a task claims the group's next
due task itself (pgtaskpy.claim_next_task) under the same rules as the launcher."""

from pg_task_py_testing import most_at_once, wait_until


def test_a_busy_group_runs_in_order_through_few_workers(running):
    running.sql("INSERT INTO task (input, delete) SELECT 'SELECT ' || i, false FROM generate_series(1, 40) AS i")
    running.wait_all_done()
    rows = running.sql("SELECT id, start, stop, worker, pid, output FROM task ORDER BY id")
    assert [r[5] for r in rows] == [str(i) for i in range(1, 41)]
    for earlier, later in zip(rows, rows[1:]):
        assert later[1] >= earlier[2]  # default max: one at a time, in id order
    assert len({r[4] for r in rows}) == 40  # without count/live, each task has a session of its own
    # The worker that ran a task went on with the next one: no launcher turn between them.
    handed_on = sum(earlier[3] == later[3] for earlier, later in zip(rows, rows[1:]))
    assert handed_on >= 30, [r[3] for r in rows]


def test_max_holds_while_workers_hand_on_their_slots(running):
    running.sql("INSERT INTO task (max, input, delete) SELECT 2, 'SELECT pg_sleep(0.01)', false"
                " FROM generate_series(1, 90)")
    running.sql("INSERT INTO task (\"group\", input, delete) SELECT 'other', 'SELECT pg_sleep(0.01)', false"
                " FROM generate_series(1, 20)")
    running.wait_all_done(60)
    assert running.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 110
    assert most_at_once(running.sql("SELECT start, stop FROM task WHERE max = 2")) == 3
    assert most_at_once(running.sql("SELECT start, stop FROM task WHERE \"group\" = 'other'")) == 1


def test_a_higher_max_task_is_taken_next_by_the_worker(running):
    running.sql("INSERT INTO task (input, delete) SELECT 'SELECT pg_sleep(0.05)', false FROM generate_series(1, 10)")
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE state = 'DONE'") >= 2, 20, 0.01, "2 done")
    urgent = running.insert("SELECT 'urgent'", max=5, delete=False)  # max 5: may run beside the group's others
    row = running.wait_done(urgent, 20)
    running.wait_all_done()
    waiting_then = running.value("SELECT count(*) FROM task WHERE start > %s AND max = 0", [row["start"]])
    assert waiting_then >= 5


def test_a_stopping_launcher_hands_the_group_back(db):
    launcher = db.launcher()
    db.sql("INSERT INTO task (input, delete) SELECT 'SELECT pg_sleep(0.02)', false FROM generate_series(1, 300)")
    wait_until(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") >= 5, 20, 0.01, "5 done")
    assert launcher.stop() == 0, launcher.output()
    counts = dict(db.sql("SELECT state::text, count(*) FROM task GROUP BY 1"))
    assert set(counts) == {"DONE", "PLAN"}, counts  # nothing left claimed or running
    assert counts["PLAN"] > 150  # the worker stopped going on with the group within about a second


def test_a_kept_session_is_offered_only_to_a_task_of_its_remote(db):
    """A group is known by a 32-bit hash of its name and remote: a task of another remote whose
    hash collides must not be made WORK in the session offered for the group's last task."""
    # hashtext('a81406' || E'\x1f') = hashtext('b1400' || E'\x1fdbname=elsewhere'), found by a join.
    group, remote_group = "a81406", "b1400"
    ahead = db.value("SELECT now() + interval '1 hour'")
    task = db.insert("SELECT 1", group=remote_group, remote="dbname=elsewhere", count=10, plan=ahead)
    db.sql("UPDATE task SET plan = now() WHERE id = %s", [task])
    group_hash = db.value("SELECT hashtext(%s || E'\\x1f')", [group])
    assert db.value("SELECT hash FROM task WHERE id = %s", [task]) == group_hash
    offer = "SELECT state FROM pgtaskpy.claim_next_task(%s, NULL, 4242, current_user, %s, 10, '0')"
    with db.conn.transaction(force_rollback=True):  # the last task ran locally (remote NULL)
        assert db.value(offer, [group_hash, None]) == "TAKE"
    with db.conn.transaction(force_rollback=True):  # the same remote: the offer is taken
        assert db.value(offer, [group_hash, "dbname=elsewhere"]) == "WORK"


def test_a_session_started_with_a_tasks_settings_is_offered_only_to_that_task(db):
    """A worker starts the session of its group's next task ahead with that task's settings
    (pg_task.id, ...); if the claim brings another task (one inserted since with a higher max,
    the expected one stopped), that session is not made its: a RESET there would bring back
    the settings of the task it was started for."""
    first = db.insert("SELECT 1", group="settings", delete=False)
    second = db.insert("SELECT 2", group="settings", delete=False)
    group_hash = db.value("SELECT hash FROM task WHERE id = %s", [first])
    offer = ("SELECT id, state::text FROM pgtaskpy.claim_next_task(%s, NULL, 4242, current_user, NULL, 0, '0',"
             " session_task => %s)")
    with db.conn.transaction(force_rollback=True):  # started for the task claimed
        assert db.sql(offer, [group_hash, first]) == [(first, "WORK")]
    with db.conn.transaction(force_rollback=True):  # started for another
        assert db.sql(offer, [group_hash, second]) == [(first, "TAKE")]


def test_the_sessions_worth_starting_ahead_are_read_in_claim_order_without_reading_the_group(db):
    """pgtaskpy.upcoming_in_group, the tasks whose sessions a worker going on with its group
    starts ahead: the group's due tasks in the order its claims take them (higher max first),
    none planned ahead, and read from the group's priority index, not the whole group read and
    sorted (which statistics taken before the group filled led to: 1,000 rows read a task)."""
    db.sql("ANALYZE task")  # (empty: the statistics of a table that has just been filled)
    db.sql("INSERT INTO task (\"group\", input, max) SELECT 'upcoming', 'SELECT 1', 0 FROM generate_series(1, 1000)")
    late = db.value("INSERT INTO task (\"group\", input, max) VALUES ('upcoming', 'SELECT 2', 3) RETURNING id")
    db.sql("INSERT INTO task (\"group\", input, max, plan)"
           " VALUES ('upcoming', 'SELECT 3', 9, now() + interval '1 hour')")
    first = db.value("SELECT min(id) FROM task WHERE \"group\" = 'upcoming'")
    group_hash = db.value("SELECT hash FROM task WHERE id = %s", [first])
    fetched = ("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables"
               " WHERE relid = 'task'::regclass")
    with db.conn.transaction(force_rollback=True):
        before = db.value(fetched)
        upcoming = db.sql("SELECT id, \"group\", max FROM pgtaskpy.upcoming_in_group(%s, 2, 0, 'postgres', 'upcoming')",
                          [group_hash])
        read = db.value(fetched) - before
    assert upcoming == [(late, "upcoming", 3), (first, "upcoming", 0)]
    assert read <= 10, f"{read} rows of the task table read for 2 upcoming tasks"
