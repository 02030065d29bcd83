"""`--metrics ADDR:PORT`: Prometheus metrics and a health check over HTTP.

Recorded from what the loop already has: the events and the running count that
pgtaskpy.dispatch() returns, reconnections, and the time of each database's
last turn; once a second, pgtaskpy.metrics_snapshot() adds what only the
database knows (waiting due tasks by group, start lags, workers, paused groups).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HEALTHY_WITHIN = 5.0  # seconds: a database whose last turn is older makes /health answer 503
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 3600)
# Groups labelled of each kind, due and paused (the latest, the paused longest): any task author
# may make groups by the thousand, and each was a series read in the scheduler's turn (50,000
# pauses: a 9.6 MB scrape, 141 ms of each turn).  Those beyond are counted, not labelled.
GROUPS_LABELLED = 100
# The end states the launchers count (a STOP is a user's, ended by task_cancel or an UPDATE, and
# its series, served at 0 for good, read as "nothing stopped").
ENDS_COUNTED = ("DONE", "FAIL", "GONE")


class Metrics:
    """The launcher's metrics, one registry; safe to call from every database's thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.started = Counter("pg_task_py_tasks_started", "Tasks handed to a worker to start", ["database"],
                               registry=self.registry)
        self.ended = Counter("pg_task_py_tasks_ended", "Tasks ended, by end state (DONE, FAIL, GONE)",
                             ["database", "state"],
                             registry=self.registry)
        self.run_time = Histogram("pg_task_py_task_run_seconds", "Run time of ended tasks, as their workers timed it",
                                  ["database"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self.start_lag = Histogram("pg_task_py_task_start_lag_seconds", "Start lag of ended tasks (start - plan)",
                                   ["database"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self.running = Gauge("pg_task_py_running_tasks", "Tasks this launcher's workers run", ["database"],
                             registry=self.registry)
        self.due = Gauge("pg_task_py_due_tasks", "Waiting tasks that are due, by owner and group (the"
                         f" {GROUPS_LABELLED} latest groups, a tenth of them of one owner at most)",
                         ["database", "owner", "group"], registry=self.registry)
        self.oldest_due = Gauge("pg_task_py_oldest_due_seconds",
                                "now() - plan of the oldest due waiting task, by owner and group (those of"
                                " pg_task_py_due_tasks)",
                                ["database", "owner", "group"], registry=self.registry)
        self.workers = Gauge("pg_task_py_workers", "Worker backends of the database", ["database"],
                             registry=self.registry)
        self.paused = Gauge("pg_task_py_paused_seconds", "Seconds since the group's task_pause, by owner and group"
                            f" (the {GROUPS_LABELLED} paused longest, a tenth of them of one owner at most)",
                            ["database", "owner", "group"], registry=self.registry)
        self.due_groups = Gauge("pg_task_py_due_groups", "Groups with waiting due tasks (pg_task_py_due_tasks"
                                f" labels the {GROUPS_LABELLED} latest)", ["database"], registry=self.registry)
        self.paused_groups_count = Gauge("pg_task_py_paused_groups", "Paused groups (pg_task_py_paused_seconds"
                                         f" labels the {GROUPS_LABELLED} paused longest)", ["database"],
                                         registry=self.registry)
        self.standby_fallbacks = Counter("pg_task_py_standby_fallbacks", "Tasks of target 'standby' run on the"
                                         " primary instead (read-only)", ["database"], registry=self.registry)
        self.reconnects = Counter("pg_task_py_reconnects", "Connections lost or refused, then retried",
                                  ["database"], registry=self.registry)
        self.last_turn = Gauge("pg_task_py_last_turn_timestamp_seconds", "Unix time of the last successful turn",
                               ["database"], registry=self.registry)
        self.standby = Gauge("pg_task_py_standby", "1 while the server is a standby: the launcher runs nothing and "
                             "waits for a promotion", ["database"], registry=self.registry)
        self.lock = threading.Lock()
        self.turns: dict[str, float] = {}  # database -> time.monotonic() of its last turn
        # database -> the (owner, group) labels set last time: of due groups, of paused ones
        self.groups: dict[str, set[tuple[str, str]]] = {}
        self.paused_groups: dict[str, set[tuple[str, str]]] = {}
        self.counted: set[str] = set()  # databases whose counters counted something

    def expect(self, database: str) -> None:
        """A database this launcher schedules: unhealthy until its first turn."""
        with self.lock:
            self.turns.setdefault(database, float("-inf"))
        self._start_counters(database)

    def _start_counters(self, database: str) -> None:
        """The database's counters, at 0: an alert on their rate has a series before the first event."""
        self.reconnects.labels(database)
        self.started.labels(database)
        self.standby_fallbacks.labels(database)
        for state in ENDS_COUNTED:
            self.ended.labels(database, state)

    def rename(self, old: str, new: str) -> None:
        """The launcher names a database by its conninfo until it has connected, then by the server
        it is on: a failover changes the name.  The old name's gauges go (left, they stayed frozen at
        their last values, and an alert on a late group or a stale turn fired for good); its
        counters stay, as totals of what happened there, unless nothing happened there: the
        conninfo's name before the first connection was a database of zeros for the launcher's life."""
        with self.lock:
            self.turns[new] = self.turns.pop(old, float("-inf"))
            counted = old in self.counted
        self._remove_gauges(old)
        if not counted:
            self._remove_counters(old)
        self._start_counters(new)

    def forget(self, database: str) -> None:
        """A database the launcher no longer schedules (a reload removed it): its gauges go, and
        /health stops naming it; its counters stay, as totals."""
        with self.lock:
            self.turns.pop(database, None)
        self._remove_gauges(database)

    def given_up(self, database: str) -> None:
        """A database whose scheduler ended with an error (dropped, its extension gone): its
        figures go, as they are no longer read (they stayed at their last values, 3 tasks running
        in a database that no longer existed); /health goes on naming it, and its last turn's
        time stays, as the last time it was scheduled."""
        self._remove_gauges(database, keep=(self.last_turn,))

    def snapshot_refused(self, database: str) -> None:
        """A snapshot the server would not send (launcher.py): the figures read from it go, rather
        than stay at their last values (a lateness alert that no longer fired, or fired on)."""
        self._remove_gauges(database, keep=(self.running, self.last_turn, self.standby))

    def _remove_counters(self, old: str) -> None:
        for counter in (self.reconnects, self.started, self.standby_fallbacks):
            with contextlib.suppress(KeyError):
                counter.remove(old)
        for state in ("DONE", "FAIL", "GONE", "STOP"):
            with contextlib.suppress(KeyError):
                self.ended.remove(old, state)

    def _remove_gauges(self, old: str, keep: tuple = ()) -> None:
        for gauge in (self.running, self.workers, self.last_turn, self.standby, self.due_groups,
                      self.paused_groups_count):
            if gauge in keep:
                continue
            with contextlib.suppress(KeyError):
                gauge.remove(old)
        for owner, group in self.groups.pop(old, set()):
            self.due.remove(old, owner, group)
            self.oldest_due.remove(old, owner, group)
        for owner, group in self.paused_groups.pop(old, set()):
            self.paused.remove(old, owner, group)

    def turn(self, database: str, events: list[dict], running: int) -> None:
        """One successful turn of dispatch() and what it returned."""
        self.standby.labels(database).set(0)
        if events:
            with self.lock:
                self.counted.add(database)
        for event in events:
            kind = event.get("event")
            if kind == "start":
                self.started.labels(database).inc()
            elif kind == "end":
                self.ended.labels(database, str(event.get("state"))).inc()
                if isinstance(event.get("seconds"), (int, float)):
                    self.run_time.labels(database).observe(event["seconds"])
            elif kind == "expired":  # (housekeeping's: not started within `active`)
                self.ended.labels(database, "GONE").inc(event.get("count", 0))
            elif kind == "standby_fallback":
                self.standby_fallbacks.labels(database).inc()
            elif kind == "misconfigured":  # (housekeeping's: their owner's role_running_limit is bad)
                self.ended.labels(database, "FAIL").inc(event.get("count", 0))
        self.running.labels(database).set(running)
        self.last_turn.labels(database).set(time.time())
        with self.lock:
            self.turns[database] = time.monotonic()

    def snapshot(self, database: str, groups: list[tuple[str, str, int, float]], lags: list[float],
                 workers: int, paused: list[tuple[str, str, float]], due_groups: int, paused_groups: int) -> None:
        """What pgtaskpy.metrics_snapshot() returned: due tasks by group, start lags, workers, the
        paused groups with the seconds since their pause, and how many groups of each kind there
        are (those labelled are the snapshot's first GROUPS_LABELLED)."""
        seen = set()
        for owner, group, due, oldest in groups:
            self.due.labels(database, owner, group).set(due)
            self.oldest_due.labels(database, owner, group).set(oldest)
            seen.add((owner, group))
        for owner, group in self.groups.get(database, set()) - seen:  # no longer due: drop the series
            self.due.remove(database, owner, group)
            self.oldest_due.remove(database, owner, group)
        self.groups[database] = seen
        for lag in lags:
            self.start_lag.labels(database).observe(lag)
        self.workers.labels(database).set(workers)
        self.due_groups.labels(database).set(due_groups)
        self.paused_groups_count.labels(database).set(paused_groups)
        still = set()
        for owner, group, seconds in paused:
            self.paused.labels(database, owner, group).set(seconds)
            still.add((owner, group))
        for owner, group in self.paused_groups.get(database, set()) - still:  # resumed: drop the series
            self.paused.remove(database, owner, group)
        self.paused_groups[database] = still

    def standby_look(self, database: str) -> None:
        """A look whether a standby was promoted: a turn (healthy), with nothing due, paused or
        running here.  Its rows are the primary's, which its own launcher exports: a launcher whose
        primary came back as a standby kept exporting its last snapshot, frozen, beside the new
        primary's (sums counted each group twice, a lateness alert fired for good)."""
        self.turn(database, [], 0)
        self.snapshot(database, [], [], 0, [], 0, 0)
        self.standby.labels(database).set(1)

    def reconnect(self, database: str) -> None:
        with self.lock:
            self.counted.add(database)
        self.reconnects.labels(database).inc()

    def stale(self) -> list[str]:
        """Databases whose last turn is older than HEALTHY_WITHIN (or that never had one)."""
        now = time.monotonic()
        with self.lock:
            return sorted(name for name, at in self.turns.items() if now - at > HEALTHY_WITHIN)


class IPv6Server(ThreadingHTTPServer):
    """For an IPv6 address ('[::1]:9187'): the server's socket family is fixed before it binds."""

    address_family = socket.AF_INET6


def serve(metrics: Metrics, address: str, port: int) -> ThreadingHTTPServer:
    """Serve /metrics and /health from a daemon thread; returns the server (shutdown() stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.respond(with_body=True)

        def do_HEAD(self) -> None:  # noqa: N802 - a load balancer's health check may send HEAD
            self.respond(with_body=False)

        def respond(self, with_body: bool) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")  # (/health?probe=1 and /health/ are /health)
            if path == "/metrics":
                self.answer(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST, with_body)
            elif path == "/health":
                stale = metrics.stale()
                body = ("ok\n" if not stale else "".join(f"no turn within {HEALTHY_WITHIN:g}s: {n}\n" for n in stale))
                self.answer(503 if stale else 200, body.encode(), "text/plain; charset=utf-8", with_body)
            else:
                self.answer(404, b"/metrics or /health\n", "text/plain; charset=utf-8", with_body)

        def answer(self, status: int, body: bytes, content_type: str, with_body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - scrapes are not log lines
            pass

    server = (IPv6Server if ":" in address else ThreadingHTTPServer)((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
