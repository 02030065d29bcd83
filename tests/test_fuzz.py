"""Random values in every column: each INSERT runs or is rejected with a clear error, and the
launcher keeps running (hypothesis)."""

from datetime import timedelta

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_task_py_testing import wait_until

# Errors a user may get from a bad value: data exceptions, constraint violations, privileges.
CLEAR_ERROR_CLASSES = ("22", "23", "42")

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
intervals = st.one_of(
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2)),
    st.sampled_from([timedelta(0), timedelta(microseconds=1), timedelta(seconds=-1)]),
)
inputs = st.one_of(
    st.sampled_from(["SELECT 1", "SELECT 1/0", "SELECT NULL", "VACUUM", "SELECT pg_sleep(0.01)", "DO $$BEGIN END$$",
                     "SELECT 'x' AS a, 2 AS b", "COPY (SELECT 1) TO STDOUT", "BEGIN", "COMMIT", ";", ""]),
    texts,
)
columns = st.fixed_dictionaries(
    {"input": inputs},
    optional={
        "plan": st.timedeltas(min_value=timedelta(hours=-2), max_value=timedelta(seconds=1)),
        "active": intervals, "live": intervals, "timeout": intervals, "repeat": intervals,
        "state": st.sampled_from(["PLAN", "STOP", "DONE"]), "parent": st.integers(-(2**63), 2**63 - 1),
        "count": st.integers(-3, 2**31 - 1), "max": st.integers(-(2**31), 2**31 - 1),
        "delete": st.booleans(), "drift": st.booleans(), "header": st.booleans(), "string": st.booleans(),
        "save": st.booleans(),
        "delimiter": texts, "escape": texts, "quote": texts, "null": texts,
        "data": texts, "group": texts, "remote": st.one_of(st.none(), texts),
        "owner": st.sampled_from(["postgres", "nobody_at_all", ""]),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=columns)
def test_random_rows_run_or_are_rejected_clearly(shared, values):
    values = dict(values)
    if "plan" in values:
        values["plan"] = shared.value("SELECT now() + %s", [values["plan"]])
    names = ", ".join(f'"{name}"' for name in values)
    marks = ", ".join(["%s"] * len(values))
    try:
        shared.sql(f"INSERT INTO task ({names}) VALUES ({marks})", list(values.values()))
    except psycopg.Error as exc:
        assert exc.sqlstate[:2] in CLEAR_ERROR_CLASSES, (exc.sqlstate, str(exc))
        assert str(exc).strip()


def test_after_the_fuzz_everything_ended_and_the_launcher_lives(shared):
    # Runs after the fuzz test (same module database): nothing stuck, launcher alive.
    # Repeating tasks go on until a user stops them, and a random negative max
    # pauses its group for up to 24 days: stop those, and what waits behind them.
    waiting_on = "state = 'PLAN' AND (repeat > interval '0' OR plan > now() + interval '2 s')"

    def series_stopped():
        shared.sql(f"UPDATE task SET state = 'STOP' WHERE {waiting_on}")
        return shared.value("SELECT count(*) FROM task WHERE state IN ('TAKE', 'WORK') AND repeat > interval '0'") == 0
    wait_until(series_stopped, 30, message="repeating series to stop")
    wait_until(lambda: shared.sql(f"UPDATE task SET state = 'STOP' WHERE {waiting_on}") is not None and
               shared.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") == 0,
               60, 0.2, message="all tasks to end (see the database for what is left)")
    assert all(launcher.process.poll() is None for launcher in shared.launchers)
    assert all("Traceback" not in launcher.output() for launcher in shared.launchers)
    assert shared.value("SELECT count(*) FROM task WHERE state = 'FAIL' AND error IS NULL") == 0
