"""The worker's libpq binding read in process, without a server: how it reads a conninfo."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "plpython_libpq", Path(__file__).resolve().parents[2] / "sql" / "plpython" / "libpq.py")
libpq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(libpq)


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("", None), ("0", None), ("-3", None),  # libpq: no limit
    ("1", 2), ("2", 2), (" 30 ", 30),  # libpq: at least 2 seconds
])
def test_connect_timeout_is_read_as_libpq_reads_it(value, seconds):
    assert libpq.connect_timeout_seconds(value) == seconds


def test_a_connect_timeout_that_is_no_number_is_libpqs_error():
    with pytest.raises(libpq.ConnectError, match='invalid integer value "soon" for connection option'):
        libpq.connect_timeout_seconds("soon")


def test_a_conninfo_gives_its_own_options_only():
    assert libpq.conninfo_options("host=a,b port=5433 connect_timeout=4") == {
        "host": "a,b", "port": "5433", "connect_timeout": "4"}
    with pytest.raises(libpq.MalformedConninfo, match='missing "=" after "port"'):
        libpq.conninfo_options("host=x port")


def test_a_malformed_conninfo_is_told_without_its_text():
    """libpq quotes a malformed URI whole, and a word it did not expect: they may hold a password."""
    with pytest.raises(libpq.MalformedConninfo) as raised:
        libpq.conninfo_options("postgresql://app:SuperSecret6@[::1/b")
    assert "SuperSecret6" not in str(raised.value)
    assert 'matching "]" in IPv6 host address in URI: "..."' in str(raised.value)
    with pytest.raises(libpq.MalformedConninfo) as raised:
        libpq.conninfo_options("host=x password=a b")
    assert str(raised.value) == 'missing "=" after "..." in connection info string'


@pytest.mark.parametrize("conninfo", ['postgresql://alice:p"TOPSECRET%zz@127.0.0.1:5432/db',
                                      'postgresql://alice@h/db?password=x"TOPSECRET%zz',
                                      'host=h password=my sec"TOPSECRET',
                                      # (a piece libpq quotes percent-decoded: TOP%21SECRET as TOP!SECRET)
                                      'postgresql://app:ab?c/TOP%21SECRET=1@db.example.com/app'])
def test_a_malformed_conninfo_with_a_quote_in_its_password_is_told_without_it(conninfo):
    """libpq quotes the piece as it is, its quotes too: the piece hidden ended at the first, and
    the rest of the password was in the error."""
    with pytest.raises(libpq.MalformedConninfo) as raised:
        libpq.conninfo_options(conninfo)
    assert "TOPSECRET" not in str(raised.value) and "TOP!SECRET" not in str(raised.value), str(raised.value)
    assert str(raised.value).count('"..."') == 1, str(raised.value)


def split_as_the_server_does(options):
    """The server's reading of a startup packet's `options` (postinit.c, pg_split_opts): split at
    whitespace, a backslash taking the next character as it is; then each `-c name=value`."""
    words, word, escaped, started = [], [], False, False
    for char in options + " ":
        if char.isspace() and not escaped:
            if started:
                words.append("".join(word))
            word, started = [], False
            continue
        started = True
        if not escaped and char == "\\":
            escaped = True
            continue
        escaped = False
        word.append(char)
    assert words[0::2] == ["-c"] * (len(words) // 2)
    return dict(setting.split("=", 1) for setting in words[1::2])


@pytest.mark.parametrize("group", ["reports", "it's \\ \"quoted\" = -c work_mem=64", "tab\tand\nnewline", " ", ""])
def test_a_tasks_settings_go_in_its_startup_options_as_the_server_reads_them(group):
    settings = {"pg_task.id": "7", "pg_task.group": group, "statement_timeout": "3600000ms"}
    assert split_as_the_server_does(libpq.startup_options(settings)) == settings


@pytest.mark.parametrize("group", ["ünïcode", "☃", "long " * 500])
def test_settings_that_cannot_go_in_startup_options_are_refused(group):
    """Not ASCII (the server reads these bytes in no client encoding), or too long for a startup
    packet: the session is sent them instead."""
    assert libpq.startup_options({"pg_task.id": "7", "pg_task.group": group}) is None


def test_a_uri_with_a_password_not_percent_encoded_is_refused_without_its_text():
    """libpq reads a "@" or "/" of a URI's password as part of the host or a port, and quoted the
    piece in its connection error."""
    for uri in ("postgresql://u:Se@cret@db/x", "postgres://u:Se/cret@db/x", "postgresql://u:a@b@c@db"):
        with pytest.raises(libpq.MalformedConninfo) as raised:
            libpq.conninfo_options(uri)
        assert "cret" not in str(raised.value) and "percent-encoded (%40, %2F)" in str(raised.value)
    for fine in ("postgresql://u:Se%40cret@db/x", "postgresql://db/x", "postgresql://u@db/x?application_name=a@b",
                 "host=db password=Se@cret/x", "postgresql://u:pw@db/x"):
        libpq.conninfo_options(fine)


def test_a_verbose_error_reads_as_the_default_one_with_its_sqlstate_in_any_language():
    """A task session's errors are verbose (the SQLSTATE of an error libpq keeps as words only):
    the words a task's `error` gets are those of the default verbosity, the LOCATION line gone
    wherever it is."""
    verbose = ("FATAL:  57P05: Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Sitzung\n"
               "ORT:  ProcessInterrupts, postgres.c:3366\n"
               "Server hat die Verbindung unerwartet geschlossen")
    words, sqlstate = libpq._without_sqlstate(verbose)
    assert (words, sqlstate) == ("FATAL:  Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Sitzung\n"
                                 "Server hat die Verbindung unerwartet geschlossen", "57P05")
    assert libpq.lost_sqlstate(words, sqlstate) == "57P05"
    assert libpq.lost_sqlstate("FATAL:  terminating connection due to idle-session timeout") == "57P05"
    assert libpq.lost_sqlstate("server closed the connection unexpectedly", None) is None
    # (a DBA's pg_terminate_backend, a shutdown: the server's own code, as its result would say)
    assert libpq.lost_sqlstate("FATAL:  terminating connection due to administrator command", "57P01") == "57P01"
    assert libpq.lost_sqlstate("FATAL:  terminating connection due to administrator command") is None
