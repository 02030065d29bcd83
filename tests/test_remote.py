"""Tasks with `remote`: run on another server with the same output, errors, timeouts and cancel."""

import os
import re
import signal
import socket
import threading
import time

import psycopg
import pytest
from pg_task_py_testing import throwaway_cluster, wait_until

PASSWORD = "s3cret pw"


@pytest.fixture(scope="module")
def remote():
    """A second cluster (testing.postgresql, another port) that asks for passwords, with a database and a role."""
    with throwaway_cluster(hba="local all postgres trust\nlocal all all scram-sha-256\n") as cluster:
        with cluster.connect() as conn:
            conn.execute("CREATE DATABASE remotedb")
            conn.execute(f"CREATE ROLE remote_user LOGIN PASSWORD '{PASSWORD}'")
        yield cluster


def conninfo(remote, password=PASSWORD):
    return f"host={remote.socket_dir} port={remote.port} dbname=remotedb user=remote_user password='{password}'"


def run(db, input, **columns):
    columns.setdefault("delete", False)
    return db.wait_done(db.insert(input, **columns), 30)


def test_remote_task_output_and_error_as_local(running, remote):
    row = run(running, "SELECT current_database(), current_user; SELECT 1 AS a", remote=conninfo(remote))
    assert (row["state"], row["output"]) == ("DONE", "current_database\tcurrent_user\nremotedb\tremote_user\n1")
    row = run(running, "SELECT 1/0 AS a", remote=conninfo(remote))
    assert (row["state"], row["error"]) == ("FAIL", "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0 AS a")


def test_remote_pid_is_the_remote_backend(running, remote):
    row = run(running, "SELECT pg_backend_pid()", remote=conninfo(remote))
    assert row["output"] == str(row["pid"])


def test_remote_timeout(running, remote):
    row = run(running, "SELECT pg_sleep(10)", remote=conninfo(remote), timeout="0.3 s")
    assert row["error"].startswith("ERROR:  canceling statement due to statement timeout")


def test_remote_cancel(running, remote):
    task_id = running.insert("SELECT pg_sleep(30)", remote=conninfo(remote), delete=False)
    wait_until(lambda: running.task(task_id)["state"] == "WORK", message="WORK")
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    row = running.wait_done(task_id, 10)
    assert row["state"] == "FAIL" and row["error"].startswith("ERROR:  canceling statement due to user request")


def test_a_cancel_that_reaches_a_remote_tasks_worker_as_its_query_ends_is_no_lost_run(running):
    """task_cancel of a remote task signals its worker once it has the task's row.  A remote task
    of this very database that wrote its own row holds that row until its query ends: the cancel
    then came to the worker as it wrote the task's end, failed its call, and the run, which had
    ended and committed its work, ended FAIL 08006 as a lost run, and was run again under
    retry_unsafe (a probe)."""
    task_id = running.insert("UPDATE task SET data = 'half' WHERE id = current_setting('pg_task.id')::bigint;"
                             " SELECT pg_sleep(1.5)", remote=f"dbname={running.name}", retry=1, retry_unsafe=True,
                             retry_delay="0 s", delete=False)
    wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity AS a JOIN task AS t ON t.pid = a.pid"
                                     " WHERE t.id = %s AND a.wait_event = 'PgSleep'", [task_id]) == 1, 20, 0.02,
               "the task's sleep, after its own write")
    running.value("SELECT task_cancel(%s)", [task_id])
    row = running.wait_done(task_id, 30)
    assert (row["state"], row["sqlstate"], row["error"]) == ("DONE", None, None), row
    running.wait_all_done()
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0


