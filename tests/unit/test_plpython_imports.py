"""Every module of sql/plpython imports in plain Python, without a server: the PL/Python
entry points pass plpy, GD, SD and their arguments explicitly (sql/build.py), so no
module reads a name that exists only as a PL/Python global."""

import importlib.util
import warnings
from pathlib import Path

import pytest

PLPYTHON = Path(__file__).resolve().parents[2] / "sql" / "plpython"


@pytest.mark.parametrize("path", sorted(PLPYTHON.glob("*.py")), ids=lambda path: path.name)
def test_module_imports_in_plain_python(path):
    spec = importlib.util.spec_from_file_location(f"plpython_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.mark.parametrize("path", sorted(PLPYTHON.glob("*.py")), ids=lambda path: path.name)
def test_module_compiles_without_a_warning(path):
    """A SyntaxWarning ('"a" ("b")': a string called, "perhaps you missed a comma?") fails only
    when its line runs: one in a hint failed every task whose session could not be opened.
    sql/build.py refuses such a module too."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(), str(path), "exec")


def test_the_build_refuses_a_module_that_compiles_with_a_warning(tmp_path, monkeypatch):
    build = importlib.util.spec_from_file_location("sql_build", PLPYTHON.parent / "build.py")
    module = importlib.util.module_from_spec(build)
    build.loader.exec_module(module)
    with pytest.raises(SystemExit, match=r"sql/plpython/hint.py:1: 'str' object is not callable"):
        module.compiles_cleanly("hint.py", 'HINT = "allow it " ("in pg_hba.conf")\n')
