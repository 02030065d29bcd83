"""What SQL a task can run, what it sees, and how its results are kept (README: What SQL can a task run?)."""

import time
from datetime import timedelta

import psycopg
import pytest
from pg_task_py_testing import wait_until


def run(db, input, **columns):
    columns.setdefault("delete", False)
    return db.wait_done(db.insert(input, **columns), 30)


def test_procedure_that_commits(shared):
    shared.sql("CREATE TABLE committed_rows (i int)")
    shared.sql("CREATE PROCEDURE insert_and_commit() LANGUAGE plpgsql AS $$"
               " BEGIN INSERT INTO committed_rows VALUES (1); COMMIT; INSERT INTO committed_rows VALUES (2); END $$")
    row = run(shared, "CALL insert_and_commit()")
    assert (row["state"], row["output"]) == ("DONE", "CALL")
    assert shared.value("SELECT count(*) FROM committed_rows") == 2


@pytest.mark.parametrize(
    ("setup", "input", "output"),
    [
        ("CREATE TABLE concurrently_indexed (i int)", "CREATE INDEX CONCURRENTLY ON concurrently_indexed (i)",
         "CREATE INDEX"),
        ("CREATE TABLE vacuumed (i int)", "VACUUM ANALYZE vacuumed", "VACUUM"),
        (None, "ALTER SYSTEM RESET work_mem", "ALTER SYSTEM"),
    ],
)
def test_statements_that_need_the_top_level(shared, setup, input, output):
    if setup:
        shared.sql(setup)
    row = run(shared, input)
    assert (row["state"], row["output"], row["error"]) == ("DONE", output, None)


def test_notices_and_warnings_are_kept(shared):
    row = run(shared, "DO $$BEGIN RAISE NOTICE 'hello'; RAISE WARNING 'careful' USING HINT = 'look'; END$$")
    assert (row["state"], row["output"]) == ("DONE", "DO")
    assert row["notice"] == "NOTICE:  hello\nWARNING:  careful\nHINT:  look"


def test_a_notice_of_several_lines_continues_with_tabs(shared):
    # as `error` and the server log write them: its lines cannot pass for notices of their own
    row = run(shared, "DO $$BEGIN RAISE NOTICE E'multi\\nWARNING:  line' USING DETAIL = E'd1\\nd2'; END$$")
    assert row["notice"] == "NOTICE:  multi\n\tWARNING:  line\nDETAIL:  d1\n\td2", row


@pytest.mark.parametrize(
    ("input", "output"),
    [
        ("SELECT '\\x0102'::bytea AS b", "\\x0102"),
        ("SELECT '2026-01-02 03:04:05+00'::timestamptz AS t", "2026-01-02 03:04:05+00"),
        ("SELECT 'a\tb' AS s, 'x\ny' AS t", "s\tt\na\tb\tx\ny"),
        ("SELECT 1 WHERE false; SELECT 2 AS b", "2"),
        ("SELECT 1.5::numeric AS n, 'NaN'::float8 AS f", "n\tf\n1.5\tNaN"),
        ("SELECT 'ü€😀' AS u", "ü€😀"),
    ],
)
def test_values_print_as_their_text_form(shared, input, output):
    assert run(shared, input, null="null")["output"] == output


def test_many_rows(shared):
    row = run(shared, "SELECT i, repeat('x', 20) FROM generate_series(1, 100000) AS i", header=False)
    lines = row["output"].split("\n")
    assert len(lines) == 100000 and lines[-1] == "100000\t" + "x" * 20


