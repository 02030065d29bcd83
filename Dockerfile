# PostgreSQL 15 with PL/Python, the pg_task_py extension and its launcher.
#   docker build -t pg_task_py .
#   docker run -d --name pg -e POSTGRES_PASSWORD=secret pg_task_py
#   docker exec pg pg_task_py run --dsn 'dbname=postgres user=postgres'
FROM postgres:15

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        postgresql-plpython3-15 postgresql-server-dev-15 make python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

COPY . /usr/src/pg_task_py
WORKDIR /usr/src/pg_task_py
RUN make install \
 && python3 -m venv /opt/pg_task_py \
 && /opt/pg_task_py/bin/pip install --no-cache-dir ./python \
 && ln -s /opt/pg_task_py/bin/pg_task_py /usr/local/bin/pg_task_py

# The image's init step runs this once, on a new data directory.
RUN printf '%s\n' 'CREATE EXTENSION IF NOT EXISTS pg_task_py CASCADE;' \
        > /docker-entrypoint-initdb.d/pg_task_py.sql
WORKDIR /
