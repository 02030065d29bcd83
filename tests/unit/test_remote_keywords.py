"""The connection keywords of a remote task's session (sessions.py, remote_keywords), in process."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "plpython_sessions", Path(__file__).resolve().parents[2] / "sql" / "plpython" / "sessions.py")
sessions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sessions)

LOCAL = {"user": "alice", "host": "/run/pg", "port": "5433"}


def keywords(remote, options, own_credentials=False):
    return list(sessions.remote_keywords(remote, options, dict(LOCAL), "pg_task_py task", own_credentials).items())


def test_defaults_go_before_the_conninfo_and_its_empty_values_after_it():
    """libpq reads an empty value as none: `user=''` logged in as the server's OS user, and
    `host=''` went to libpq's own socket, not this server's."""
    assert keywords("dbname=app", {"dbname": "app"})[:4] == [*LOCAL.items(), ("dbname", "dbname=app")]
    empty = "dbname=app user='' host='' port=''"
    assert keywords(empty, {"dbname": "app", "user": "", "host": "", "port": ""})[:4] == [
        ("dbname", empty), *LOCAL.items()]


def test_a_role_that_is_not_a_superuser_uses_none_of_the_servers_os_users_credentials():
    """libpq sent the server OS user's ~/.postgresql/postgresql.crt for any role's remote task,
    and set GSSAPI encryption up with its Kerberos credentials."""
    own = dict(keywords("dbname=app gssencmode=prefer", {"dbname": "app", "gssencmode": "prefer"},
                        own_credentials=True))
    assert (own["sslcert"], own["gssencmode"]) == (sessions.NO_CLIENT_CERTIFICATE, "disable")
    assert list(own).index("gssencmode") > list(own).index("dbname")  # (after the conninfo: it overrides it)
    assert not Path(sessions.NO_CLIENT_CERTIFICATE).exists()
    superuser = dict(keywords("dbname=app", {"dbname": "app"}))  # (a superuser's: as libpq does)
    assert "sslcert" not in superuser and "gssencmode" not in superuser