def test_output_limit(running):
    """A database of its own: workers read the setting at most a second old (README), so the
    shared database's later tasks could still meet the limit after it is reset."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 1000")
    row = run(running, "SELECT i FROM generate_series(1, 100000) AS i")
    assert row["state"] == "FAIL"
    assert row["error"].startswith("ERROR:  task output exceeds 1000 characters\nHINT:  ")
    assert len(row["output"] or "") <= 1000


def test_an_output_past_its_limit_is_not_committed_nor_its_commits_tag_a_worker_failure(running):
    """An input that left its transaction open and returned too much: the worker committed its
    work after failing it 54000; and one whose COMMIT tag passed the limit failed the worker's
    call (a Python exception), the task recorded as a lost run."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 100")
    running.sql("CREATE TABLE past_limit (i int)")
    too_much = run(running, "BEGIN; INSERT INTO past_limit VALUES (1); SELECT repeat('x', 200)")
    assert (too_much["state"], too_much["sqlstate"]) == ("FAIL", "54000"), too_much
    assert running.value("SELECT count(*) FROM past_limit") == 0
    by_its_tag = run(running, "BEGIN; INSERT INTO past_limit VALUES (2); SELECT repeat('x', 83)")
    assert (by_its_tag["state"], by_its_tag["sqlstate"]) == ("FAIL", "54000"), by_its_tag
    assert by_its_tag["error"].startswith("ERROR:  task output exceeds 100 characters"), by_its_tag


def test_database_and_role_settings_apply(shared):
    shared.sql("CREATE SCHEMA app")
    shared.sql("CREATE TABLE app.only_here (v text)")
    shared.sql("INSERT INTO app.only_here VALUES ('found')")
    shared.sql(f"ALTER DATABASE {shared.name} SET search_path = app, public")
    try:
        assert run(shared, "SELECT v FROM only_here")["output"] == "found"
    finally:
        shared.sql(f"ALTER DATABASE {shared.name} RESET search_path")


def test_timeout_and_sets_do_not_leak_to_the_next_task_of_a_session(shared):
    first = shared.insert("SET work_mem = '77MB'; SELECT pg_sleep(0.05)", timeout="5 s", count=5,
                          group="leak", delete=False)
    second = shared.insert("SHOW statement_timeout; SHOW work_mem", count=5, group="leak", delete=False)
    shared.wait_done(first)
    row = shared.wait_done(second)
    assert row["pid"] == shared.task(first)["pid"]
    assert row["output"] == "0\n4MB"


def test_cancel_can_stop_a_series(shared):
    task_id = shared.insert("SELECT pg_sleep(30)", repeat="1 hour", group="series", delete=False)
    wait_until(lambda: shared.task(task_id)["state"] == "WORK", message="WORK")
    assert shared.value("SELECT task_cancel(%s, stop_series => true)", [task_id]) is True
    assert shared.wait_done(task_id, 10)["state"] == "FAIL"
    assert shared.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


def test_cancel_with_stop_series_of_a_run_that_has_ended_ends_its_series(shared):
    """A run that ended before the cancel reached it (the cancel waited for its row as its end was
    written, and that end went on with the series): task_cancel(id, true) returned false and the
    series ran on; one of a tiny repeat was never caught (25 cancels of 25: a probe).  The run that
    goes on from it, past the runs that ended since, is stopped in its place; not a task a run
    inserted (its parent the run's id, from pg_task.id), a repeating one too, nor another role's
    that names the run as its parent (a review: both were stopped, and the series ran on)."""
    spawn = "INSERT INTO task (input, plan, repeat) VALUES ('SELECT ''spawned''', now() + interval '1 hour', '1 hour')"
    first = shared.insert(spawn, repeat="10 ms", group="ended series", delete=False)
    shared.sql("CREATE ROLE parent_namer LOGIN IN ROLE pgtaskpy_user")
    with shared.connect("parent_namer") as other:
        other.execute("SELECT set_config('pg_task.id', %s, false)", [str(first)])
        other.execute("INSERT INTO task (input, plan, repeat) VALUES ('SELECT 1', now() + interval '1 hour', '1 hour')")
    series = "SELECT count(*) FROM task WHERE \"group\" = 'ended series' AND input <> 'SELECT ''spawned''' AND state "
    wait_until(lambda: shared.value(series + "= 'DONE'") >= 3, 20, message="three runs ended")
    try:
        assert shared.value("SELECT task_cancel(%s, stop_series => true)", [first]) is True
        wait_until(lambda: shared.value(series + "IN ('PLAN', 'TAKE', 'WORK')") == 0, 10, message="the series ended")
        spawned = shared.sql("SELECT state::text, parent IS NOT NULL FROM task WHERE input = 'SELECT ''spawned'''")
        assert len(spawned) >= 3 and set(spawned) == {("PLAN", True)}, spawned
        assert shared.sql("SELECT state::text, parent FROM task WHERE owner = 'parent_namer'") == [("PLAN", first)]
    finally:
        shared.sql("UPDATE task SET repeat = '0' WHERE \"group\" = 'ended series'")
        shared.sql("DELETE FROM task WHERE input = 'SELECT ''spawned''' OR \"group\" = 'ended series'"
                   " OR owner = 'parent_namer'")
        shared.sql("DROP ROLE parent_namer")