def test_cancels_called_again_while_a_target_tasks_end_waits_end_it_as_cancelled(running):
    """task_cancel of a task of a target (or remote) signals its worker, which passes the cancel
    on to the task's query.  Called again in the caller's open transaction, which holds the task's
    row, each call signalled the worker again as it waited for that row to write the task's end,
    and the sixth failed its call: the cancelled task ended FAIL 08006 as a lost run (a probe)."""
    task_id = running.insert("SELECT pg_sleep(30)", target="standby", delete=False)  # (no standby: here)
    wait_until(lambda: running.task(task_id)["state"] == "WORK", message="WORK")
    worker_waits = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_task_py worker'"
                    " AND wait_event_type = 'Lock'")
    with running.connect() as caller:
        caller.execute("BEGIN")
        assert caller.execute("SELECT task_cancel(%s)", [task_id]).fetchone() == (True,)
        for _ in range(8):
            wait_until(lambda: running.value(worker_waits) == 1, 20, 0.01, "the worker waiting for the task's row")
            caller.execute("SELECT task_cancel(%s)", [task_id])
        caller.execute("COMMIT")
    row = running.wait_done(task_id)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "57014"), row
    assert row["error"].startswith("ERROR:  canceling statement due to user request"), row


def test_cancelling_a_task_whose_remote_server_stopped_answering_ends_it(running, remote):
    """A remote backend that answers nothing (here stopped: a frozen host, a network cut with no
    reset) answers neither its query nor the cancel: the task stayed WORK, its group held, a
    launcher's graceful stop left it running, and every later cancel returned true for nothing.
    The worker gives the session up CANCEL_ANSWER_WAIT (10 s) after the cancel, and the task
    ends FAIL, not retried (a cancel's end)."""
    task_id = running.insert("SELECT pg_sleep(60)", remote=conninfo(remote), retry=2, delete=False)
    wait_until(lambda: running.task(task_id)["state"] == "WORK", message="WORK")
    frozen = running.task(task_id)["pid"]
    os.kill(frozen, signal.SIGSTOP)
    try:
        cancelled = time.monotonic()
        assert running.value("SELECT task_cancel(%s)", [task_id]) is True
        row = running.wait_done(task_id, 30)
        assert 9 < time.monotonic() - cancelled < 25
        assert (row["state"], row["sqlstate"]) == ("FAIL", "57014"), row
        assert row["error"].startswith("ERROR:  the task's session did not end its query within 10 s"), row
        assert running.value("SELECT count(*) FROM task WHERE parent = %s", [task_id]) == 0  # not retried
        assert run(running, "SELECT 'next'")["output"] == "next"  # its worker is free
    finally:
        os.kill(frozen, signal.SIGCONT)


def test_a_remote_server_that_crashes_under_a_task_fails_it_in_libpq_s_words_and_its_warning(running):
    """Another backend of the remote server crashed: the server told the task's session so (a
    WARNING) and closed it.  The error read `... before or while processing the request.\n\tinvalid
    socket` (the worker had libpq wait on the closed socket), each line after the first with two
    tabs."""
    with throwaway_cluster() as far:
        task_id = running.insert("SELECT pg_sleep(60)", delete=False,
                                 remote=f"host={far.socket_dir} port={far.port} dbname=postgres user=postgres")
        wait_until(lambda: running.task(task_id)["state"] == "WORK", message="WORK")
        with far.connect() as other:
            os.kill(other.execute("SELECT pg_backend_pid()").fetchone()[0], signal.SIGKILL)
            row = running.wait_done(task_id, 30)
    assert row["state"] == "FAIL", row
    assert row["error"] == ("ERROR:  server closed the connection unexpectedly\n\tThis probably means the server"
                            " terminated abnormally\n\tbefore or while processing the request.\n"
                            "STATEMENT:  SELECT pg_sleep(60)"), row
    assert row["notice"].startswith("WARNING:  terminating connection because of crash of another server process\n"
                                    "DETAIL:  "), row


