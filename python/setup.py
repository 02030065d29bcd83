"""The launcher's version comes from the extension's: pg_task_py.control's default_version
(1.3 -> 1.3.0), read when the package is built from the repository (pip install ./python)."""

import re
from pathlib import Path

from setuptools import setup

CONTROL = Path(__file__).resolve().parent.parent / "pg_task_py.control"


def default_version() -> str:
    try:
        text = CONTROL.read_text()
    except OSError as exc:
        raise SystemExit(f"pg_task_py: build the launcher from the repository, beside {CONTROL.name}: {exc}") from None
    match = re.search(r"^default_version\s*=\s*'(\d+\.\d+)'", text, re.MULTILINE)
    if not match:
        raise SystemExit(f"pg_task_py: no default_version = 'X.Y' in {CONTROL}")
    return f"{match.group(1)}.0"


setup(version=default_version())