def test_cancel_with_stop_series_of_an_ended_one_off_stops_no_series_it_inserted(shared):
    """A one-off that had inserted a repeating task (its parent the one-off's id, from pg_task.id):
    task_cancel(one-off, true) took that task for the one-off's next run, ended its series and
    returned true (a review).  A one-off has no run that goes on: nothing to stop, false."""
    spawn = "INSERT INTO task (input, plan, repeat) VALUES ('SELECT ''spawned''', now() + interval '1 hour', '1 hour')"
    one_off = shared.insert(spawn, group="spawning one-off", delete=False)
    try:
        assert shared.wait_done(one_off)["state"] == "DONE"
        assert shared.value("SELECT task_cancel(%s, stop_series => true)", [one_off]) is False
        assert shared.sql("SELECT state::text, parent FROM task WHERE input = 'SELECT ''spawned'''") == [
            ("PLAN", one_off)]
    finally:
        shared.sql("DELETE FROM task WHERE input = 'SELECT ''spawned''' OR \"group\" = 'spawning one-off'")


def test_cancel_with_stop_series_of_an_ended_run_follows_a_series_whose_input_changed(shared):
    """A waiting run given another input (an UPDATE of it, as README shows, or task_schedule's
    replace) is still the series' run that goes on: the first follower matched the ended run's
    input, returned false, and the series ran on (a review)."""
    first = shared.insert("SELECT 1", repeat="1 hour", group="changed series", delete=False)
    shared.wait_done(first)
    waiting = "SELECT id FROM task WHERE parent = %s AND state = 'PLAN'"
    wait_until(lambda: shared.value(waiting, [first]) is not None, 10, message="the next run waiting")
    following = shared.value(waiting, [first])
    try:
        shared.sql("UPDATE task SET input = 'SELECT 2' WHERE id = %s", [following])
        assert shared.value("SELECT task_cancel(%s, stop_series => true)", [first]) is True
        assert shared.value("SELECT state::text FROM task WHERE id = %s", [following]) == "STOP"
        assert shared.value("SELECT count(*) FROM task WHERE \"group\" = 'changed series'"
                            " AND state IN ('PLAN', 'TAKE', 'WORK')") == 0
    finally:
        shared.sql("DELETE FROM task WHERE \"group\" = 'changed series'")


def test_cancel_with_stop_series_of_a_run_ending_as_it_comes_says_true_without_a_warning(shared):
    """A run whose input ended as the cancel came (its session gone, its end waiting for the
    cancel's lock on its row): the series ended, yet the call returned false, "nothing to stop"
    (39 calls of 60: a probe), and the signal to the ended session warned the caller "PID ... is
    not a PostgreSQL backend process"."""
    warnings = []
    with shared.connect() as conn:
        conn.autocommit = True
        conn.add_notice_handler(lambda notice: warnings.append(notice.message_primary))
        returned = []
        for trial in range(20):
            group = f"ending {trial}"
            conn.execute("INSERT INTO task (input, repeat, \"group\", delete) VALUES ('SELECT 1', '10 ms', %s, false)",
                         [group])
            run, deadline = None, time.monotonic() + 10
            while run is None and time.monotonic() < deadline:  # (a run of 10 ms: caught as it runs)
                run = conn.execute("SELECT id FROM task WHERE \"group\" = %s AND state IN ('TAKE', 'WORK')",
                                   [group]).fetchone()
            if run is not None:
                returned.append(conn.execute("SELECT task_cancel(%s, stop_series => true)", run).fetchone()[0])
            active = "SELECT count(*) FROM task WHERE \"group\" = %s AND state IN ('PLAN', 'TAKE', 'WORK')"
            wait_until(lambda group=group, active=active: conn.execute(active, [group]).fetchone()[0] == 0, 10,
                       message="the series ended")
    shared.sql("DELETE FROM task WHERE \"group\" LIKE 'ending %'")
    assert len(returned) >= 10 and all(returned), returned
    assert warnings == []


