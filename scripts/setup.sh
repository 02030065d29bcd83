#!/usr/bin/env bash
# Install what `make demo`, `make test` and `make bench` need, then the extension.
# Idempotent: each step is skipped when already done.  Debian/Ubuntu with the
# PostgreSQL 15 server; apt and `make install` need root (sudo otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

PGVER=15
VENV=${VENV:-.venv}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
[ -x /usr/lib/postgresql/$PGVER/bin/postgres ] || missing+=(postgresql-$PGVER)
[ -f /usr/share/postgresql/$PGVER/extension/plpython3u.control ] || missing+=(postgresql-plpython3-$PGVER)
[ -f /usr/lib/postgresql/$PGVER/lib/pgxs/src/makefiles/pgxs.mk ] || missing+=(postgresql-server-dev-$PGVER)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
stamp="$VENV/.pg_task_py-installed"
if [ ! -f "$stamp" ] || [ python/pyproject.toml -nt "$stamp" ] || [ -n "$(find python/pg_task_py -newer "$stamp" -name '*.py')" ]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check ./python'[test]'
    touch "$stamp"
fi

make -s all
$SUDO make -s install >/dev/null
