"""Output and error text, byte for byte as pg_task writes them (README: Table `task`)."""

import pytest
from pg_task_py_testing import wait_until

TAB = "\t"


def run(db, input, **columns):
    """Run one task through the real launcher and return its finished row."""
    columns.setdefault("delete", False)
    return db.wait_done(db.insert(input, **columns))


@pytest.mark.parametrize(
    ("input", "output"),
    [
        ("SELECT 1 AS a", "1"),
        ("SELECT 1 AS a, 2 AS b", f"a{TAB}b\n1{TAB}2"),
        ("SELECT 1 AS a;SELECT 2 AS b", "1\n2"),
        ("SELECT 1 AS a, 2 AS b;SELECT 3 AS c", f"a{TAB}b\n1{TAB}2\n3"),
        ("SELECT x AS a FROM generate_series(1, 3) AS x", "1\n2\n3"),
        ("SELECT NULL AS a", "\\N"),
        ("SELECT 1 AS a, NULL AS b", f"a{TAB}b\n1{TAB}\\N"),
        ("CREATE TEMP TABLE t (i int); INSERT INTO t VALUES (1), (2); DELETE FROM t WHERE i = 1",
         "CREATE TABLE\nINSERT 0 2\nDELETE 1"),
        ("DELETE FROM task WHERE false", "DELETE 0"),
        ("CREATE TEMP TABLE r (i int); INSERT INTO r VALUES (5) RETURNING i", "CREATE TABLE\n5"),
        ("BEGIN; SELECT 1 AS a", "BEGIN\n1\nCOMMIT"),
        ("VACUUM", "VACUUM"),
        ("SELECT 'x' AS a, true AS b, '{1,2}'::int[] AS c, '{\"k\": 1}'::jsonb AS d",
         f"a{TAB}b{TAB}c{TAB}d\nx{TAB}t{TAB}{{1,2}}{TAB}{{\"k\": 1}}"),
    ],
)
def test_output_examples(shared, input, output):
    row = run(shared, input)
    assert (row["state"], row["output"], row["error"]) == ("DONE", output, None)


def test_header_off_null_and_delimiter(shared):
    row = run(shared, "SELECT 1 AS a, NULL AS b", header=False, delimiter=",", null="null")
    assert row["output"] == "1,null"


def test_quote_and_escape(shared):
    row = run(shared, "SELECT 'a\"b\\c'", quote='"', escape="\\")
    assert row["output"] == '"a\\"b\\\\c"'


def test_string_quotes_only_string_values(shared):
    query = "SELECT 'x' AS s, 1 AS n"
    assert run(shared, query, quote="'")["output"] == f"'s'{TAB}'n'\n'x'{TAB}1"
    assert run(shared, query, quote="'", string=False)["output"] == f"'s'{TAB}'n'\n'x'{TAB}'1'"


def test_string_leaves_numbers_booleans_and_bits_unquoted_as_pg_task_does(shared):
    """Everything else is quoted: a timestamp, a uuid, json, an array (only type category S was,
    and a CSV of json or arrays, whose text holds the delimiter, had fields too many)."""
    query = ("SELECT 1::int2, 2, 3::int8, 2.5::numeric, 0.5::float4, 0.25::float8, true, B'101', 7::oid,"
             " 'x'::text, '{\"a\":1,\"b\":2}'::json, ARRAY[1,2], '2024-01-01 10:00'::timestamp,"
             " 'f47ac10b-58cc-4372-a567-0e02b2c3d479'::uuid, 'a,b'::varchar")
    row = run(shared, query, header=False, delimiter=",", quote='"')
    assert row["output"] == ('1,2,3,2.5,0.5,0.25,t,101,7,"x","{\"a\":1,\"b\":2}","{1,2}","2024-01-01 10:00:00",'
                             '"f47ac10b-58cc-4372-a567-0e02b2c3d479","a,b"')


