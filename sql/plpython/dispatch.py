"""Body of FUNCTION pgtaskpy.dispatch(run_limit, cancel_running) RETURNS (events, wake_in, running).

One turn of the scheduler, run in the launcher's own session each time the
launcher wakes (NOTIFY, a planned time, or a second passing):

1. collect workers whose task ended;
2. once a second: recover tasks of dead backends, expire tasks past `active`;
3. claim due tasks (pgtaskpy.claim_due_tasks) up to the free worker slots;
4. start each on an idle worker backend (kept open, so a task pays no
   connection start-up) or on a new one, with dblink_send_query;
5. close workers idle too long; say when to wake up next.

Worker backends are this session's dblink connections; their state lives in
GD, which lasts as long as the session.
"""

import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # assembled with plans.py by sql/build.py
    from plans import run

HOUSEKEEPING_EVERY = 1.0  # seconds between orphan/expiry checks; also the longest sleep
KEEP_IDLE_WORKER = 10.0  # seconds an idle worker backend stays open for the next task
KEEP_IDLE_SESSION = 1.0  # seconds a worker holding a reusable task session waits for its group
ANSWER_WAIT = 0.05  # seconds to wait for a worker whose task has ended to return
WARM_UP = 0  # the "task id" of the call that loads PL/Python in a new spare worker


def quote_conninfo(value):
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def worker_conninfo():
    """A loopback connection to this database as the launcher's own role."""
    row = run(
        "conninfo",
        "SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
        " current_setting('port') AS port, current_database() AS dbname, current_user AS usr",
    )[0]
    parts = {
        "host": row["host"].strip() or "localhost",
        "port": row["port"],
        "dbname": row["dbname"],
        "user": row["usr"],
        "application_name": "pg_task_py worker",
        # The worker is a superuser session: it resolves nothing through a
        # schema that others could create objects in.
        "options": "-c search_path=pg_catalog,pg_temp",
    }
    return " ".join(f"{key}={quote_conninfo(value)}" for key, value in parts.items())


def state():
    pool = GD.get("pgtaskpy.pool")
    if pool is None:
        pool = GD["pgtaskpy.pool"] = {"workers": {}, "serial": 0, "housekeeping_at": 0.0,
                                      "pid": run("pid", "SELECT pg_backend_pid() AS p")[0]["p"]}
    return pool


def disconnect(pool, name):
    pool["workers"].pop(name, None)
    try:
        run("disconnect", "SELECT dblink.dblink_disconnect($1)", ["text"], [name])
    except plpy.SPIError:
        pass  # already gone


def collect(pool, name, worker, events):
    """Read the finished CALL's result; fail the task if the worker did not record it."""
    error = None
    try:
        for _ in range(2):  # the CALL's result, then the end marker dblink requires
            run("get_result", "SELECT * FROM dblink.dblink_get_result($1, false) AS r(status text)",
                ["text"], [name])
        message = run("error", "SELECT dblink.dblink_error_message($1) AS m", ["text"], [name])[0]["m"]
        if message and message != "OK":
            error = message.strip()
    except plpy.SPIError as exc:
        error = str(exc)
    task_id = worker["task"]
    worker["task"] = None
    worker["idle_since"] = time.monotonic()
    if error and task_id == WARM_UP:
        disconnect(pool, name)
        events.append({"event": "spare_failed", "message": error})
    elif error:
        disconnect(pool, name)
        ended = run(
            "worker_failed",
            "SELECT pgtaskpy.finish_task($1, 'FAIL', NULL, $2)",
            ["bigint", "text"],
            [task_id, f"ERROR:  pg_task_py worker failed: {error}"],
        )
        events.append({"event": "worker_error", "id": task_id, "message": error,
                       "failed": ended[0]["finish_task"] is not None})
    return task_id


def is_busy(name):
    try:
        return run("is_busy", "SELECT dblink.dblink_is_busy($1) AS b", ["text"], [name])[0]["b"] == 1
    except plpy.SPIError:
        return False  # a broken connection: collect() records the failure


