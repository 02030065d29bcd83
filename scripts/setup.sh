#!/usr/bin/env bash
# Install what `make demo`, `make test` and `make bench` need, then the extension.
# `setup.sh venv` (make unit): only the virtual environment with the launcher and the test tools.
# Idempotent: each step is skipped when already done.  Debian/Ubuntu with the
# PostgreSQL 15 server; apt and `make install` need root (sudo otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

PGVER=15
VENV=${VENV:-.venv}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
ONLY_VENV=""
[ "${1:-}" != "venv" ] || ONLY_VENV=1

missing=()
if [ -z "$ONLY_VENV" ]; then
    [ -x /usr/lib/postgresql/$PGVER/bin/postgres ] || missing+=(postgresql-$PGVER)
    [ -f /usr/share/postgresql/$PGVER/extension/plpython3u.control ] || missing+=(postgresql-plpython3-$PGVER)
    [ -f /usr/lib/postgresql/$PGVER/lib/pgxs/src/makefiles/pgxs.mk ] || missing+=(postgresql-server-dev-$PGVER)
    # As root, the test clusters' servers run as the postgres OS user, through setpriv.
    command -v setpriv >/dev/null || missing+=(util-linux)
    # A test runs a server whose messages are in German (lc_messages): its locale is made below.
    command -v localedef >/dev/null || missing+=(locales)
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# The launcher (its version comes from pg_task_py.control) with the test tools, and the tests'
# helpers (testkit: clusters, the launcher in a subprocess, databases with the extension).
stamp="$VENV/.pg_task_py-installed"
if [ ! -f "$stamp" ] || [ -n "$(find pg_task_py.control python/pyproject.toml python/setup.py testkit/pyproject.toml \
        python/pg_task_py testkit/pg_task_py_testing -newer "$stamp" \( -name '*.py' -o -name '*.toml' -o -name '*.control' \))" ]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check ./python'[test]' ./testkit
    touch "$stamp"
fi

[ -z "$ONLY_VENV" ] || exit 0
if ! locale -a 2>/dev/null | grep -qi '^de_DE\.utf-\?8$'; then
    $SUDO localedef -i de_DE -f UTF-8 de_DE.UTF-8
fi
make -s all
$SUDO make -s install >/dev/null