@pytest.mark.parametrize(
    ("input", "error"),
    [
        ("SELECT 1/0 AS a", "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0 AS a"),
        ("SELEKT 1", 'ERROR:  syntax error at or near "SELEKT" at character 1\nSTATEMENT:  SELEKT 1'),
        ("DO $$BEGIN RAISE EXCEPTION 'boom' USING DETAIL = 'd', HINT = 'h'; END$$",
         "ERROR:  boom\nDETAIL:  d\nHINT:  h\nCONTEXT:  PL/pgSQL function inline_code_block line 1 at RAISE\n"
         "STATEMENT:  DO $$BEGIN RAISE EXCEPTION 'boom' USING DETAIL = 'd', HINT = 'h'; END$$"),
        ("CREATE TEMP TABLE u (i int PRIMARY KEY); INSERT INTO u VALUES (1), (1)",
         'ERROR:  duplicate key value violates unique constraint "u_pkey"\n'
         "DETAIL:  Key (i)=(1) already exists.\n"
         "STATEMENT:  CREATE TEMP TABLE u (i int PRIMARY KEY); INSERT INTO u VALUES (1), (1)"),
    ],
)
def test_errors_as_the_server_log_prints_them(shared, input, error):
    row = run(shared, input)
    assert (row["state"], row["error"]) == ("FAIL", error)


def test_an_open_transaction_whose_commit_fails_keeps_its_output_and_detail(shared):
    """The COMMIT added for an input that leaves a transaction open fails as a COMMIT of its own
    does: its output kept, its error with the DETAIL the server gives."""
    shared.sql("CREATE TABLE deferred_parent (i int PRIMARY KEY)")
    shared.sql("CREATE TABLE deferred_child (i int REFERENCES deferred_parent DEFERRABLE INITIALLY DEFERRED)")
    row = run(shared, "BEGIN; INSERT INTO deferred_child VALUES (99999)")
    assert (row["state"], row["sqlstate"], row["output"]) == ("FAIL", "23503", "BEGIN\nINSERT 0 1")
    assert row["error"] == (
        'ERROR:  insert or update on table "deferred_child" violates foreign key constraint "deferred_child_i_fkey"\n'
        'DETAIL:  Key (i)=(99999) is not present in table "deferred_parent".\n'
        "STATEMENT:  BEGIN; INSERT INTO deferred_child VALUES (99999)")
    assert shared.value("SELECT count(*) FROM deferred_child") == 0


def test_an_open_transaction_whose_session_ends_before_its_commit_keeps_its_output_and_notices(shared):
    """The server ended the session (idle_in_transaction_session_timeout) after the input had
    returned everything and before the COMMIT added: the task failed with the server's words, but
    without the output and notices it had returned."""
    row = run(shared, "SET idle_in_transaction_session_timeout = '1ms'; DO $$BEGIN RAISE NOTICE 'kept'; END$$;"
                      " BEGIN; SELECT generate_series(1, 3000)")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "25P03"), row
    assert row["output"].startswith("SET\nDO\nBEGIN\n1\n2\n"), row["output"][:200]
    assert row["output"].endswith("\n3000"), row["output"][-200:]
    assert "kept" in row["notice"], row
    assert "idle-in-transaction timeout" in row["error"], row