def test_a_remote_result_this_databases_encoding_cannot_hold_fails_saying_so(latin1, remote):
    """A '€' from a UTF-8 remote into a LATIN1 database: the end could not be written, the worker's
    call failed (its reason in the launcher's log only), and the task ended later as a lost run,
    08006 `task worker ended before the task finished`, which the default retry_on retries."""
    conn, launcher = latin1
    far = conn.execute("INSERT INTO task (input, remote, retry, delete) VALUES ('SELECT chr(8364)', %s, 2,"
                       " false) RETURNING id", [conninfo(remote)]).fetchone()[0]
    fine = conn.execute("INSERT INTO task (input, remote, delete) VALUES ($$SELECT 'é'$$, %s, false)"
                        " RETURNING id", [conninfo(remote)]).fetchone()[0]
    ended = "SELECT state::text, sqlstate, error, output FROM task WHERE id = %s AND state IN ('DONE', 'FAIL')"
    row = wait_until(lambda: conn.execute(ended, [far]).fetchone(), 30, 0.05, "the task's end")
    assert row[:2] == ("FAIL", "22P05") and row[3] is None, row
    assert row[2].startswith("ERROR:  the task's output, error or notices hold a character this database's"
                             " encoding cannot hold\nDETAIL:  character with byte sequence"), row
    assert conn.execute("SELECT count(*) FROM task WHERE parent = %s", [far]).fetchone() == (0,)
    assert wait_until(lambda: conn.execute(ended, [fine]).fetchone(), 30, 0.05)[::3] == ("DONE", "é")
    assert "worker failed" not in launcher.output(), launcher.output()


def test_failed_login_shows_libpq_message_never_the_password(running, remote):
    wrong = "wr0ng-Passw0rd"
    row = run(running, "SELECT 1", remote=conninfo(remote, wrong))
    assert row["state"] == "FAIL"
    assert 'password authentication failed for user "remote_user"' in row["error"]
    assert wrong not in row["error"]
    assert all(wrong not in launcher.output() for launcher in running.launchers)
    activity = running.value("SELECT string_agg(query, ' ') FROM pg_stat_activity")
    assert wrong not in (activity or "")


def test_non_superuser_remote_needs_a_password_that_is_used(running, remote):
    running.sql("CREATE ROLE carol LOGIN")
    running.sql("GRANT SELECT, INSERT ON task TO carol")
    running.sql("GRANT USAGE ON SEQUENCE task_id_seq TO carol")
    try:
        with running.connect("carol") as carol:
            def insert(remote_conninfo):
                return carol.execute("INSERT INTO task (input, remote, delete)"
                                     " VALUES ('SELECT current_user', %s, false)"
                                     " RETURNING id", [remote_conninfo]).fetchone()[0]
            # no password: would log in through the server OS user's trust/peer/.pgpass
            local_as_postgres = f"host={running.cluster.socket_dir} port={running.cluster.port} dbname=postgres"
            row = running.wait_done(insert(local_as_postgres))
            assert row["state"] == "FAIL" and "password is required" in row["error"]
            # a password the server never asks for (trust) does not count either; neither is retried
            # (08001 was, and each retry logged in as postgres again)
            retried = carol.execute("INSERT INTO task (input, remote, retry, retry_delay, delete)"
                                    " VALUES ('SELECT 1', %s, 2, '0 s', false) RETURNING id",
                                    [local_as_postgres + " user=postgres password=x"]).fetchone()[0]
            row = running.wait_done(retried)
            assert (row["state"], row["sqlstate"]) == ("FAIL", "28000") and "password is required" in row["error"]
            running.wait_all_done()
            assert running.value("SELECT count(*) FROM task WHERE parent = %s", [retried]) == 0
            # options a superuser's login applies before the rule is checked: refused unsent (a file
            # was loaded as a library in postgres's backend: `could not load library "/etc/passwd"`)
            for options in ("-c session_preload_libraries=/etc/passwd", "--session-preload-libraries=/etc/passwd",
                            "-c statement_timeout=5s -c log_min_messages=debug5", "-d 5", "-c no_such.setting=1",
                            # (getopt reads -Pc as -P -c: one allowed -c beside them let them through)
                            "-c work_mem=8MB -Pc session_preload_libraries=/etc/passwd", "-c work_mem=8MB -W 3",
                            "-c work_mem=8MB -c no_such.setting=1"):
                quoted = options.replace("\\", "\\\\").replace("'", "\\'")
                row = running.wait_done(insert(local_as_postgres + f" user=postgres password=x options='{quoted}'"))
                assert (row["state"], row["sqlstate"]) == ("FAIL", "22023"), (options, row)
                assert "options may only set settings any role may" in row["error"], row
            # those any role may set pass
            row = running.wait_done(insert(conninfo(remote) + " options='-c statement_timeout=5s -c work_mem=8MB'"))
            assert (row["state"], row["output"]) == ("DONE", "remote_user"), row
            row = running.wait_done(insert(conninfo(remote) + " replication=database"))
            assert (row["state"], row["sqlstate"]) == ("FAIL", "22023") and "replication connection" in row["error"]
            # a client certificate's files are the server OS user's, as its ~/.pgpass is
            for certificate in ("sslcert=/etc/ssl/certs/ssl-cert-snakeoil.pem", "sslkey=/etc/ssl/private/k.key"):
                row = running.wait_done(insert(conninfo(remote) + f" sslmode=prefer {certificate}"))
                assert (row["state"], row["sqlstate"]) == ("FAIL", "22023"), row
                assert "cannot name a client certificate (sslcert, sslkey)" in row["error"], row
            row = running.wait_done(insert(conninfo(remote) + " gssencmode=require"))  # (its Kerberos credentials)
            assert (row["state"], row["sqlstate"]) == ("FAIL", "22023"), row
            assert "cannot use GSSAPI encryption (gssencmode)" in row["error"], row
            row = running.wait_done(insert(conninfo(remote) + " gssencmode=disable"))
            assert (row["state"], row["output"]) == ("DONE", "remote_user"), row
            # with a password the remote server checks, it runs
            row = running.wait_done(insert(conninfo(remote)))
            assert (row["state"], row["output"]) == ("DONE", "remote_user")
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP OWNED BY carol")
        running.sql("DROP ROLE carol")