def test_cancel_of_a_waiting_series_run_with_stop_series_null_skips_the_run(shared):
    """NULL is the default, false, as for a running task; it ended the series."""
    task_id = shared.insert("SELECT 1", repeat="1 hour", plan=shared.value("SELECT now() + interval '1 hour'"),
                            group="null series", delete=False)
    assert shared.value("SELECT task_cancel(%s, NULL)", [task_id]) is True
    assert shared.value("SELECT count(*) FROM task WHERE parent = %s AND state = 'PLAN'", [task_id]) == 1
    shared.sql("UPDATE task SET state = 'STOP' WHERE parent = %s", [task_id])


def test_task_wait_of_a_task_that_is_not_there_returns_null(shared):
    """NULL itself (a deleted task, or one the caller cannot see), not a row of NULLs: a client
    that tests the result for None took that row for a task's."""
    assert shared.value("SELECT task_wait(-1)") is None
    assert shared.value("SELECT task_wait(-1) IS NOT DISTINCT FROM NULL") is True


def test_task_wait_for_longer_than_a_timestamp_holds_waits_for_ever(shared):
    """A wait of '300000 years' (for ever, to its caller) failed `timestamp out of range` (22008)
    before it looked at the task, and one of '-300000 years' so, not with task_wait's own error."""
    done = shared.wait_done(shared.insert("SELECT 'waited'", delete=False))["id"]
    assert shared.value("SELECT (task_wait(%s, '300000 years')).output", [done]) == "waited"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="task_wait needs a wait of zero or more"):
        shared.value("SELECT task_wait(1, '-300000 years')")


def test_task_wait_says_when_it_cannot_see_the_end(shared):
    """Rather than wait out its time and blame the launcher: NULL arguments (a NULL time waited
    for ever), a negative time, a snapshot that never shows the end, and a task that cannot start before the
    caller's own transaction commits."""
    for call in ("SELECT task_wait(NULL)", "SELECT task_wait(1, NULL)"):
        with pytest.raises(psycopg.errors.NullValueNotAllowed, match="task_wait needs a task id"):
            shared.value(call)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="task_wait needs a wait of zero or more"):
        shared.value("SELECT task_wait(1, '-1 s')")  # (it gave up at once, blaming the launcher)
    later = shared.insert("SELECT 1", plan=shared.value("SELECT now() + interval '1 hour'"), group="wait")
    with shared.connect() as conn:
        with conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="REPEATABLE READ transaction"):
                conn.execute("SELECT task_wait(%s, '5 s')", [later])
        with conn.transaction(force_rollback=True):
            mine = conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match=f"task {mine} was inserted or updated by this transaction: it cannot start"):
                conn.execute("SELECT task_wait(%s, '5 s')", [mine])
        with conn.transaction(force_rollback=True):
            with conn.transaction():  # (a savepoint, released: the row stays the transaction's)
                nested = conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match=f"task {nested} was inserted or updated by this transaction: it cannot start"):
                conn.execute("SELECT task_wait(%s, '5 s')", [nested])
    shared.sql("DELETE FROM task WHERE id = %s", [later])


def test_task_wait_of_a_task_its_transaction_updated_says_what_it_waits_for(running):
    """A task whose row the caller's open transaction updated cannot start (a waiting one: the
    claims skip the row) or end (a running one: its end waits for the row) before the commit:
    task_wait says which at once.  (It said the task was inserted by the transaction.)"""
    with running.connect() as gate, running.connect() as conn:
        gate.execute("SELECT pg_advisory_lock(4245)")  # (the running task runs until the test lets it end)
        working = running.insert("SELECT pg_advisory_xact_lock_shared(4245) IS NULL AS ran", delete=False)
        wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [working]) == "WORK", 20)
        waiting = running.insert("SELECT 'later'", delete=False,
                                 plan=running.value("SELECT now() + interval '1 hour'"))
        for task_id, words in ((waiting, "was inserted or updated by this transaction: it cannot start"),
                               (working, "was updated by this transaction: it cannot end")):
            with conn.transaction(force_rollback=True):
                conn.execute("UPDATE task SET data = 'mine' WHERE id = %s", [task_id])
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"task {task_id} {words}"):
                    conn.execute("SELECT task_wait(%s, '5 s')", [task_id])
        gate.execute("SELECT pg_advisory_unlock(4245)")
    assert running.wait_done(working)["output"] == "f"
    running.sql("DELETE FROM task WHERE id = %s", [waiting])