@pytest.fixture
def slow_commit(running):
    """A table whose rows a deferred trigger takes 30 s to check: an input that inserts one and
    leaves its transaction open spends that in the COMMIT the worker adds."""
    running.sql("CREATE TABLE slow_commit (i int)")
    running.sql("CREATE FUNCTION sleep_at_commit() RETURNS trigger LANGUAGE plpgsql"
                " AS $$BEGIN PERFORM pg_sleep(30); RETURN NULL; END$$")
    running.sql("CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON slow_commit"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sleep_at_commit()")
    yield "BEGIN; INSERT INTO slow_commit VALUES (1)"
    running.sql("SELECT task_cancel(id) FROM task WHERE state = 'WORK'")


def test_a_worker_in_the_commit_it_added_acts_on_interrupts(running, slow_commit):
    """The worker waited for the COMMIT added after the input without checking for interrupts, as
    it does every 50 ms while the input runs: a DROP DATABASE of another database, which waits
    for every backend, waited for the end of the commit."""
    task_id = running.insert(slow_commit, delete=False)
    wait_until(lambda: running.value("SELECT count(*) FROM task AS t JOIN pg_stat_activity AS a ON a.pid = t.pid"
                                     " WHERE t.id = %s AND a.query = 'COMMIT' AND a.state = 'active'", [task_id]),
               20, 0.05, "the COMMIT added, running")
    with running.cluster.connect() as admin:
        admin.autocommit = True
        admin.execute(f"CREATE DATABASE {running.name}_dropped")
        admin.execute("SET statement_timeout = '10s'")  # (it waited the commit's 30 s)
        admin.execute(f"DROP DATABASE {running.name}_dropped")
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    row = running.wait_done(task_id, 30)
    assert (row["state"], row["sqlstate"], row["output"]) == ("FAIL", "57014", "BEGIN\nINSERT 0 1"), row


def test_a_bursts_task_in_the_commit_it_added_holds_back_no_other_task_of_the_burst(running, slow_commit):
    """In a burst's worker, which runs its tasks side by side, the COMMIT added for one task was
    waited for alone: every task of the batch still running then ended 30 s late, its session
    held meanwhile."""
    ids = [task_id for (task_id,) in running.sql(
        "INSERT INTO task (input, \"group\", delete) SELECT CASE i WHEN 0 THEN %s ELSE 'SELECT pg_sleep(0.5)' END,"
        " 'g' || i, false FROM generate_series(0, 40) AS i ORDER BY i RETURNING id", [slow_commit])]
    slow, quick = ids[0], ids[1:]
    rows = [running.wait_done(task_id, 30) for task_id in quick]
    assert {row["state"] for row in rows} == {"DONE"}, rows
    assert max(row["stop"] - row["start"] for row in rows).total_seconds() < 10, rows
    assert running.value("SELECT state::text FROM task WHERE id = %s", [slow]) == "WORK"


def test_failed_statement_rolls_back_the_implicit_transaction(shared):
    shared.sql("CREATE TABLE audit_rollback (i int)")
    row = run(shared, "INSERT INTO audit_rollback VALUES (1); SELECT 1/0")
    assert row["state"] == "FAIL"
    assert shared.value("SELECT count(*) FROM audit_rollback") == 0


def test_copy_from_the_client_fails_and_rolls_back_the_input(shared):
    shared.sql("CREATE TABLE copied_in (i int)")
    row = run(shared, "INSERT INTO copied_in VALUES (1); COPY copied_in FROM STDIN; INSERT INTO copied_in VALUES (2)")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "0A000")
    assert row["error"].startswith("ERROR:  COPY FROM STDIN is not supported\n")
    assert shared.value("SELECT count(*) FROM copied_in") == 0  # the whole input failed, as its error says


def test_copy_to_stdout_writes_its_rows_into_the_output(shared):
    # The statements before and after it run, and the task says so: DONE, not a FAIL whose work was
    # committed all the same (a retry then did it twice).
    shared.sql("CREATE TABLE copied_out (i int, t text)")
    row = run(shared, "INSERT INTO copied_out VALUES (1, 'a b'), (2, NULL);"
                      " COPY copied_out TO STDOUT; COPY (SELECT 'x,y' AS v, 3 AS n) TO STDOUT (FORMAT csv, HEADER);"
                      " INSERT INTO copied_out VALUES (3, 'c')")
    assert row["state"] == "DONE"
    assert row["output"] == "INSERT 0 2\n1\ta b\n2\t\\N\nCOPY 2\nv,n\n\"x,y\",3\nCOPY 1\nINSERT 0 1"
    assert shared.value("SELECT count(*) FROM copied_out") == 3


def test_copy_to_stdout_in_binary_is_hex(shared):
    row = run(shared, "COPY (SELECT 1::int2) TO STDOUT (FORMAT binary)")
    assert row["state"] == "DONE"
    lines = row["output"].split("\n")
    assert lines[-1] == "COPY 1" and all(line.startswith("\\x") for line in lines[:-1]), lines
    assert bytes.fromhex("".join(line[2:] for line in lines[:-1])).startswith(b"PGCOPY\n\xff\r\n\x00")


def test_copy_to_stdout_past_the_output_limit_is_cancelled_and_rolled_back(running):
    running.sql("CREATE TABLE copied_big (i int)")
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 1000")
    row = run(running, "INSERT INTO copied_big VALUES (1); COPY (SELECT generate_series(1, 10000000)) TO STDOUT")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "54000"), row
    assert row["error"].startswith("ERROR:  task output exceeds 1000 characters\n"), row
    assert running.value("SELECT count(*) FROM copied_big") == 0
    after = run(running, "COPY (SELECT 'still here') TO STDOUT")  # the worker and its next session are fine
    assert (after["state"], after["output"]) == ("DONE", "still here\nCOPY 1"), after