@pytest.mark.parametrize("remote", ["dbname=postgres", "dbname=postgres user='' host='' port=''"])
def test_a_remote_without_user_or_host_logs_in_as_the_owner_on_this_server(running, remote):
    """`remote => 'dbname=other'` (pg_cron's schedule_in_database): libpq's defaults logged in as
    the server's OS user, postgres, whoever owned the task, and on the socket and port libpq was
    built with, not this server's.  So did `user=''` and `host=''` (libpq reads an empty value
    as none, and the conninfo's replaced the owner and this server's socket)."""
    running.sql("CREATE ROLE cron_admin SUPERUSER LOGIN")
    try:
        with running.connect("cron_admin") as admin:
            task_id = admin.execute("INSERT INTO task (input, remote, delete) VALUES"
                                    " ('SELECT current_database(), current_user, session_user', %s,"
                                    " false) RETURNING id", [remote]).fetchone()[0]
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["output"]) == (
            "DONE", "current_database\tcurrent_user\tsession_user\npostgres\tcron_admin\tcron_admin"), row["error"]
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE cron_admin")


def test_a_remote_session_on_this_server_ends_before_its_lost_run_does(running):
    """A remote task's worker terminated: its session on this server (another database of it)
    ran on, the run was written FAIL at once, and the series' next run started beside it, two
    runs of one key at once (a probe).  The session is terminated as a local one is, and the run
    ends once it is gone."""
    with running.cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {running.name}_other")
    try:
        remote = f"dbname={running.name}_other"
        task_id = running.value("INSERT INTO task (input, remote, key, repeat, delete) VALUES"
                                " ('SELECT pg_sleep(20)', %s, 'one at a time', '1 s', false) RETURNING id", [remote])
        wait_until(lambda: running.task(task_id)["state"] == "WORK" and running.task(task_id)["pid"], 20, 0.02,
                   "the remote run under way")
        session = running.task(task_id)["pid"]
        assert running.value("SELECT pg_terminate_backend(worker) FROM task WHERE id = %s", [task_id]) is True
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["sqlstate"]) == ("FAIL", "08006"), row
        assert running.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [session]) == 0
    finally:
        running.sql("UPDATE task SET repeat = '0' WHERE key = 'one at a time'")
        running.sql("SELECT task_cancel(id) FROM task WHERE key = 'one at a time' AND state IN ('PLAN', 'WORK')")
        running.wait_all_done()
        running.sql("DELETE FROM task")
        with running.cluster.connect() as admin:
            admin.execute(f"DROP DATABASE {running.name}_other WITH (FORCE)")


