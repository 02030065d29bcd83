# pg_task_py: PGXS for the extension, plus the developer entry points.
#   make install          install the control file and sql/ scripts (as root)
#   make demo             a throw-away cluster, the launcher and example tasks
#   make demo-ha          a primary and a standby, a launcher on each, a failover
#   make test             the whole test suite: the unit tier, then the integration tier against a real server
#   make unit             the unit tier alone (tests/unit: no server, seconds)
#   make bench            the benchmark (bench/bench.py; figures in bench/RESULTS.md)
#   make bench-peers      pg_task_py beside pg_cron, same schedules, same minutes (bench/peers.py)
#   make bench-pq         the worker's libpq binding beside psycopg.pq, inside PL/Python (bench/pq_binding.py)
#   make lint             ruff on the launcher, the PL/Python sources, the tests and their helpers

EXTENSION = pg_task_py
# The one version source: the control file's default_version (the launcher's is X.Y.0, python/setup.py).
EXTVERSION := $(shell sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" pg_task_py.control)
PREVIOUS = 1.2
# The released versions before PREVIOUS (from sql/released.sha256) get one update script each
# straight to EXTVERSION, so that their released steps run with the safe search_path too.
OLDER := $(filter-out $(PREVIOUS),$(shell sed -n 's/.*pg_task_py--\([0-9.]*\)\.sql$$/\1/p' sql/released.sha256))
DIRECT = $(foreach old,$(OLDER),sql/pg_task_py--$(old)--$(EXTVERSION).sql)
DATA = $(sort $(wildcard sql/pg_task_py--*.sql) sql/pg_task_py--$(EXTVERSION).sql \
              sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql $(DIRECT))

PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The install and upgrade scripts of the version in development are assembled
# from sql/created_once, sql/replayed, sql/upgrade and sql/plpython (sql/build.py);
# scripts of released versions are never rebuilt.
SOURCES = sql/build.py $(wildcard sql/created_once/*.sql sql/replayed/*.sql sql/upgrade/*.sql sql/plpython/*.py)
all: sql/pg_task_py--$(EXTVERSION).sql sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql $(DIRECT)
sql/pg_task_py--$(EXTVERSION).sql: $(SOURCES)
	python3 sql/build.py install > $@
sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql: $(SOURCES)
	python3 sql/build.py upgrade $(PREVIOUS) $(EXTVERSION) > $@
$(DIRECT): sql/pg_task_py--%--$(EXTVERSION).sql: $(SOURCES)
	python3 sql/build.py upgrade $* $(PREVIOUS) $(EXTVERSION) > $@

VENV ?= .venv
PYTEST = $(VENV)/bin/python -m pytest
# Test processes side by side against real servers (pytest-xdist: a session cluster each): two on
# a machine of two cores or more (7 min instead of 12 on 2 cores), else 0, the tests in this
# process; `-s` needs 0.
PYTEST_WORKERS ?= $(if $(filter 0 1,$(shell nproc)),0,2)

.PHONY: setup demo demo-ha test unit bench bench-peers bench-pq lint
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/python scripts/demo.py

demo-ha: setup
	$(VENV)/bin/python scripts/demo_ha.py

# Two runs of pytest, two summaries: the unit tier (seconds) stops a broken build early.
test: setup
	$(PYTEST) tests/unit $(PYTEST_ARGS)
	$(PYTEST) tests --ignore=tests/unit -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

unit:
	bash scripts/setup.sh venv
	$(PYTEST) tests/unit $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/bench.py $(BENCH_ARGS)

# pg_cron from the distribution (postgresql-15-cron), installed here when missing: only this needs it.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
bench-peers: setup
	@[ -f "$$($(PG_CONFIG) --sharedir)/extension/pg_cron.control" ] || { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql-15-cron >/dev/null; }
	$(VENV)/bin/python bench/peers.py $(BENCH_ARGS)

# psycopg for the server's Python (python3-psycopg), installed here when missing: only this needs it.
bench-pq: setup
	@/usr/bin/python3 -c "import psycopg.pq" 2>/dev/null || { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-psycopg >/dev/null; }
	$(VENV)/bin/python bench/pq_binding.py $(BENCH_ARGS)

# (the virtual environment only: setup's `make install` would swap the extension under a test run)
lint:
	bash scripts/setup.sh venv
	$(VENV)/bin/ruff check python sql/plpython sql/build.py tests testkit bench scripts