def worker_peak_rss_mib(pid: int) -> float:
    """The most memory the backend `pid` has held (VmHWM: resident, shared pages it touched too)."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("columns", [{}, {"count": 5}], ids=["one-off", "kept"])
def test_notifications_a_task_sends_itself_do_not_grow_its_worker(running, columns):
    """A task that LISTENs on a channel it notifies: libpq kept each notification until the task
    ended, 30,000 of 8 kB grew the worker (which runs every role's tasks) by 230 MB (a probe)."""
    task_id = running.insert("LISTEN c; SELECT count(pg_notify('c', repeat('x', 7890) || g))"
                             " FROM generate_series(1, 30000) AS g", delete=False, **columns)
    worker = wait_until(lambda: running.value("SELECT worker FROM task WHERE id = %s AND state = 'WORK'", [task_id]),
                        20, 0.005, "the task's worker")
    row = running.wait_done(task_id, 120)
    assert (row["state"], row["output"]) == ("DONE", "LISTEN\n30000"), row
    assert worker_peak_rss_mib(worker) < 120

def test_an_error_is_cut_at_the_output_limit_and_its_log_line_at_a_thousand_characters(running):
    """A task's error had no bound: one of 200 MB was written whole to its row, and its first line
    to the launcher, whose turn, every role's, took 6-27 s to log it (a probe)."""
    huge = "DO $$ BEGIN RAISE EXCEPTION '%', repeat('x', 3000000); END $$"
    row = run(running, huge)
    assert row["state"] == "FAIL" and len(row["error"]) < 3000000 + 1000, len(row["error"])  # (within 100 MB)
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 100000")
    row = run(running, huge)
    assert row["state"] == "FAIL" and row["error"].startswith("ERROR:  xxx")
    assert len(row["error"]) < 100100
    assert row["error"].endswith("\n(the rest of the error dropped: pg_task_py.output_limit)")
    [launcher] = running.launchers
    wait_until(lambda: f"task {row['id']} FAIL" in launcher.output(), 10, 0.05, "the launcher to log the end")
    [line] = [line for line in launcher.output().splitlines() if f"task {row['id']} FAIL" in line]
    assert 1000 < len(line) < 1200 and line.endswith("x..."), len(line)


def test_a_tiny_output_limit_still_says_why_the_task_failed(running):
    """The scheduler's own error was cut at the limit too: `ERROR:  ta` with a limit of 10 (a probe)."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 10")
    row = run(running, "SELECT repeat('é', 11) AS v")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "54000"), row
    assert row["error"].startswith("ERROR:  task output exceeds 10 characters\n(the rest of the error dropped"), row


def test_copy_to_stdout_in_another_encoding_fails_saying_why(shared):
    """A COPY's ENCODING option has the server write its rows in that encoding: they were stored
    with U+FFFD for each character ('caf\ufffd'), and the task ended DONE (a probe)."""
    row = run(shared, "COPY (SELECT 'café' AS v) TO STDOUT (ENCODING 'LATIN1')")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "22021"), row
    assert row["error"].startswith("ERROR:  the task's output holds bytes that are not text in its session's"
                                   " encoding (UTF8)\nHINT:  A COPY ... TO STDOUT with an ENCODING option"), row
    assert run(shared, "COPY (SELECT 'café' AS v) TO STDOUT (ENCODING 'UTF8')")["output"] == "café\nCOPY 1"


def test_a_task_that_sets_two_encodings_ends_as_its_statements_did(shared):
    """Its first encoding's text is read in the second, as README says (U+FFFD): it ended FAIL
    22021 with the hint of a COPY it did not run, its statements committed (a retry ran them
    again)."""
    shared.sql("CREATE TABLE two_encodings (v text)")
    try:
        for first, back in (("", "RESET client_encoding"), ("", "SET client_encoding = 'UTF8'"),
                            ("COPY (SELECT 1) TO STDOUT; ", "RESET client_encoding")):  # (a COPY of plain text)
            row = run(shared, f"{first}INSERT INTO two_encodings VALUES ('ran'); SET client_encoding = 'LATIN1';"
                              f" SELECT 'é' AS a; {back}")
            assert (row["state"], row["error"], row["sqlstate"]) == ("DONE", None, None), row
            assert "\ufffd" in row["output"], row
        assert shared.value("SELECT count(*) FROM two_encodings") == 3
    finally:
        shared.sql("DROP TABLE two_encodings")


def test_a_latin1_database_keeps_a_tasks_error_whose_text_the_worker_could_not_read(latin1):
    """The worker writes U+FFFD for bytes that are not text in the session's encoding, which a
    LATIN1 database cannot hold: the end could not be written, and the task failed 22P05 without
    its own error, SQLSTATE and output (nor its retry, for a 40001).  `?` stands for them there."""
    conn, _ = latin1
    task_id = conn.execute("INSERT INTO task (input, delete) VALUES"
                           " ($$SET client_encoding = 'LATIN1'; SELECT 'café' AS v; SELECT 1/0$$, false) RETURNING id"
                           ).fetchone()[0]
    ended = "SELECT state::text, sqlstate, output, error FROM task WHERE id = %s AND state IN ('DONE', 'FAIL')"
    row = wait_until(lambda: conn.execute(ended, [task_id]).fetchone(), 30, 0.05)
    assert row[:3] == ("FAIL", "22012", "SET\ncaf?"), row
    assert row[3].startswith("ERROR:  division by zero"), row


def test_a_sql_ascii_session_in_a_latin1_database_reads_the_databases_text(latin1):
    """SQL_ASCII converts nothing: the server sends LATIN1's bytes, which the worker read as UTF-8,
    and the task failed 22P05 for a character LATIN1 holds (a probe)."""
    conn, _ = latin1
    task_id = conn.execute("INSERT INTO task (input, delete) VALUES"
                           " ($$SET client_encoding = 'SQL_ASCII'; SELECT 'é' AS v$$, false) RETURNING id"
                           ).fetchone()[0]
    ended = "SELECT state::text, output FROM task WHERE id = %s AND state IN ('DONE', 'FAIL')"
    assert wait_until(lambda: conn.execute(ended, [task_id]).fetchone(), 30, 0.05) == ("DONE", "SET\né")


def test_statements_that_cannot_run_in_a_transaction_block(shared):
    row = run(shared, "CREATE DATABASE made_by_a_task")
    assert (row["state"], row["output"]) == ("DONE", "CREATE DATABASE")
    assert run(shared, "DROP DATABASE made_by_a_task")["output"] == "DROP DATABASE"


def test_task_sees_its_own_id(shared):
    task_id = shared.insert("SELECT current_setting('pg_task.id')", delete=False)
    assert shared.wait_done(task_id)["output"] == str(task_id)


def test_task_without_output_is_deleted_when_asked(shared):
    task_id = shared.insert("SELECT 1 WHERE false", delete=True)
    assert shared.wait_done(task_id) is None
    kept = shared.insert("SELECT 1 WHERE false", delete=False)
    row = shared.wait_done(kept)
    assert (row["state"], row["output"], row["error"]) == ("DONE", None, None)


def test_tasks_inserted_by_a_task_have_it_as_parent(shared):
    parent = shared.insert("INSERT INTO task (input, \"group\", delete) VALUES ('SELECT 7', 'child', false)")
    shared.wait_done(parent)
    child = shared.value("SELECT id FROM task WHERE parent = %s", [parent])
    assert shared.wait_done(child)["output"] == "7"


def test_a_role_with_another_client_encoding_reads_and_writes_what_the_task_says(running):
    """A task's session speaks UTF-8 whatever its role's client_encoding: a role of a legacy
    application (LATIN1) had the input's UTF-8 bytes read as LATIN1, and wrote 'Ã©' for 'é'."""
    assert running.value("SHOW server_encoding") == "UTF8"
    running.sql("CREATE ROLE legacy_app LOGIN IN ROLE pgtaskpy_user")
    running.sql("ALTER ROLE legacy_app SET client_encoding = 'LATIN1'")
    running.sql("CREATE TABLE written (v text)")
    running.sql("GRANT INSERT ON written TO legacy_app")
    try:
        row = run(running, "INSERT INTO written VALUES ('é€'); SELECT 'é€' AS v, length('é€') AS n", owner="legacy_app")
        assert (row["state"], row["output"]) == ("DONE", f"INSERT 0 1\nv{TAB}n\né€{TAB}2"), row
        assert running.value("SELECT v FROM written") == "é€"
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP TABLE written")
        running.sql("DROP ROLE legacy_app")


def test_a_task_that_sets_its_own_client_encoding_reads_and_writes_what_it_says(shared):
    """A task may SET client_encoding in its session: the server then sends that encoding, and
    the worker reads it so (it stored 'caf\ufffd', DONE, for 'café').  A session kept with `save`
    keeps the setting for the group's next task, whose input goes in that encoding; one with a
    character the encoding lacks fails clearly, not as mojibake."""
    row = run(shared, "SET client_encoding = 'LATIN1'; DO $$BEGIN RAISE NOTICE 'é'; END$$; SELECT 'café'")
    assert (row["state"], row["output"], row["notice"]) == ("DONE", "SET\nDO\ncafé", "NOTICE:  é"), row
    row = run(shared, "SET client_encoding = 'SJIS'; SELECT 'ア' AS katakana, 1/0")
    assert row["state"] == "FAIL" and row["output"] == "SET" and "division by zero" in row["error"], row
    assert run(shared, "SET client_encoding = 'SJIS'; SELECT 'ア'")["output"] == "SET\nア"
    # The error's text too, once the SET has committed (it was 'ERROR:  invalid input syntax for type
    # integer: "\ufffd"'; an error in the SET's own transaction undoes it, and psql shows such an error's
    # bytes as they came, too).
    row = run(shared, "SET client_encoding = 'LATIN1'; COMMIT;"
                      " DO $$BEGIN RAISE EXCEPTION 'é' USING DETAIL = 'ü', HINT = 'ö'; END$$")
    assert row["error"].startswith("ERROR:  é\nDETAIL:  ü\nHINT:  ö\n"), row
    row = run(shared, "SET client_encoding = 'WIN1252'; COMMIT; SELECT 'é'::int")
    assert 'for type integer: "é"' in row["error"], row
    # EUC_TW, which Python has no codec of, is converted by the server (it was stored as U+FFFD, DONE).
    row = run(shared, "SET client_encoding = 'EUC_TW'; DO $$BEGIN RAISE NOTICE '中'; END$$; SELECT '中文'")
    assert (row["state"], row["output"], row["notice"]) == ("DONE", "SET\nDO\n中文", "NOTICE:  中"), row
    kept = {"group": "latin1", "count": 3, "save": True}
    first = shared.insert("SET client_encoding = 'LATIN1'", delete=False, **kept)
    second = shared.insert("SELECT 'é'", delete=False, **kept)
    third = shared.insert("SELECT '→'", delete=False, **kept)
    assert shared.wait_done(first)["state"] == "DONE"
    assert shared.wait_done(second)["output"] == "é"
    row = shared.wait_done(third)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "22P05"), row
    assert "has no equivalent in the session's client_encoding" in row["error"], row