def test_task_wait_of_a_task_whose_end_or_query_waits_for_its_session_says_so_at_once(running):
    """A running task whose end waits for the caller's open transaction (its retry's INSERT for the
    task of its key this transaction enqueued), or whose query waits for a row the transaction
    updated: task_wait waited out its whole time, and said the task was running (a probe).  It
    says at once what holds the task up."""
    first = running.value("SELECT task_enqueue('SELECT pg_sleep(0.5); SELECT 1 / 0', key => 'k', retry => 1,"
                          " retry_on => '{22012}', retry_delay => '1 h', \"group\" => 'k')")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [first]) == "WORK", 20)
    running.sql("CREATE TABLE held_rows (n int)")
    running.sql("INSERT INTO held_rows VALUES (0)")
    with running.connect() as conn:
        conn.autocommit = False
        conn.execute("SELECT task_enqueue('SELECT 2', key => 'k', on_conflict => 'skip', \"group\" => 'k')")
        began = time.monotonic()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match=f"task {first} cannot end while this session holds what it waits for: its end"
                                 r" \(worker backend \d+\) waits for a lock this session holds"):
            conn.execute("SELECT task_wait(%s, '30 s')", [first])
        assert time.monotonic() - began < 20
        conn.rollback()
        assert running.wait_done(first)["state"] == "FAIL"
        conn.execute("UPDATE held_rows SET n = 1")
        counting = running.insert("UPDATE held_rows SET n = n + 1", delete=False)
        wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [counting]) == "WORK", 20)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match=f"task {counting} cannot end while this session holds what it waits for: its query"):
            conn.execute("SELECT task_wait(%s, '30 s')", [counting])
        conn.rollback()
    assert running.wait_done(counting)["state"] == "DONE"
    assert running.value("SELECT n FROM held_rows") == 1
    running.sql("DELETE FROM task WHERE key = 'k'")


def test_task_wait_waits_out_a_foreign_keys_lock_of_its_own_transaction(running):
    """A row of another table that references a task takes a KEY SHARE lock on the task's row
    (the foreign key's check), which keeps the task from neither starting nor ending: task_wait
    in that transaction returns the task's end.  (It said at once that the task, locked by this
    transaction, could not end before the commit.)"""
    running.sql("CREATE TABLE task_refs (task_id bigint REFERENCES task (id))")
    working = running.insert("SELECT pg_sleep(0.5), 'ran'", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [working]) == "WORK", 20)
    waiting = running.insert("SELECT 'later'", delete=False, plan=running.value("SELECT now() + interval '1 s'"))
    with running.connect() as conn:
        conn.autocommit = False
        conn.execute("INSERT INTO task_refs VALUES (%s), (%s)", [working, waiting])
        for task_id, output in ((working, "pg_sleep\t?column?\n\tran"), (waiting, "later")):
            row = conn.execute("SELECT state::text, output FROM task_wait(%s, '30 s')", [task_id]).fetchone()
            assert row == ("DONE", output)
        conn.rollback()


