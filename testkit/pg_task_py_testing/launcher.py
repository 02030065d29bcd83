"""The real `pg_task_py run` in a subprocess, its log kept for assertions."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pg_task_py_testing.waiting import wait_until

# The console script installed beside this interpreter (the project's virtual environment).
LAUNCHER = Path(sys.executable).parent / "pg_task_py"

_logs: tempfile.TemporaryDirectory | None = None  # launchers' logs, removed when the process exits


def _log_dir() -> str:
    global _logs
    if _logs is None:
        _logs = tempfile.TemporaryDirectory(prefix="pg_task_py-launchers-")
    return _logs.name


class Launcher:
    """The real `pg_task_py run`, started by start(); output() is what it logged."""

    def __init__(self, *dsns: str, args: tuple[str, ...] = (), log_dir: Path | None = None) -> None:
        self.command = [str(LAUNCHER), "run", *[a for dsn in dsns for a in ("--dsn", dsn)], *args]
        self.log_path = Path(tempfile.mkstemp(prefix="launcher-", suffix=".log", dir=log_dir or _log_dir())[1])
        self.process: subprocess.Popen | None = None

    def start(self) -> Launcher:
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_active(self, timeout: float = 15.0) -> None:
        wait_until(lambda: "scheduling (active)" in self.output() or self.process.poll() is not None,
                   timeout, message="the launcher to start scheduling")
        assert self.process.poll() is None, f"launcher exited:\n{self.output()}"

    def output(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (killing it if it does not stop in time)."""
        if self.process is None:
            return 0
        # A SIGTERM before the launcher has set its handlers would kill it outright (status -15).
        wait_until(lambda: "starting" in self.output() or self.process.poll() is not None,
                   timeout, message="the launcher to log that it is starting")
        self.signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        self._log.close()
        return status

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