def test_text_that_is_valid_in_two_encodings_is_read_in_the_one_the_input_ended_with(shared):
    """The lines read in the session's encoding as the input was sent were kept as read when
    their bytes were text in it too, whatever the encoding the input ended with: a LATIN1 'Ã©'
    was stored 'é', GB18030's '通知' '֪ͨ' (valid UTF-8 both), and a kept LATIN1 session's next
    task, which RESET it, had UTF-8's 'é' stored 'Ã©' (a probe)."""
    row = run(shared, "SET client_encoding = 'LATIN1'; SELECT 'Ã©' AS x, length('Ã©') AS n")
    assert (row["state"], row["output"]) == ("DONE", "SET\nx\tn\nÃ©\t2"), row
    row = run(shared, "SET client_encoding = 'GB18030'; DO $$BEGIN RAISE NOTICE '通知'; END$$; SELECT '通知'")
    assert (row["output"], row["notice"]) == ("SET\nDO\n通知", "NOTICE:  通知"), row
    # The worker's own text in those lines is kept as it is: a task's null, delimiter and quote,
    # and its input in the error's STATEMENT line (read again, they were stored as mojibake: a review).
    latin1 = "SET client_encoding = 'LATIN1'; "
    assert run(shared, latin1 + "SELECT NULL::text AS x, 'é' AS y", null="∅", delimiter="│")["output"] == \
        "SET\nx│y\n∅│é"
    assert run(shared, latin1 + "SELECT 'x' AS a, 'é' AS b", quote="«")["output"] == "SET\n«a«\t«b«\n«x«\t«é«"
    row = run(shared, "BEGIN; " + latin1 + "COMMIT; SELECT 1/0 AS café")
    assert row["error"].startswith("ERROR:  division by zero") and row["error"].endswith(
        "STATEMENT:  BEGIN; " + latin1 + "COMMIT; SELECT 1/0 AS café"), row
    kept = {"group": "latin1 then reset", "count": 2, "save": True}
    first = shared.insert("SET client_encoding = 'LATIN1'", delete=False, **kept)
    second = shared.insert("RESET client_encoding; SELECT 'é'", delete=False, **kept)
    assert shared.wait_done(first)["state"] == "DONE"
    assert shared.wait_done(second)["output"] == "RESET\né"