def test_a_restored_copys_recovery_leaves_the_sources_remote_session_alone(running):
    """pg_restore of a database whose remote task (on this server) was running, beside the source:
    the copy's housekeeping took the copied WORK row for its own lost run, and terminated the
    source's live session, whose run then ended FAIL 57P01 (a probe).  The copy's row ends as a
    lost run, the source's run goes on."""
    other, copy = f"{running.name}_other", f"{running.name}_copy"
    running.cluster.create_database(other, extension=False)
    running.cluster.create_database(copy)
    try:
        task_id = running.value("INSERT INTO task (input, remote, delete) VALUES"
                                " ('SELECT ''remote ok'' FROM pg_sleep(3)', %s, false) RETURNING id",
                                [f"dbname={other}"])
        wait_until(lambda: running.task(task_id)["state"] == "WORK" and running.task(task_id)["pid"], 20, 0.02,
                   "the remote run under way")
        with running.connect() as source, running.cluster.connect(copy) as target:
            target.execute("SET session_replication_role = replica")  # (as README's restore does)
            with source.cursor().copy("COPY task TO STDOUT") as out, \
                    target.cursor().copy("COPY task FROM STDIN") as into:
                for data in out:
                    into.write(data)
            target.execute("RESET session_replication_role")

            def copy_ended() -> bool:
                target.execute("SELECT pgtaskpy.recover_orphaned_tasks()")
                return target.execute("SELECT state::text FROM task WHERE id = %s", [task_id]).fetchone()[0] == "FAIL"
            wait_until(copy_ended, 20, 0.1, "the copy's row to end as a lost run")
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["output"]) == ("DONE", "remote ok"), row
    finally:
        with running.cluster.connect() as admin:
            for name in (other, copy):
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_remote_without_user_logs_in_as_the_owner_with_its_password(running, remote):
    """A role's remote conninfo with a password and no user logs in as the role (the remote's role
    of that name), not as the server's OS user."""
    running.sql("CREATE ROLE remote_user LOGIN IN ROLE pgtaskpy_user")
    try:
        with running.connect("remote_user") as author:
            task_id = author.execute(
                "INSERT INTO task (input, remote, delete) VALUES ('SELECT current_user', %s, false) RETURNING id",
                [f"host={remote.socket_dir} port={remote.port} dbname=remotedb password='{PASSWORD}'"]).fetchone()[0]
        row = running.wait_done(task_id, 30)
        assert (row["state"], row["output"]) == ("DONE", "remote_user"), row["error"]
    finally:
        running.sql("DELETE FROM task")
        running.sql("DROP ROLE remote_user")


def test_malformed_remote_conninfo_fails_the_task(running):
    row = run(running, "SELECT 1", remote="host=x port")
    assert row["state"] == "FAIL" and row["error"] == (
        'ERROR:  PQconninfoParse failed\nDETAIL:  missing "=" after "port" in connection info string\n'
        "STATEMENT:  SELECT 1")
    # A misspelt keyword is not shown (it may be a piece of a password written unquoted, `password=a
    # horse=b`): a hint says what to look for.
    row = run(running, "SELECT 1", remote="hots=x password=correct horse=battery dbname=y")
    assert row["error"] == ('ERROR:  PQconninfoParse failed\nDETAIL:  invalid connection option "..."\n'
                            'HINT:  Each word left of "=" must be a libpq keyword (host, port, dbname, user,'
                            " password, ...): check its spelling, and quote a value that holds spaces ('...')."
                            "\nSTATEMENT:  SELECT 1"), row


@pytest.mark.parametrize("uri", ["postgresql://remote_user:Se@cretPW@localhost/remotedb",
                                 "postgres://remote_user:Se/cretPW@localhost/remotedb"])
