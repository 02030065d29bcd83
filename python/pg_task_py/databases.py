"""The databases a launcher schedules: a scheduler thread each, which a reload (SIGHUP) adds,
stops or changes without touching the others."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from pg_task_py.launcher import CONNECTED, Scheduler, Settings, SetupError, StopRequest, database_log
from pg_task_py.metrics import Metrics

log = logging.getLogger("pg_task_py")

# Seconds past a database's --grace that a stop waits for its scheduling turn to return (one that
# waits for a lock a session holds, or for a server that stopped answering), before cancelling the
# turn; and then before the launcher exits without it, as a SIGKILL would (README, Guarantees).
STUCK_AFTER_GRACE = 10.0
STUCK_AFTER_CANCEL = 5.0


class Database:
    """One database's scheduler, running in a thread of its own until its `stop` is set."""

    def __init__(self, settings: Settings, metrics: Metrics | None) -> None:
        self.stop = StopRequest()
        self.scheduler = Scheduler(settings, self.stop, metrics)
        self.error: str | None = None  # why it ended, when retrying could not help
        self.failed_stopping = False  # it ended so after its stop was asked: not a clean stop
        self.removed = False  # a reload took it out of the configuration: it is stopping
        self.stop_asked_at: float | None = None  # (time.monotonic()) when SIGINT/SIGTERM asked it to stop
        self.turn_cancelled_at: float | None = None  # when a stop that outlasted its grace cancelled its turn
        self.gauges_removed = False  # (ended with an error: its figures went once, Databases.join)
        # (A daemon: a thread stuck in a turn does not keep the process from exiting: left_stuck.)
        self.thread = threading.Thread(target=self._run, name=self.scheduler.name, daemon=True)  # (no password)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.scheduler.run()
        except SetupError as exc:
            self.failed_stopping = self.stop.is_set()
            self.error = str(exc)
            log.error("%s", exc, extra={"fields": {"database": self.scheduler.name}})  # (its message names it)
        except Exception as exc:  # noqa: BLE001 (a fault of the launcher's: said once, not restarted in a loop)
            self.failed_stopping = self.stop.is_set()
            self.error = f"{self.scheduler.name}: stopped by an error of the launcher: {exc!r}"
            log.exception("%s (please report it; a reload starts it again)", self.error,
                          extra={"fields": {"database": self.scheduler.name}})

    @property
    def settings(self) -> Settings:
        return self.scheduler.settings


