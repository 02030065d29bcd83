"""A burst worker's reading of a role's time setting, in process: no server."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "plpython_run_batch", Path(__file__).resolve().parents[2] / "sql" / "plpython" / "run_batch.py")
run_batch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_batch)


@pytest.mark.parametrize(("value", "seconds"), [
    ("30ms", 0.03), ("500", 0.5), ("2 s", 2.0), ("1min", 60.0), ("1.5h", 5400.0), ("250us", 0.00025),
    (None, 0.0), ("", 0.0), ("0", 0.0), ("soon", 0.0), ("3 fortnights", 0.0),
])
def test_a_time_setting_is_read_in_its_unit(value, seconds):
    assert run_batch.setting_seconds(value) == pytest.approx(seconds)