def test_a_uri_whose_password_is_not_percent_encoded_fails_saying_so_and_not_what_it_is(running, uri):
    """libpq reads a "@" or "/" of a password as a host's or a port's: its error quoted the piece
    ('could not translate host name "cretPW@localhost"', 'invalid integer value "Se" for connection
    option "port"') into `error`, task_stats and the launcher's log."""
    row = run(running, "SELECT 1", remote=uri)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "22023"), row
    assert row["error"].startswith('ERROR:  PQconninfoParse failed\nDETAIL:  a URI\'s user or password holds "@" or'
                                   ' "/": write them percent-encoded (%40, %2F)\n'), row
    assert "Se" not in row["error"].replace("SELECT", "")
    encoded = uri.replace("Se@cret", "Se%40cret").replace("Se/cret", "Se%2Fcret")
    assert "PQconninfoParse" not in run(running, "SELECT 1", remote=encoded)["error"]  # (no server: refused)


@pytest.mark.parametrize(("option", "words"), [
    ("connect_timeout=soon", 'invalid integer value "soon" for connection option "connect_timeout"'),
    ("port=abc", 'invalid integer value "abc" for connection option "port"'),
    ("sslmode=sometimes", 'invalid sslmode value: "sometimes"'),
    # (retried as network errors, 08001: a probe)
    ("service=no_such_service", 'definition of service "no_such_service" not found'),
    ("hostaddr=notanip", 'could not parse network address "notanip"'),
])
def test_a_remote_conninfo_value_libpq_cannot_use_fails_the_task_unretried(running, remote, option, words):
    """22023, as a conninfo that does not parse: 08001, a connection failure, was retried by the
    default retry_on, as if the network were down."""
    row = run(running, "SELECT 1", remote=conninfo(remote) + " " + option, retry=2, retry_delay="0 s")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "22023")
    assert words in row["error"]
    assert running.value("SELECT count(*) FROM task WHERE parent = %s", [row["id"]]) == 0


def test_remote_kept_sessions_a_dba_terminates_fail_unsent_tasks_as_network_errors(running):
    """A remote group's kept sessions ended between its tasks (a DBA's pg_terminate_backend there;
    a fast restart of the remote server ends them all so): a task whose input was not sent yet
    failed 57P01, which no retry_on retries, where a network error is retried (a review).  It
    fails 08001, and is retried; one whose query the terminate ended fails 57P01 (it may have run)."""
    running.sql("INSERT INTO task (input, \"group\", count, remote, retry, retry_delay, \"delete\") SELECT 'SELECT"
                " pg_sleep(0.01)', 'far' || i %% 4, 1000, %s, 1, '1 h', false FROM generate_series(1, 300) AS i",
                [f"dbname={running.name}"])
    running.terminate_task_sessions(4)
    running.wait_first_attempts_done()
    fails = running.sql("SELECT t.sqlstate, split_part(t.error, E'\\n', 1), count(*),"
                        " count(*) FILTER (WHERE EXISTS (SELECT FROM task AS r WHERE r.parent = t.id))"
                        " FROM task AS t WHERE t.parent IS NULL AND t.state = 'FAIL' GROUP BY 1, 2 ORDER BY 1, 2")
    terminated = "FATAL:  terminating connection due to administrator command"
    unsent = f"ERROR:  the task's session ended before its input was sent: {terminated}"
    assert {(sqlstate, first) for sqlstate, first, *_ in fails} <= {("08001", unsent), ("57P01", terminated)}, fails
    assert any(sqlstate == "08001" and count > 0 for sqlstate, _, count, _ in fails), fails
    assert all(retried == (count if sqlstate == "08001" else 0) for sqlstate, _, count, retried in fails), fails
    running.sql("DELETE FROM task")


def test_remote_tasks_are_their_own_group(running, remote):
    local = running.insert("SELECT pg_sleep(1)", delete=False)
    far = running.insert("SELECT 'far'", remote=conninfo(remote), delete=False)
    row = running.wait_done(far)
    assert row["stop"] < running.wait_done(local)["stop"]  # did not wait for the local group's task