def test_task_wait_of_a_task_its_transaction_locked_says_so_when_it_gives_up(running):
    """SELECT ... FOR UPDATE keeps a waiting task from starting until the transaction ends:
    task_wait gives up after its time (the lock may be a foreign key's, which keeps nothing
    back), and its hint names the lock rather than the launcher."""
    task_id = running.insert("SELECT 1", delete=False)
    with running.connect() as conn:
        conn.autocommit = False
        conn.execute("SELECT id FROM task WHERE id = %s FOR UPDATE", [task_id])
        with pytest.raises(psycopg.errors.QueryCanceled, match=f"task {task_id} is still PLAN") as raised:
            conn.execute("SELECT task_wait(%s, '1 s')", [task_id])
        assert raised.value.diag.message_hint.startswith(
            "This transaction holds a lock on the task's row: one of task_cancel, SELECT ... FOR UPDATE"), \
            raised.value.diag.message_hint
        assert "keeps it from starting until the transaction commits" in raised.value.diag.message_hint
        conn.rollback()
    assert running.wait_done(task_id)["state"] == "DONE"


def given_up_hints(db, task_ids) -> dict:
    """The hint of each task's task_wait that gives up (0.1 s), by task id."""
    hints = {}
    for task_id in task_ids:
        with pytest.raises(psycopg.errors.QueryCanceled, match=f"task {task_id} is still PLAN") as raised:
            db.sql("SELECT task_wait(%s, '0.1 s')", [task_id])
        hints[task_id] = raised.value.diag.message_hint
    return hints

def test_task_wait_that_gives_up_says_what_the_task_waits_for(db):
    """Its hint asked whether a launcher was running, for a task that waited for its
    prerequisites or for its plan."""
    later = db.value("INSERT INTO task (input, plan) VALUES ('SELECT 1', '2100-01-01 00:00+00') RETURNING id")
    dependent = db.insert("SELECT 2", after=[later])
    hints = given_up_hints(db, (later, dependent))
    assert hints[later].startswith("It is planned for 2100-01-01"), hints
    assert hints[dependent].startswith(f"It waits for 1 of its prerequisites (after: {{{later}}}) to end."), hints


def test_task_wait_that_gives_up_names_the_pause_of_a_negative_max(running):
    """A task held by its group's pause after a run (max < 0) was hinted `It is due ... Is a
    launcher running?` (a probe): the hint says when the pause ends."""
    ran = running.wait_done(running.insert("SELECT 1", group="spaced hint", max=-600000, drift=True, delete=False))
    held = running.insert("SELECT 2", group="spaced hint", max=-600000, drift=True)
    try:
        hint = given_up_hints(running, (held,))[held]
        until = ran["stop"] + timedelta(minutes=10)
        assert hint == (f"Its group 'spaced hint' waits out the pause of 600000 ms after its last run (max -600000):"
                        f" it starts at {running.value('SELECT %s::timestamptz::text', [until])} at the earliest."
                        " Wait longer with task_wait(id, interval)."), hint
    finally:
        running.sql("SELECT task_cancel(%s)", [held])


def test_task_wait_of_a_role_with_the_tables_grants_alone_gives_up_as_any(db):
    """A role granted the table by hand, as README says (not pgtaskpy_user): its task_wait that ran
    out failed `permission denied for table group_limit` (its hint's look), not 57014 (a review)."""
    db.sql("CREATE ROLE by_hand")
    try:
        db.sql("GRANT SELECT, INSERT, UPDATE, DELETE ON task TO by_hand")
        db.sql("GRANT USAGE ON SEQUENCE task_id_seq TO by_hand")
        with db.connect() as conn:
            conn.execute("SET ROLE by_hand")
            task_id = conn.execute("INSERT INTO task (input, plan, max) VALUES ('SELECT 1', '2100-01-01 00:00+00', -5)"
                                   " RETURNING id").fetchone()[0]
            with pytest.raises(psycopg.errors.QueryCanceled) as raised:
                conn.execute("SELECT task_wait(%s, '0.1 s')", [task_id])
            assert raised.value.diag.message_hint.startswith("It is planned for 2100-01-01"), raised.value
    finally:
        db.sql("DELETE FROM task WHERE owner = 'by_hand'")
        db.sql("REVOKE ALL ON task FROM by_hand; REVOKE ALL ON SEQUENCE task_id_seq FROM by_hand; DROP ROLE by_hand")


