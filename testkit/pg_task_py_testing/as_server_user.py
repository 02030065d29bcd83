"""`python -m pg_task_py_testing.as_server_user PROGRAM [ARG...]`: run one of PostgreSQL's
programs as the server's OS user, for a caller that is root (PostgreSQL refuses to run as root).
The wrappers that server.programs() writes run this.

pytest-postgresql makes the data directory's parent (where it also puts the server's log) and
initdb's password file as the caller: both are handed to the server's user first.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from pg_task_py_testing.server import prepare_directory, server_user

# Options of pg_ctl, initdb and postgres that name the data directory or the log file.
PATH_OPTIONS = ("-D", "--pgdata", "-l", "--log")


def directories(args: list[str]) -> Iterator[Path]:
    """The directories that hold the data directory and log file named in `args`."""
    for option, value in zip(args, args[1:]):
        if option in PATH_OPTIONS:
            yield Path(value).parent
    for arg in args:
        option, _, value = arg.partition("=")
        if value and option in PATH_OPTIONS:
            yield Path(value).parent


def password_files(args: list[str]) -> list[str]:
    """initdb's --pwfile, also inside pg_ctl's -o."""
    return re.findall(r"--pwfile=(\S+)", " ".join(args))


def main() -> None:
    program, *args = sys.argv[1:]
    user = server_user()
    for directory in set(directories(args)):
        prepare_directory(directory)
    for path in password_files(args):
        os.chown(path, user.pw_uid, user.pw_gid)
    os.chdir("/")  # the caller's directory may be closed to the server's user
    os.execvp("setpriv", ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                          program, *args])


if __name__ == "__main__":
    main()