def test_a_value_in_an_encoding_the_task_set_is_quoted_and_compared_as_that_encodings_text(shared):
    """SJIS's '表' and BIG5's '許' end with the byte of a backslash: read in the encoding before the
    SET, that byte was escaped as one ('"表\\"', '許\\功'), in the header too; and a LATIN1 value
    whose bytes read as UTF-8's 'é' was taken for a task's null or delimiter 'é' (a probe)."""
    sjis = "SET client_encoding = 'SJIS'; "
    assert run(shared, sjis + "SELECT '表' AS a", quote='"', escape="\\")["output"] == 'SET\n"表"'
    assert run(shared, sjis + "SELECT '表\\' AS a", string=False, quote="'", escape="\\")["output"] == "SET\n'表\\\\'"
    assert run(shared, sjis + 'SELECT 1 AS "表", 2 AS b', quote='"', escape="\\")["output"] == 'SET\n"表"\t"b"\n1\t2'
    assert run(shared, "SET client_encoding = 'BIG5'; SELECT '許功蓋' AS a", quote="'", escape="\\")["output"] == \
        "SET\n'許功蓋'"
    latin1 = "SET client_encoding = 'LATIN1'; "
    assert run(shared, latin1 + "SELECT 'Ã©' AS a, NULL AS b", null="é")["output"] == "SET\na\tb\nÃ©\té"
    assert run(shared, latin1 + "SELECT 'Ã©' AS a, 'b' AS b", delimiter="é")["output"] == "SET\naéb\nÃ©éb"
    # EUC_TW, read as UTF-8 (Python has no codec of it): its '一' is valid UTF-8's 'ġ', and was kept so
    euc_tw = "SET client_encoding = 'EUC_TW'; "
    assert run(shared, euc_tw + "SELECT '一' AS a, '中文' AS b")["output"] == "SET\na\tb\n一\t中文"
    assert run(shared, euc_tw + "SELECT '一'")["output"] == "SET\n一"
    # SET NAMES, the same setting (a review)
    assert run(shared, "SET NAMES 'SJIS'; SELECT '表' AS a", quote='"', escape="\\")["output"] == 'SET\n"表"'
    assert run(shared, "SET NAMES 'LATIN1'; SELECT 'Ã©' AS a, NULL AS b", null="é")["output"] == "SET\na\tb\nÃ©\té"