def test_remote_cluster_is_really_another_server(remote):
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(remote.dsn("remotedb", "remote_user"), connect_timeout=5).close()


class SilentServer:
    """A TCP port that accepts connections and never says a word, as a server behind a broken
    proxy does: libpq's connect waits for its answer to the startup packet."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = []
        self.closed_by_client = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted.append(connection)
            threading.Thread(target=self.watch, args=(connection,), daemon=True).start()

    def watch(self, connection):
        try:
            while connection.recv(4096):  # the startup packet, then nothing until the client goes
                pass
        except OSError:
            pass
        self.closed_by_client.set()

    def close(self):
        self.listener.close()
        for connection in self.accepted:
            connection.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()  # (a worker still waiting on it gets its answer now: the connection is gone)


def test_remote_server_that_never_answers_fails_after_connect_timeout(running, silent_server):
    row = run(running, "SELECT 1", remote=f"host=127.0.0.1 port={silent_server.port} dbname=x connect_timeout=2")
    assert (row["state"], row["sqlstate"]) == ("FAIL", "08001")
    assert "could not open the task's session" in row["error"] and "timeout expired" in row["error"]
    assert 1.5 < (row["stop"] - row["plan"]).total_seconds() < 15


def test_a_run_that_truncate_restart_identity_removed_never_ends_a_claimed_task_of_its_id(running, silent_server):
    """TRUNCATE task RESTART IDENTITY under a running task: a new task given its id, claimed and
    still opening its session (here to a server that never answers), got the old run's end and
    output as its own, DONE, and never ran (a review)."""
    old = running.insert("SELECT 'old' FROM pg_sleep(1)", group="old", delete=False)
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [old]) == "WORK", 10, 0.01,
               "the old task to run")
    running.sql("TRUNCATE task RESTART IDENTITY")
    new = running.insert("SELECT 'new'", group="new", delete=False,
                         remote=f"host=127.0.0.1 port={silent_server.port} dbname=x connect_timeout=4")
    assert new == old
    row = running.wait_done(new, 20)  # (the old run ends 3 s before its connection attempt gives up)
    assert (row["state"], row["sqlstate"], row["output"]) == ("FAIL", "08001", None), row
    assert "timeout expired" in row["error"], row["error"]


def test_cancelling_a_task_whose_remote_server_never_answers_frees_its_worker(running, silent_server):
    """Without connect_timeout, libpq would wait for the answer for ever: the worker waits on
    the socket itself, and gives the attempt up once the task is no longer its to start."""
    task_id = running.insert("SELECT 1", remote=f"host=127.0.0.1 port={silent_server.port} dbname=x", delete=False)
    wait_until(lambda: silent_server.accepted, message="the worker to connect to the silent server")
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    assert running.wait_done(task_id, 10)["state"] == "STOP"
    assert silent_server.closed_by_client.wait(10), "the worker kept waiting for the silent server"
    # the worker is free for the next task
    assert run(running, "SELECT 'next'")["output"] == "next"


def test_a_several_hosts_connect_to_a_server_that_never_answers_leaves_its_worker_free(running, silent_server):
    """Several hosts and a connect_timeout take libpq's blocking connect, which held the worker
    deaf to task_cancel and pg_terminate_backend, and a fast shutdown of the server, for
    connect_timeout a host (2 x 40 s, a probe)."""
    hosts = f"host=127.0.0.1,127.0.0.1 port={silent_server.port},{silent_server.port} dbname=x connect_timeout=60"
    task_id = running.insert("SELECT 1", remote=hosts, delete=False)
    wait_until(lambda: silent_server.accepted, message="the worker to connect to the silent server")
    assert running.value("SELECT task_cancel(%s)", [task_id]) is True
    assert running.wait_done(task_id, 10)["state"] == "STOP"
    wait_until(lambda: running.value("SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                                     " AND query LIKE %s", [f"CALL pgtaskpy.run_task({task_id},%"]) == 0,
               15, 0.1, "the worker to give the attempt up")
    assert run(running, "SELECT 'next'")["output"] == "next"


def test_cancelling_a_standby_task_whose_standby_never_answers_frees_its_worker(db, silent_server):
    """--standby's session was opened by libpq's blocking connect: a standby that accepts the
    connection and never answers held the worker deaf to task_cancel, pg_terminate_backend and a
    fast shutdown for its connect_timeout, for ever at 0 (a probe: tasks TAKE for good).  It is
    connected as a remote task's session is, acting on interrupts meanwhile."""
    db.launcher("--standby", f"host=127.0.0.1 port={silent_server.port} connect_timeout=0")
    task_id = db.insert("SELECT 1", target="standby", delete=False)
    wait_until(lambda: silent_server.accepted, message="the worker to connect to the silent standby")
    assert db.value("SELECT task_cancel(%s)", [task_id]) is True
    assert db.wait_done(task_id, 10)["state"] == "STOP"
    assert silent_server.closed_by_client.wait(10), "the worker kept waiting for the silent standby"
    assert db.wait_done(db.insert("SELECT 'next'", delete=False))["output"] == "next"