def test_task_wait_that_gives_up_names_a_pause_a_rate_limit_or_a_running_limit(db):
    """A task held by its group's pause or rate limit, or by its role's running limit of 0, was
    hinted `Is a launcher running?`."""
    db.sql("SELECT task_pause('held')")
    db.sql("SELECT task_limit('slow', 1, '1 hour')")
    paused = db.insert("SELECT 1", group="held")
    limited = db.insert("SELECT 1", group="slow")
    db.sql("CREATE ROLE hint_nobody IN ROLE pgtaskpy_user")
    try:
        db.sql("ALTER ROLE hint_nobody SET pg_task_py.role_running_limit = 0")
        with db.connect() as conn:
            conn.execute("SET ROLE hint_nobody")
            held_back = conn.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
            conn.commit()
        hints = given_up_hints(db, (paused, limited, held_back))
        assert hints[paused] == "Its group 'held' of role postgres is paused: task_resume('held') lets it start.", hints
        assert hints[limited].startswith("Its group 'slow' of role postgres starts at most 1 tasks per 01:00:00"
                                         " (task_limit): it waits its turn."), hints
        assert hints[held_back] == ("Role hint_nobody may run no task: its pg_task_py.role_running_limit"
                                    " (or CONNECTION LIMIT) is 0."), hints
    finally:
        db.sql("DELETE FROM task WHERE owner = 'hint_nobody'")
        db.sql("DROP ROLE hint_nobody")

def test_task_wait_that_gives_up_names_a_running_run_of_its_key_or_its_exclusiveness(running):
    """A task behind a running run of its key, or an exclusive one waiting for the tasks that
    run, was hinted `Is a launcher running?` with a launcher running (a probe)."""
    sleeper = running.insert("SELECT pg_sleep(30)", key="nightly", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [sleeper]) == "WORK", 20,
               message="the key's run running")
    behind = running.value("SELECT task_enqueue('SELECT 1', key => 'nightly', on_conflict => 'skip')")
    exclusive = running.insert("SELECT 1", exclusive=True, group="alone")
    hints = given_up_hints(running, (behind, exclusive))
    assert hints[behind].startswith("A run of its key 'nightly' is running: the runs of a key never overlap"), hints
    assert hints[exclusive].startswith("It is exclusive: it starts once no other task of the database is claimed"
                                       " or running."), hints
    running.sql("SELECT task_cancel(%s)", [sleeper])
    assert running.wait_done(exclusive)["state"] == "DONE"


def test_task_wait_on_a_running_task_names_its_run_and_a_task_may_not_wait_for_its_own_end(running):
    """A running task's wait that gave up was hinted `it starts once its group has room ... Is a
    launcher running?`; a task that waited for its own end waited its whole wait_for (a probe)."""
    sleeper = running.insert("SELECT pg_sleep(30)", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [sleeper]) == "WORK", 20,
               message="the task running")
    with pytest.raises(psycopg.errors.QueryCanceled, match=f"task {sleeper} is still WORK") as raised:
        running.sql("SELECT task_wait(%s, '0.1 s')", [sleeper])
    assert raised.value.diag.message_hint.startswith("It is running (since "), raised.value.diag.message_hint
    assert f"task_cancel({sleeper})" in raised.value.diag.message_hint
    running.sql("SELECT task_cancel(%s)", [sleeper])
    itself = running.wait_done(running.insert(
        "SELECT task_wait(current_setting('pg_task.id')::bigint, '1 hour')", delete=False))
    assert (itself["state"], itself["sqlstate"]) == ("FAIL", "55000"), itself
    assert f"task {itself['id']} cannot wait for its own end" in itself["error"], itself["error"]


def test_wide_result(shared):
    columns = ", ".join(f"{i} AS c{i}" for i in range(1, 401))
    lines = run(shared, f"SELECT {columns}")["output"].split("\n")
    assert lines[0].split("\t") == [f"c{i}" for i in range(1, 401)]
    assert lines[1].split("\t") == [str(i) for i in range(1, 401)]


def test_role_settings_of_the_owner_apply(shared):
    shared.sql(f"ALTER ROLE postgres IN DATABASE {shared.name} SET work_mem = '7MB'")
    try:
        assert run(shared, "SHOW work_mem", group="role_setting")["output"] == "7MB"
    finally:
        shared.sql(f"ALTER ROLE postgres IN DATABASE {shared.name} RESET work_mem")
