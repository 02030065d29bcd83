"""pg_task_py launcher: runs the scheduler loop of the pg_task_py extension for one or more databases."""

__version__ = "1.0.0"
