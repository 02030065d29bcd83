"""Every module of sql/plpython imports in plain Python, without a server: the PL/Python
entry points pass plpy, GD, SD and their arguments explicitly (sql/build.py), so no
module reads a name that exists only as a PL/Python global."""

import importlib.util
from pathlib import Path

import pytest

PLPYTHON = Path(__file__).resolve().parents[2] / "sql" / "plpython"


@pytest.mark.parametrize("path", sorted(PLPYTHON.glob("*.py")), ids=lambda path: path.name)
def test_module_imports_in_plain_python(path):
    spec = importlib.util.spec_from_file_location(f"plpython_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
