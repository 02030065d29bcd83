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
