"""pg_task_py launcher: runs the scheduler loop of the pg_task_py extension for one or more databases."""


def _version() -> str:
    """The launcher's version: its major.minor is the extension version it belongs to.

    Installed, the distribution's (python/setup.py makes it from pg_task_py.control's
    default_version); run from a source tree, the control file's default_version, X.Y.0."""
    from importlib import metadata

    try:
        return metadata.version("pg_task_py")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        control = Path(__file__).resolve().parent.parent.parent / "pg_task_py.control"
        try:
            match = re.search(r"^default_version\s*=\s*'(\d+\.\d+)'", control.read_text(), re.MULTILINE)
        except OSError:
            match = None
        return f"{match.group(1)}.0" if match else "0+unknown"


def __getattr__(name: str) -> str:
    # (read when first asked for: the metadata costs tens of milliseconds at the command's start,
    # before it can hear a signal)
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
