# pg_task_py: PGXS for the extension, plus the developer entry points.
#   make install          install the control file and sql/ scripts (as root)
#   make demo             a throw-away cluster, the launcher and example tasks
#   make test             the whole test suite against a real server
#   make bench            the benchmark (bench/README.md)
#   make lint             ruff on the launcher, the PL/Python sources and the tests

EXTENSION = pg_task_py
EXTVERSION = 1.3
PREVIOUS = 1.2
DATA = $(sort $(wildcard sql/pg_task_py--*.sql) sql/pg_task_py--$(EXTVERSION).sql \
              sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql)

PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The install and upgrade scripts of the version in development are assembled
# from sql/created_once, sql/replayed, sql/upgrade and sql/plpython (sql/build.py);
# scripts of released versions are never rebuilt.
SOURCES = sql/build.py $(wildcard sql/created_once/*.sql sql/replayed/*.sql sql/upgrade/*.sql sql/plpython/*.py)
all: sql/pg_task_py--$(EXTVERSION).sql sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql
sql/pg_task_py--$(EXTVERSION).sql: $(SOURCES)
	python3 sql/build.py install > $@
sql/pg_task_py--$(PREVIOUS)--$(EXTVERSION).sql: $(SOURCES)
	python3 sql/build.py upgrade $(PREVIOUS) $(EXTVERSION) > $@

VENV ?= .venv

.PHONY: setup demo test bench lint
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/python scripts/demo.py

test: setup
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/bench.py $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check python sql/plpython sql/build.py tests bench scripts