def reap(pool, events):
    """Collect every worker whose CALL has returned.

    Returns True when a task's row has ended but its worker has not answered
    yet (the CALL returns just after the final commit): look again very soon.
    """
    busy = {w["task"]: name for name, w in pool["workers"].items() if w["task"] is not None}
    if not busy:
        return False
    running = {
        r["id"]
        for r in run(
            "running",
            "SELECT id FROM {ext}.task WHERE id = ANY($1) AND state IN ('TAKE', 'WORK')",
            ["bigint[]"],
            [list(busy)],
        )
    }
    ended, answering = [], False
    for task_id, name in busy.items():
        # A worker returns right after committing its task's end: wait that
        # moment, so that the next task of a reusable session finds it idle.
        # (Other workers open their next task's session first: no wait for them.)
        holds_session = pool["workers"][name]["key"] is not None
        patience = time.monotonic() + (ANSWER_WAIT if task_id not in running and holds_session else 0)
        while is_busy(name) and time.monotonic() < patience:
            time.sleep(0.0002)
        if is_busy(name):
            answering = answering or task_id not in running
            continue
        task_id = collect(pool, name, pool["workers"][name], events)
        if task_id != WARM_UP:
            ended.append(task_id)
    # A worker that found its task not claimed (stopped or deleted meanwhile,
    # or an error before it took the row) leaves it to be claimed again.
    run("unclaim_ended", "UPDATE {ext}.task SET state = 'PLAN', worker = NULL"
        " WHERE id = ANY($1) AND state = 'TAKE' AND worker = pg_backend_pid()", ["bigint[]"], [ended])
    for row in run(
        "ended",
        "SELECT i AS id, t.state::text AS state, extract(epoch FROM t.stop - t.start)::float8 AS seconds"
        " FROM unnest($1::bigint[]) AS i LEFT JOIN {ext}.task AS t ON t.id = i",
        ["bigint[]"],
        [ended],
    ):
        if row["state"] == "PLAN":  # its session found no free connection: run fewer at once
            limit_concurrency(pool)
            events.append({"event": "postponed", "id": row["id"]})
        else:
            events.append({"event": "end", "id": row["id"], "state": row["state"] or "DELETED",
                           "seconds": row["seconds"]})
    return answering


def limit_concurrency(pool):
    """The server has no connection to spare: run no more tasks at once than now.

    Every running task holds two backends (its worker and its session), and
    max_connections is shared with everyone else, so the limit is learnt
    rather than configured; housekeeping relaxes it by one a second.
    """
    busy = sum(1 for w in pool["workers"].values() if w["task"] is not None)
    pool["cap"] = max(1, min(pool.get("cap") or busy, busy))
    for name, worker in list(pool["workers"].items()):
        if worker["task"] is None:
            disconnect(pool, name)  # an idle worker holds a backend a task's session could use


def housekeeping(pool, events):
    now = time.monotonic()
    if now < pool["housekeeping_at"]:
        return
    pool["housekeeping_at"] = now + HOUSEKEEPING_EVERY
    if pool.get("cap") is not None:
        pool["cap"] += 1
        if pool["cap"] >= run_limit:
            pool["cap"] = None
    recovered = run("recover", "SELECT pgtaskpy.recover_orphaned_tasks() AS n")[0]["n"]
    expired = run("expire", "SELECT pgtaskpy.expire_inactive_tasks() AS n")[0]["n"]
    deleted = run("retention", "SELECT pgtaskpy.delete_old_tasks() AS n")[0]["n"]
    if deleted:
        events.append({"event": "deleted_old", "count": deleted})
    if recovered:
        events.append({"event": "recovered", "count": recovered})
    if expired:
        events.append({"event": "expired", "count": expired})


def pick_worker(pool, task):
    """An idle worker for the task: the one holding its reusable session, else any."""
    idle = [(name, w) for name, w in pool["workers"].items() if w["task"] is None]
    key = [task["owner"], task["remote"], task["hash"]]
    for name, worker in idle:
        if task["reuse"] and worker["key"] == key:
            return name
    if idle:  # prefer one without a kept session, which it would have to close
        return min(idle, key=lambda item: item[1]["key"] is not None)[0]
    return new_worker(pool)


def new_worker(pool):
    pool["serial"] += 1
    name = f"pg_task_py_w{pool['serial']}"
    run("connect", "SELECT dblink.dblink_connect($1, $2)", ["text", "text"], [name, worker_conninfo()])
    pool["workers"][name] = {"task": None, "key": None, "idle_since": time.monotonic()}
    return name


