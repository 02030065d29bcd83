"""What a new worker backend's first call loads: the worker's code (sql/plpython, as
sql/build.py assembles the bodies of run_task and run_tasks) imports neither `re` nor `json`,
which cost a new worker about 12 ms of that call; and the JSON its report goes back in."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PLPYTHON = Path(__file__).resolve().parents[2] / "sql" / "plpython"
WORKER_FILES = ["plans.py", "libpq.py", "output.py", "sessions.py", "task_rows.py", "run_task.py", "run_batch.py"]

spec = importlib.util.spec_from_file_location("plpython_plans", PLPYTHON / "plans.py")
plans = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plans)


def test_the_workers_code_imports_neither_re_nor_json():
    # In a fresh interpreter without site (-S), as a backend's embedded Python has none of
    # the test runner's modules loaded.
    # Each file run in a namespace of its own, as the test of imports does (runpy would import re).
    script = (
        "import sys\n"
        f"for name in {WORKER_FILES!r}:\n"
        f"    path = {str(PLPYTHON)!r} + '/' + name\n"
        "    with open(path) as source:\n"
        "        exec(compile(source.read(), path, 'exec'), {'__name__': name})\n"
        "print(sorted({'re', 'json'} & set(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("report", [
    {"started": [1, 2], "ended": [], "postponed": [], "key": None, "ahead": 0},
    {"started": [], "ended": [{"id": 7, "state": "FAIL", "seconds": 0.001234, "error": 'ERROR:  "x" \\ y\tz',
                                "sqlstate": "57014", "retry": None}],
     "postponed": [3], "key": ["bob", None, "g\u00e9\u2603", True, False], "ahead": 2},
    {"ended": [{"id": 1, "state": "FAIL", "seconds": None, "error": "".join(map(chr, range(0x30))) + "\u2028"}]},
    {"ended": [{"id": 2, "state": "DONE", "seconds": 1e-06}, {"id": 3, "state": "DONE", "seconds": 12345.5}]},
])
def test_a_report_reads_back_as_the_json_module_reads_it(report):
    assert json.loads(plans.to_json(report)) == report


class Sqlstate(str):
    pass


def test_tuples_and_subclasses_read_back_as_their_base_types():
    assert json.loads(plans.to_json({"key": ("bob", None), "sqlstate": Sqlstate("57014")})) == {
        "key": ["bob", None], "sqlstate": "57014"}


def test_a_value_json_cannot_hold_is_refused():
    with pytest.raises(TypeError, match="no JSON for a set"):
        plans.to_json({"started": {1}})
