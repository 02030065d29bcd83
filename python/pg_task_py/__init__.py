"""pg_task_py launcher: runs the scheduler loop of the pg_task_py extension for one or more databases."""

from importlib import metadata

# The launcher's version; its major.minor is the extension version it belongs to
# (pg_task_py.control's default_version).  Keep equal to python/pyproject.toml.
RELEASE = "1.3.0"


def _installed_version() -> str:
    """The installed distribution's version; RELEASE when run from a source tree."""
    try:
        return metadata.version("pg_task_py")
    except metadata.PackageNotFoundError:
        return RELEASE


__version__ = _installed_version()