class Databases:
    """Every database of the launcher's flags and config file."""

    def __init__(self, settings: list[Settings], metrics: Metrics | None) -> None:
        self.metrics = metrics
        self.all = [Database(entry, metrics) for entry in settings]

    def running(self) -> bool:
        return any(database.thread.is_alive() for database in self.all)

    def exit_status(self, stop_asked: bool) -> int:
        """1 when the launcher ended on its own, its databases having failed, or when a database
        failed during a stop that SIGINT/SIGTERM asked for; else 0.  A database that failed before
        such a stop does not make it unclean: its error was logged then, and the others ran on."""
        failed = [database for database in self.all if database.error is not None]
        if not failed:
            return 0
        if not stop_asked or len(failed) == len(self.all):  # (none was running to stop)
            return 1
        return 1 if any(database.failed_stopping for database in failed) else 0

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` in all for the threads (short joins keep the main thread free for
        signals and reloads); a removed database whose scheduler has stopped goes, with its
        gauges; one that ended with an error stays, without its figures, until a reload starts it
        again."""
        deadline = time.monotonic() + timeout
        for database in list(self.all):
            # (the time left of one wait, not `timeout` each: a SIGHUP waited 0.2 s for each running
            # database, 7 s with 40, before its reload began: a probe)
            database.thread.join(max(deadline - time.monotonic(), 0))
            if database.thread.is_alive():
                if database.removed and self._stuck_for_good(database):
                    # (A connection attempt to a server that never answers: once the reload took it
                    # out, nothing ended it, and /health named it, 503, for good: a probe.)
                    log.error("%s: removed by a reload, still not stopped (its turn, or its connection, has not"
                              " returned): left (the tasks it started record their own end)", database.scheduler.name,
                              extra={"fields": {"database": database.scheduler.name}})
                    self.all.remove(database)
                    if self.metrics:
                        self.metrics.forget(database.scheduler.name)
                continue
            if database.error is not None and self.metrics and not database.gauges_removed:
                self.metrics.given_up(database.scheduler.name)
                database.gauges_removed = True
            if database.removed:
                self.all.remove(database)
                if self.metrics:
                    self.metrics.forget(database.scheduler.name)
            elif database.error is None and not database.stop.is_set():
                # Taken back by a reload just as its scheduler stopped: it starts again.
                self.all[self.all.index(database)] = Database(database.settings, self.metrics)

    def stop_all(self) -> None:
        for database in self.all:
            database.stop.set()
            if database.stop_asked_at is None:
                database.stop_asked_at = time.monotonic()

    def left_stuck(self) -> bool:
        """Whether the launcher stops waiting for the databases still running after a stop: each
        one's turn is cancelled STUCK_AFTER_GRACE seconds past its --grace, and once every one still
        running had that and STUCK_AFTER_CANCEL seconds more, the launcher exits without them."""
        alive = [d for d in self.all if d.thread.is_alive() and d.stop_asked_at is not None]
        if not alive or not all([self._stuck_for_good(d) for d in alive]):  # (a list: each one's turn cancelled)
            return False
        for database in alive:
            log.error("%s: still not stopped (its turn, or its connection, has not returned): exiting without "
                      "it (the tasks it started record their own end)", database.scheduler.name,
                      extra={"fields": {"database": database.scheduler.name}})
        return True

    @staticmethod
    def _stuck_for_good(database: Database) -> bool:
        """Whether a database asked to stop has not, its turn cancelled STUCK_AFTER_GRACE seconds past
        its --grace (this cancels it then) and STUCK_AFTER_CANCEL seconds gone since."""
        now = time.monotonic()
        past = now - database.stop_asked_at
        if database.turn_cancelled_at is None and past > database.settings.grace + STUCK_AFTER_GRACE:
            connected = database.scheduler.conn is not None and not database.scheduler.conn.closed
            database_log(database.scheduler.name, logging.WARNING,
                         "still stopping %.0fs after the stop was asked (--grace %gs): %s", past,
                         database.settings.grace,
                         "cancelling its scheduling turn" if connected else "its connection attempt goes on")
            database.turn_cancelled_at = now
            database.scheduler.cancel_turn()
        return database.turn_cancelled_at is not None and now - database.turn_cancelled_at >= STUCK_AFTER_CANCEL

    def reload(self, wanted: list[Settings]) -> None:
        """Make the running databases those of `wanted`, matched by conninfo: one no longer there
        stops (gracefully, with its own --grace), a new one starts, one that ended with an error
        starts again; `run` and `grace` change in place, for the next turn and the next stop.
        The other databases and their running tasks are not touched."""
        unmatched = list(wanted)
        ended: set[str] = set()  # the conninfos of databases that ended, started again if wanted
        stopping_wanted: list[tuple[Database, Settings]] = []  # still stopping, wanted again: below
        for database in list(self.all):
            entry = next((w for w in unmatched if w.dsn == database.settings.dsn), None)
            if not database.thread.is_alive():  # stopped, or ended with an error: started below if wanted
                self.all.remove(database)
                ended.add(database.settings.dsn)
                if self.metrics:
                    self.metrics.forget(database.scheduler.name)
                continue
            if entry is None:
                if not database.removed:
                    database_log(database.scheduler.name, logging.INFO, "not in the configuration any more: stopping")
                    database.removed = True
                    database.stop.set()
                    database.stop_asked_at = time.monotonic()
                continue
            unmatched.remove(entry)
            if database.removed:  # (once every scheduler this reload stops is stopping)
                stopping_wanted.append((database, entry))
                continue
            self._change(database, entry)
        for database, entry in stopping_wanted:
            # Still stopping: it schedules on, its running tasks not cancelled, unless another
            # conninfo of the database took it over meanwhile and schedules on (taken back beside
            # it, two schedulers of one database ran for good; refused while this reload stopped
            # that one too, none did: two reviews).
            if not CONNECTED.hand_back(database.scheduler.name, database.scheduler):
                database_log(database.scheduler.name, logging.INFO, "back in the configuration, but scheduled by"
                             " another conninfo of this launcher now: stopping on")
                continue
            database_log(database.scheduler.name, logging.INFO, "back in the configuration before it stopped:"
                         " scheduling on")
            database.removed = False
            database.stop.clear()
            database.stop_asked_at = database.turn_cancelled_at = None
            self._change(database, entry)
        for entry in unmatched:
            self.all.append(Database(entry, self.metrics))
            # (one that ended with an error was said to be "added", though it was there all along)
            database_log(self.all[-1].scheduler.name, logging.INFO, "%s",
                         "started again by the reload" if entry.dsn in ended else "added by the reload")

    def _change(self, database: Database, entry: Settings) -> None:
        """A running database's new settings: run and grace in place; a new standby needs a
        restart (workers hold the one they were opened with), so the old one stays."""
        if entry.standby != database.settings.standby:
            database_log(database.scheduler.name, logging.WARNING,
                         "a new standby takes a restart of the launcher; keeping the one it started with")
            entry = dataclasses.replace(entry, standby=database.settings.standby)
        if entry != database.settings:
            database.scheduler.settings = entry
            run = "unlimited" if entry.run == Settings.run else entry.run  # (the default: no --run)
            database_log(database.scheduler.name, logging.INFO, "run %s, grace %gs from now on", run, entry.grace)