def test_stopping_the_launcher_takes_back_a_task_whose_remote_server_never_answers(db, silent_server):
    """Past the grace period, a claimed task that has not started waits again, and its worker
    gives the connection attempt up: the launcher stops."""
    launcher = db.launcher("--grace", "0.5")
    task_id = db.insert("SELECT 1", remote=f"host=127.0.0.1 port={silent_server.port} dbname=x", delete=False)
    wait_until(lambda: silent_server.accepted, message="the worker to connect to the silent server")
    assert launcher.stop(timeout=20) == 0, launcher.output()
    assert db.task(task_id)["state"] == "PLAN"
    assert silent_server.closed_by_client.wait(10), "the worker kept waiting for the silent server"
    # The log says so: it said only "task N started", "cancelling 1 running task(s)" and "stopped".
    assert "took back 1 claimed task(s) that no worker started: they wait again" in launcher.output()


def test_a_remote_that_refuses_for_lack_of_connections_is_tried_again_once_a_second(db, remote):
    """A remote database that takes no connection now (here ALLOW_CONNECTIONS false; a role's or the
    server's limit alike) holds the task back for a second each time: claimed again at once, it was
    tried 380 times a second, and 'started' as often in the log, for as long as the refusal lasted.
    (Each try's lines are at DEBUG: connection_waits.py.)"""
    launcher = db.launcher("--log-level", "DEBUG")
    with remote.connect() as conn:
        conn.execute("ALTER DATABASE remotedb ALLOW_CONNECTIONS false")
    try:
        task_id = db.insert("SELECT 'ran'", remote=conninfo(remote), delete=False)
        wait_until(lambda: f"task {task_id} waits: no free connection" in launcher.output(), 20, 0.05,
                   "a refused session")
        before = launcher.output().count(f"task {task_id} started")
        time.sleep(3.0)  # (the window whose attempts are counted)
        # (one hand-out a refusal and a second; two, before the launcher held the task itself)
        assert 1 <= launcher.output().count(f"task {task_id} started") - before <= 4, launcher.output()[-3000:]
        assert db.value("SELECT state::text FROM task WHERE id = %s", [task_id]) in ("PLAN", "TAKE")
    finally:
        with remote.connect() as conn:
            conn.execute("ALTER DATABASE remotedb ALLOW_CONNECTIONS true")
    row = db.wait_done(task_id, 20)
    assert (row["state"], row["output"]) == ("DONE", "ran"), row
    assert launcher.stop() == 0, launcher.output()
    # Its wait is told once, not at every try (two lines a second, for as long as the refusal lasted).
    told = [line.split(" ", 3)[2] for line in launcher.output().splitlines()
            if re.search(fr"task {task_id} (started|waits: no free connection for its session)$", line)]
    assert told.count("DEBUG") >= 2 and told.count("INFO") == 1 and told.count("WARNING") == 1, told