def test_a_task_whose_only_result_is_a_warning_keeps_its_row(running):
    """`delete` (true by default) took the row of a task that returned no output and no error,
    and its WARNING with it: nothing was left of it (a probe).  A row whose notices hold a
    WARNING is kept; one with plain NOTICEs goes, as before."""
    running.sql("CREATE FUNCTION warns_only(level text) RETURNS SETOF int LANGUAGE plpgsql AS $$ BEGIN"
                " IF level = 'warning' THEN RAISE WARNING 'disk almost full'; ELSE RAISE NOTICE 'all well'; END IF;"
                " END $$")
    try:
        warned = running.insert("SELECT * FROM warns_only('warning')")
        noticed = running.insert("SELECT * FROM warns_only('notice')")
        row = running.wait_done(warned)
        assert (row["state"], row["output"], row["notice"]) == ("DONE", None, "WARNING:  disk almost full"), row
        wait_until(lambda: running.value("SELECT count(*) FROM task WHERE id = %s", [noticed]) == 0, 20, 0.05,
                   "the row of the task with a NOTICE only deleted")
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP FUNCTION warns_only(text)")


def test_notices_are_bounded_by_the_output_limit(running):
    """A task's notices count against pg_task_py.output_limit too: past it they are dropped, and
    the column says so, so that RAISE NOTICE in a loop fills neither the worker nor the row."""
    running.sql(f"ALTER DATABASE {running.name} SET pg_task_py.output_limit = 1000")
    row = run(running, "DO $$BEGIN FOR i IN 1..50 LOOP RAISE NOTICE '%', repeat('n', 100); END LOOP; END$$")
    assert row["state"] == "DONE", row
    assert len(row["notice"]) <= 1000 + 100, len(row["notice"])
    assert row["notice"].endswith("(notices past 1000 characters dropped: pg_task_py.output_limit)"), row["notice"]
    exact = run(running, "SELECT repeat('x', 1000)")
    assert (exact["state"], len(exact["output"])) == ("DONE", 1000), exact