def start(pool, task, claimer, events):
    try:
        name = pick_worker(pool, task)
        run("send", "SELECT dblink.dblink_send_query($1, $2)", ["text", "text"],
            [name, f"CALL pgtaskpy.run_task({int(task['id'])}, {int(claimer)})"])
    except plpy.SPIError as exc:
        # No backend for it now (max_connections?): the task waits for the next turn.
        run("unclaim", "UPDATE {ext}.task SET state = 'PLAN', worker = NULL"
            " WHERE id = $1 AND state = 'TAKE'", ["bigint"], [task["id"]])
        limit_concurrency(pool)
        events.append({"event": "start_failed", "id": task["id"], "message": str(exc)})
        return
    worker = pool["workers"][name]
    worker["task"] = task["id"]
    worker["key"] = [task["owner"], task["remote"], task["hash"]] if task["reuse"] else None
    events.append({"event": "start", "id": task["id"], "worker": name})


def close_idle_workers(pool, keep_spare):
    """Close idle workers past their keep time, but one spare worker without a
    session when `keep_spare`; return seconds until the next one is due."""
    now = time.monotonic()
    next_due = None
    spare = None
    for name, worker in list(pool["workers"].items()):
        if worker["task"] is not None:
            continue
        if keep_spare and spare is None and worker["key"] is None:
            spare = name
            continue
        keep = KEEP_IDLE_SESSION if worker["key"] is not None else KEEP_IDLE_WORKER
        due = worker["idle_since"] + keep
        if due <= now:
            disconnect(pool, name)
        elif next_due is None or due - now < next_due:
            next_due = due - now
    return next_due


def ensure_spare_worker(pool, events):
    """Keep one idle worker with PL/Python loaded, so the next task pays neither a
    backend start nor PL/Python's start (about 100 ms together) before it runs."""
    if any(w["task"] in (None, WARM_UP) and w["key"] is None for w in pool["workers"].values()):
        return  # one is idle or warming up already
    if len(pool["workers"]) >= run_limit or pool.get("cap") is not None:
        return  # no spare while the server is short of connections
    try:
        name = new_worker(pool)
        run("send", "SELECT dblink.dblink_send_query($1, $2)", ["text", "text"],
            [name, f"CALL pgtaskpy.run_task({WARM_UP}, 0)"])
        pool["workers"][name]["task"] = WARM_UP
    except plpy.SPIError as exc:
        events.append({"event": "spare_failed", "message": str(exc)})


def cancel_running_tasks(pool, events):
    """Cancel the tasks this launcher's workers run (graceful stop past its grace period)."""
    ids = [w["task"] for w in pool["workers"].values() if w["task"] is not None]
    for row in run(
        "cancel",
        "SELECT id, {ext}.task_cancel(id) AS cancelled FROM {ext}.task"
        " WHERE id = ANY($1) AND state = 'WORK'",
        ["bigint[]"],
        [ids],
    ):
        events.append({"event": "cancel", "id": row["id"], "cancelled": row["cancelled"]})


def main():
    pool = state()
    events = []
    run("lock", "SELECT pgtaskpy.lock_scheduling()")
    if cancel_running:
        cancel_running_tasks(pool, events)
    housekeeping(pool, events)
    busy = sum(1 for w in pool["workers"].values() if w["task"] is not None)
    claimer = pool["pid"]
    limit = run_limit if pool.get("cap") is None else min(run_limit, pool["cap"])
    claimed = run(
        "claim",
        "SELECT * FROM pgtaskpy.claim_due_tasks($1, $2)",
        ["integer", "integer"],
        [max(0, limit - busy), claimer],
    )
    # Collect after claiming: a task whose end freed its group's slot for this
    # claim has its worker collected now, so that the group's next task finds
    # the worker holding its reusable session idle.
    answering = reap(pool, events)
    waits = [pool["housekeeping_at"] - time.monotonic()]
    if not claimed:  # else the next turn, in 10 ms, looks
        next_plan = run("next_plan", "SELECT pgtaskpy.seconds_to_next_plan() AS s")[0]["s"]
        if next_plan is not None:
            waits.append(next_plan)
    if answering:
        waits.append(0.05)  # its worker notifies when it is idle; this is the fallback
    idle_due = close_idle_workers(pool, keep_spare=run_limit > 0)
    if idle_due is not None:
        waits.append(idle_due)
    if claimed:
        # Started last: each worker waits for this transaction's commit to take
        # its task, so nothing slow (a new spare's connection) may follow.
        for task in claimed:
            start(pool, task, claimer, events)
        waits.append(0.01)  # the next turn replaces the spare these may have used
    elif run_limit > 0 and not answering:
        ensure_spare_worker(pool, events)
    running = sum(1 for w in pool["workers"].values() if w["task"] is not None)
    return json.dumps(events), max(0.0, min(waits)), running
