"""Command line of the launcher: `pg_task_py run --dsn CONNINFO [...]`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import psycopg

from pg_task_py import __version__
from pg_task_py.databases import Databases
from pg_task_py.launcher import Settings, SetupError, ascii_digits
from pg_task_py.metrics import Metrics, serve
from pg_task_py.status import STOP_SIGNALS, StatusError, Stopped, show_status
from pg_task_py.text import escape_controls

DESCRIPTION = """\
Run the pg_task_py scheduler: start the tasks inserted into table `task` of
each database, in worker backends opened through dblink, as soon as they are
due.  Runs in the foreground until SIGINT or SIGTERM, then stops cleanly
(exit 0): it claims nothing more, waits up to --grace seconds for running
tasks, cancels what is still running, and exits.

The database needs `CREATE EXTENSION pg_task_py CASCADE;` and the launcher
must connect as a superuser (it drives PL/Python and dblink).
"""

EPILOG = """\
connection:
  --dsn takes a libpq conninfo or URI ('dbname=app user=postgres',
  'postgresql:///app').  Without --dsn and --config, the libpq environment
  (PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, ...) decides, as for psql.

config file (--config), in the spirit of pg_task.json, one entry a database:
  [{"dsn": "dbname=app1"}, {"dsn": "dbname=app2", "run": 4, "grace": 60,
    "standby": "host=replica1"}]

standbys and failover:
  On a standby (in recovery) the launcher runs nothing, and takes over within
  a second of a promotion.  A multi-host --dsn with
  target_session_attrs=read-write ('host=db1,db2 port=5432,5432 ...') follows
  the primary after a failover.  --standby names a standby for tasks whose
  target is 'standby'.

reload: SIGHUP reads --config again: new databases start, removed ones stop
  (gracefully), changed "run" and "grace" apply; the others run on untouched.

exit status: 0 after a clean stop on SIGINT/SIGTERM (also when a database had
failed before it: that was logged then); 2 for bad usage (flags, config file);
1 when every database failed, so the launcher ended on its own (wrong
credentials, missing database or extension, a role that is not a superuser),
or one failed during the stop.  A server that is down or restarting is retried
with backoff, not fatal.

version: --version prints the launcher's version; its major.minor is the
extension version it belongs to.  On connecting to a database whose extension
is older, it logs a warning: run ALTER EXTENSION pg_task_py UPDATE there.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pg_task_py", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pg_task_py {__version__}",
                        help="print the launcher's version (its major.minor is the extension's) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run the scheduler in the foreground", description=DESCRIPTION,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--dsn", action="append", default=[], metavar="CONNINFO",
                     help="database to schedule; repeat for several databases")
    run.add_argument("--config", type=config_path, metavar="FILE",
                     help="JSON list of databases: [{\"dsn\": ..., \"run\": N, \"grace\": S, \"standby\": ...}]")
    run.add_argument("--run", type=positive_int, default=Settings.run, metavar="N",
                     help="most tasks running at once per database, like pg_task.run "
                          "(default: unlimited; each running task uses two backends)")
    run.add_argument("--grace", type=non_negative_seconds, default=Settings.grace, metavar="SECONDS",
                     help="on SIGINT/SIGTERM, how long to wait for running tasks "
                          "before cancelling them; 0 or more (default: %(default)s)")
    run.add_argument("--standby", type=conninfo, metavar="CONNINFO",
                     help="a standby of the databases' server (libpq conninfo: host, port, ...; user, password "
                          "and dbname are the task's own) where tasks of target 'standby' run, read-only; they "
                          "run on the primary when it cannot be reached or lags more than "
                          "pg_task_py.standby_max_lag")
    run.add_argument("--log-level", default="INFO", type=str.upper, metavar="LEVEL",
                     choices=LOG_LEVELS, help=f"{', '.join(LOG_LEVELS)}, any case (default: %(default)s)")
    run.add_argument("--log-json", action="store_true", help="log one JSON object a line")
    run.add_argument("--metrics", type=listen_address, metavar="ADDR:PORT",
                     help="serve Prometheus metrics on http://ADDR:PORT/metrics and a health check on /health "
                          "(200 while every database had a turn in the last 5 s, else 503); default: off")
    status = commands.add_parser(
        "status", help="print the view task_stats as a table (groups, running, due, late, failures, paused)",
        description="Print one line per (owner, group) of the view task_stats: tasks running, due and how late "
                    "the oldest due one is, planned later, ended in the last hour, paused, the last error. "
                    "Paused and late groups first.  Connects as any role: it sees what that role sees.")
    status.add_argument("--dsn", default="", metavar="CONNINFO",
                        help="the database (default: the libpq environment, PGHOST, PGDATABASE, ...)")
    status.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, metavar="SECONDS",
                        help="print it again every SECONDS (default 2) until Ctrl-C")
    return parser.parse_args(argv)


WATCH_MOST = 86400.0 * 365  # seconds: status --watch's longest period


def positive_seconds(text: object) -> float:
    """status --watch: a refresh period."""
    words = f"must be a number of seconds, at least 0.1 and at most {WATCH_MOST:,.0f} (a year)"
    value = number(text, float, words)
    if not (0.1 <= value <= WATCH_MOST):  # (longer: past what a thread's wait takes, a traceback)
        raise argparse.ArgumentTypeError(words)
    return value


def config_path(text: str) -> Path:
    """--config: a file's name (an empty one was read as '.', "Is a directory: '.'")."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file")
    return Path(text)


def listen_address(text: str) -> tuple[str, int]:
    """--metrics: 'ADDR:PORT' ('127.0.0.1:9187', ':9187' for every address, '[::1]:9187')."""
    address, _, port = text.rpartition(":")
    if not _ or not ascii_digits(port) or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError("must be ADDR:PORT, e.g. 127.0.0.1:9187 or :9187")
    host = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    if "[" in host or "]" in host or host != address and ":" not in host:
        # ('[::1:9187' and '[]:9187' were taken; brackets hold an IPv6 address, and only that)
        raise argparse.ArgumentTypeError("must be ADDR:PORT with an IPv6 address in brackets, e.g. [::1]:9187")
    host = host or "0.0.0.0"
    try:  # (a name that does not resolve is a bad value: it ended the launcher with exit 1, once started)
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot listen on {host}: {getattr(exc, 'strerror', None) or exc}") from None
    return host, int(port)


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


MOST_RUN = 2**31 - 1  # the scheduling functions take --run as an integer


def positive_int(text: object) -> int:
    """--run and a config entry's "run": 0 or less would never run a task; beyond MOST_RUN no call
    of the scheduling functions would take it (the launcher retried that for ever)."""
    value = number(text, int, f"must be a whole number from 1 to {MOST_RUN}")
    if not 1 <= value <= MOST_RUN:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MOST_RUN}")
    return value


def non_negative_seconds(text: object) -> float:
    """--grace and a config entry's "grace": a negative or NaN wait means nothing sensible."""
    value = number(text, float, "must be a number of seconds, 0 or more")
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return value


def number(value: object, kind: type, problem: str) -> int | float:
    """A flag's text or a config value as a number; JSON true is not 1, nor 4.7 four (nor 1e30 a
    whole number), nor '٤' (int() reads other scripts' digits; the launcher takes 0-9 only)."""
    try:
        if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()) \
                or (isinstance(value, str) and not value.isascii()):
            raise TypeError(value)
        return kind(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(problem) from None


def optional_conninfo(value: object) -> str | None:
    """A config entry's "standby": null or a conninfo."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise argparse.ArgumentTypeError("must be a libpq conninfo string")
    return conninfo(value)


def conninfo(text: str) -> str:
    """--standby and a config entry's "standby": a conninfo libpq can read (not shown: it may hold a password)."""
    try:
        psycopg.conninfo.conninfo_to_dict(text)
    except psycopg.ProgrammingError:
        raise argparse.ArgumentTypeError("must be a libpq conninfo, such as 'host=standby1 port=5432'") from None
    return text


# libpq's values of a closed set, and its whole-number keywords (connectOptions2, parse_int_param):
# it refuses others only as it connects, which a reload should not wait for.
CONNINFO_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "sslcertmode": ("disable", "allow", "require"),
    "load_balance_hosts": ("disable", "random"),
    "ssl_min_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "ssl_max_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    # (libpq 18's: a bad value exited 1 rather than 2, and a reload took it, stopping the database)
    "sslnegotiation": ("postgres", "direct"),
    "min_protocol_version": ("3.0", "3.2", "latest"),
    "max_protocol_version": ("3.0", "3.2", "latest"),
}
# require_auth (libpq 16): a comma-separated list of these, each with a "!" or none without.
REQUIRE_AUTH_METHODS = ("password", "md5", "gss", "sspi", "scram-sha-256", "oauth", "none")
CONNINFO_INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                     "tcp_user_timeout")
# A whole number as libpq's strtol() reads it.  re.ASCII: without it, \d takes '²' and '١' and \s a
# no-break space, which libpq refuses as it connects (and int('²') raised: a traceback, exit 1).
LIBPQ_INTEGER = re.compile(r"\s*[-+]?\d+\s*", re.ASCII)


def conninfo_problem(dsn: str) -> str | None:
    """What libpq would refuse in a conninfo as it connects, told before (None: nothing seen).
    A keyword the conninfo leaves out is read from the libpq environment (PGPORT=abc), as libpq
    reads it.  Not the values themselves: a conninfo may hold a password."""
    if "\0" in dsn:  # (libpq reads up to it: the rest, a user= say, was dropped without a word)
        return "holds a NUL character"
    try:
        given = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "is not a libpq conninfo or URI that can be read"
    keywords: dict[str, tuple[str, str]] = {  # keyword: (value, where libpq takes it from)
        option.keyword.decode(): (option.val.decode(errors="replace"), f" (from {option.envvar.decode()})")
        for option in psycopg.pq.Conninfo.get_defaults()
        if option.envvar and option.val is not None and os.environ.get(option.envvar.decode()) is not None}
    keywords.update({keyword: (str(value), "") for keyword, value in given.items()})
    ports, origin = keywords.get("port", ("", ""))
    for port in ports.split(","):
        if port.strip() and not (LIBPQ_INTEGER.fullmatch(port) and 1 <= int(port) <= 65535):
            return f"has an invalid port number{origin}"
    for keyword in CONNINFO_INTEGERS:
        value, origin = keywords.get(keyword, (None, ""))
        if value is not None and not LIBPQ_INTEGER.fullmatch(value):
            return f"has an invalid {keyword} (a whole number){origin}"
    for keyword, choices in CONNINFO_CHOICES.items():
        value, origin = keywords.get(keyword, (None, ""))
        if value is not None and value not in choices:
            return f"has an invalid {keyword} (one of {', '.join(choices)}){origin}"
    value, origin = keywords.get("require_auth", (None, ""))
    if value:  # (as libpq reads it: no spaces around the commas)
        methods = value.split(",")
        negated = {method.startswith("!") for method in methods}
        if (len(negated) > 1 or len(set(methods)) < len(methods)
                or any(method.removeprefix("!") not in REQUIRE_AUTH_METHODS for method in methods)):
            return (f"has an invalid require_auth (a list of {', '.join(REQUIRE_AUTH_METHODS)}, each once, each"
                    f" with \"!\" before it or none){origin}")
    return None


def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object of the config file, each key once (json.loads' object_pairs_hook)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {json.dumps(key)} is given twice in one object")
        seen.add(key)
    return dict(pairs)


def load_settings(args: argparse.Namespace) -> list[Settings]:
    """One Settings per database, from --dsn flags and the --config file: each database once, with
    a conninfo libpq can use."""
    settings = [Settings(dsn=dsn, run=args.run, grace=args.grace, standby=args.standby) for dsn in args.dsn]
    if not args.dsn and args.config is None:  # the libpq environment's database, checked as a --dsn is
        settings = [Settings(dsn="", run=args.run, grace=args.grace, standby=args.standby)]
    if args.config is not None:
        try:
            # (utf-8-sig: the byte order mark an editor on Windows writes first; a key given twice
            # is refused, where the last one won: `"dsn"` twice ran the second database unsaid)
            entries = json.loads(args.config.read_text(encoding="utf-8-sig"), object_pairs_hook=unique_keys)
        except (OSError, ValueError, RecursionError) as exc:  # (Recursion: '[' nested 100,000 deep)
            raise SetupError(f"cannot read config file {args.config}: {exc}") from None
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) and "dsn" in e
                                                                  for e in entries):
            # (An empty list ran the libpq environment's database, as if there were no file.)
            raise SetupError(f"config file {args.config}: expected a JSON list of objects with a \"dsn\","
                             " one at least")
        settings += [config_entry(args.config, position, entry, args)
                     for position, entry in enumerate(entries, 1)]
    for position, entry in enumerate(settings, 1):
        # (named by position among the --dsn flags, then the file's entries: a conninfo may hold a password)
        where = ("the libpq environment's database" if not args.dsn and args.config is None
                 else f"--dsn {position}" if position <= len(args.dsn)
                 else f"config file {args.config}: entry {position - len(args.dsn)}")
        problem = conninfo_problem(entry.dsn)
        if problem is not None:
            raise SetupError(f'{where}: the conninfo {problem}')
        problem = conninfo_problem(entry.standby) if entry.standby is not None else None
        if problem is not None:  # (else its tasks ran on the primary, without a word)
            raise SetupError("--standby: the conninfo " + problem if entry.standby is args.standby
                             else f"{where}: the standby conninfo {problem}")
        if any(other.dsn == entry.dsn for other in settings[:position - 1]):
            # Two schedulers of one database, each with its own --run, shared one metrics label.
            raise SetupError(f"{where}: the same conninfo as a database before it")
    return settings


def config_entry(path: Path, position: int, entry: dict, args: argparse.Namespace) -> Settings:
    """One database of the config file, checked as strictly as the flags (a typo must not run)."""
    unknown = set(entry) - {"dsn", "run", "grace", "standby"}
    if unknown:
        raise SetupError(f"config file {path}: unknown key(s) {sorted(unknown)}")
    if not isinstance(entry["dsn"], str):
        raise SetupError(f'config file {path}: entry {position}: "dsn" must be a libpq conninfo string')
    values = {}
    for key, check, default in (("run", positive_int, args.run), ("grace", non_negative_seconds, args.grace),
                                ("standby", optional_conninfo, args.standby)):
        value = entry.get(key, default)
        try:
            if key != "standby" and isinstance(value, str):  # (JSON has numbers: "4" is a typo's sign)
                raise argparse.ArgumentTypeError("must be a JSON number, not a string")
            values[key] = check(value)
        except argparse.ArgumentTypeError as exc:
            # The entry's position, not its dsn (nor a bad standby): a conninfo may hold a password.
            got = "" if key == "standby" else f" (got {json.dumps(value)})"
            raise SetupError(f'config file {path}: entry {position}: "{key}" {exc}{got}') from None
    return Settings(dsn=str(entry["dsn"]), **values)


RELOAD_READ_TIMEOUT = 10.0  # seconds a SIGHUP's reading of the flags and config file may take


class JsonFormatter(logging.Formatter):
    """One JSON object a line; `time` in ISO 8601 with its UTC offset (a log shipper read the text
    format's local time, with no offset, as UTC)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        fields = dict(getattr(record, "fields", {}))
        if "message" in fields:  # (an event's own message, the error it tells: it replaced the line's)
            fields["detail"] = fields.pop("message")
        line = {"time": moment, "level": record.levelname, "message": record.getMessage(), **fields}
        if record.exc_info:  # (the traceback a "please report it" line asks for)
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """One line an event, control characters escaped (escape_controls); not a traceback after it."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return escape_controls(super().formatMessage(record))


class AtLevelOrAlways(logging.Filter):
    """Records at the chosen level or above, and those marked `always` (the "starting" line, which
    tells a supervisor that SIGTERM now stops cleanly, at --log-level WARNING too)."""

    def __init__(self, level: str) -> None:
        super().__init__()
        self.level = logging.getLevelName(level)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or getattr(record, "always", False)


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(AtLevelOrAlways(level))
    logging.basicConfig(level=min(logging.INFO, logging.getLevelName(level)), handlers=[handler])
    logging.getLogger("psycopg").setLevel(logging.WARNING)


def run_all(settings: list[Settings], metrics_at: tuple[str, int] | None = None,
            reload: Callable[[], list[Settings]] | None = None, held_signals: Sequence[int] = ()) -> int:
    """Run one scheduler thread per database; return the exit status.  `reload` gives the
    databases and settings anew (flags and config file), on SIGHUP; `held_signals` came before
    these handlers (pg_task_py.command)."""
    # Handlers first: the "starting" line tells a supervisor that SIGTERM now stops cleanly.
    stopping = threading.Event()
    reload_wanted = threading.Event()
    databases: Databases | None = None

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():  # (a second signal: the stop goes on as it was; SIGKILL ends it at once)
            logging.getLogger("pg_task_py").info("received %s while stopping: the stop goes on (--grace)",
                                                 signal.Signals(signum).name)
            return
        logging.getLogger("pg_task_py").info("received %s: stopping", signal.Signals(signum).name)
        stopping.set()
        if databases is not None:
            databases.stop_all()

    def on_hangup(_signum: int, _frame: object) -> None:
        # (Python's default ended the launcher with no word: a closed terminal, a supervisor's reload)
        reload_wanted.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    logging.getLogger("pg_task_py").info("pg_task_py %s starting: %d database(s)", __version__, len(settings),
                                         extra={"always": True})
    for signum in held_signals:
        (on_hangup if signum == signal.SIGHUP else on_signal)(signum, None)
    metrics = None
    if metrics_at is not None:
        metrics = Metrics()
        try:
            server = serve(metrics, *metrics_at)
        except OSError as exc:
            logging.getLogger("pg_task_py").error("cannot serve metrics on %s:%d: %s", *metrics_at, exc.strerror or exc)
            return 1
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in host else host  # (an IPv6 address, bracketed as URLs write it)
        logging.getLogger("pg_task_py").info("metrics on http://%s:%d/metrics", shown, port)

    databases = Databases(settings, metrics)
    reading = ConfigReading(reload) if reload is not None else None
    if stopping.is_set():  # (a signal before the threads existed)
        databases.stop_all()
    while databases.running():
        databases.join(timeout=0.2)
        if stopping.is_set() and databases.left_stuck():
            return 1
        # (before a SIGHUP's new reading, which would replace it: `echo ... > fifo; kill -HUP`, a review)
        if reading is not None and reading.ended_late() and not stopping.is_set():
            logging.getLogger("pg_task_py").info("the reading of the configuration a reload gave up has ended:"
                                                 " applying it")
            apply_reading(databases, reading, stopping)
        if reload_wanted.is_set():
            reload_wanted.clear()
            if stopping.is_set():
                logging.getLogger("pg_task_py").info("received SIGHUP while stopping: ignored")
            else:
                reload_configuration(databases, reading, stopping)
    status = databases.exit_status(stop_asked=stopping.is_set())
    if not stopping.is_set():  # (each database ended by itself: the process ended with no word of it, a probe)
        logging.getLogger("pg_task_py").log(logging.ERROR if status else logging.INFO,
                                            "no database left to schedule: exiting (%d)", status)
    return status


class ConfigReading:
    """A reload's reading of the flags and config file, in a thread of its own, which a stop
    abandons: a --config whose reading blocks (a pipe whose writer hangs) held the main thread, and
    the launcher stopped its databases and never exited (a review; a signal does not always reach
    the main thread's read).  One at a time: a reading given up (RELOAD_READ_TIMEOUT) goes on, and
    the next SIGHUP waits for it, rather than start a second beside it (two readers of a FIFO: the
    given-up one took the new config, and the new one read nothing, a review)."""

    def __init__(self, reload: Callable[[], list[Settings]]) -> None:
        self.reload = reload
        self.thread: threading.Thread | None = None
        self.outcome: dict[str, object] = {}
        self.given_up = False  # the reading's reload gave up waiting for it (it is applied when it ends)

    def start(self) -> bool:
        """Start a reading; False when the last one, given up, still goes on (it is the one waited for)."""
        if self.thread is not None and self.thread.is_alive():
            return False
        self.given_up = False
        outcome: dict[str, object] = {}

        def read() -> None:
            try:
                outcome["wanted"] = self.reload()
            except Exception as exc:  # noqa: BLE001 (a reload must not end every database's scheduling)
                outcome["error"] = exc

        self.outcome = outcome
        self.thread = threading.Thread(target=read, name="pg_task_py reload", daemon=True)
        self.thread.start()
        return True

    def ended_late(self) -> bool:
        """Whether a reading given up has ended since: what it read is still wanted (its SIGHUP
        asked for it, and a FIFO's writer, once it wrote, writes no more: a review)."""
        if self.given_up and self.thread is not None and not self.thread.is_alive():
            self.given_up = False
            return True
        return False


def reload_configuration(databases: Databases, reading: ConfigReading | None, stopping: threading.Event) -> None:
    """SIGHUP: read the flags and config file again (`reading`) and apply them; a config file that
    cannot be used, or whose reading does not end within RELOAD_READ_TIMEOUT, changes nothing."""
    log = logging.getLogger("pg_task_py")
    if reading is None:
        log.info("received SIGHUP: nothing to reload")
        return
    if reading.start():
        log.info("received SIGHUP: reloading the configuration")
    else:
        log.info("received SIGHUP: reloading the configuration (its reading since an earlier SIGHUP goes on)")
    given_up_at = time.monotonic() + RELOAD_READ_TIMEOUT
    while reading.thread.is_alive():
        reading.thread.join(0.2)
        if stopping.is_set():
            log.info("the reload was abandoned: stopping")
            return
        if time.monotonic() >= given_up_at:
            # (it waited for good, and the main loop with it: a later SIGHUP went unheard, and a
            # removed database that never stopped was never left, a probe)
            log.error("reload not applied yet: reading the configuration did not end within %gs (a FIFO whose"
                      " writer hangs, a network file system that does not answer); what it reads is applied once it"
                      " ends", RELOAD_READ_TIMEOUT)
            reading.given_up = True
            return
    reading.given_up = False  # (applied here, not again by the main loop)
    apply_reading(databases, reading, stopping)


def apply_reading(databases: Databases, reading: ConfigReading, stopping: threading.Event) -> None:
    """What a reload's reading gave: the databases and settings, or why nothing changes."""
    log = logging.getLogger("pg_task_py")
    error = reading.outcome.get("error")
    if isinstance(error, SetupError):
        log.error("reload refused, nothing changed: %s", error)
    elif error is not None:
        log.error("reload refused, nothing changed: %s: %s", type(error).__name__, error)
    elif not stopping.is_set():
        databases.reload(reading.outcome["wanted"])
        if stopping.is_set():  # (a stop while it applied: what it started or kept stops too, a review)
            databases.stop_all()


def status(args: argparse.Namespace, held_signals: Sequence[int] = ()) -> int:
    """`pg_task_py status`: 0, or 1 with one line on stderr when the database cannot be read, or 2
    for a --dsn that libpq would refuse (told as `run` tells it: libpq's message quotes the
    conninfo, password and all).

    The stop signals are blocked but while show_status waits on the server or between tables,
    where they cancel its query: anywhere else one killed the command (the system's default again
    at the interpreter's exit) or raised a traceback inside an error's line (reviews)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    stopped = False

    def stop(signum: int, _frame: object) -> None:
        # One stop, then the rest blocked: a second signal's raise inside the first's unwinding
        # (psycopg's cancel, a lock's release) hung the command or printed a traceback (a review).
        nonlocal stopped
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if not stopped:
            stopped = True
            raise Stopped(signal.Signals(signum).name)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    if held_signals:  # (a stop as it started, until now: the table's query could wait for good, a review)
        print(f"pg_task_py status: stopped by {signal.Signals(held_signals[0]).name} before the table was read",
              file=sys.stderr)
        return 1
    problem = conninfo_problem(args.dsn)
    if problem is not None:
        print(f"pg_task_py status: {'--dsn' if args.dsn else 'the libpq environment'} {problem}", file=sys.stderr)
        return 2
    if sys.stdout is None:  # (started with its stdout closed: `>&-`)
        print("pg_task_py status: cannot write the table: stdout is closed", file=sys.stderr)
        return 1
    # (a role's group in characters the locale cannot write is shown escaped, as on stderr)
    sys.stdout.reconfigure(errors="backslashreplace")
    try:
        try:
            show_status(args.dsn, args.watch)  # (which unblocks the stop signals)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    except StatusError as exc:
        print(f"pg_task_py status: {exc}", file=sys.stderr)
        return 1
    except Stopped as exc:  # (after a table, or as an error went up to the block: that error is the outcome)
        if isinstance(exc.__context__, StatusError):
            print(f"pg_task_py status: {exc.__context__}", file=sys.stderr)
            return 1
        if isinstance(exc.__context__, OSError) and not isinstance(exc.__context__, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print(f"pg_task_py status: cannot write the table: {exc.__context__.strerror or exc.__context__}",
                  file=sys.stderr)
            return 1
    except BrokenPipeError:
        # The reader stopped reading (`| head`): done, as for any Unix tool.  Python's flush of
        # stdout at exit would fail again, so stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:  # (a full disk: the same, with the reason and 1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"pg_task_py status: cannot write the table: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


class StoppedWhileStarting(BaseException):
    """SIGINT or SIGTERM before the launcher ran: it stops there (its --config may never come).
    A BaseException, as KeyboardInterrupt: no guard of the settings' reading takes it for theirs."""




def main(argv: list[str] | None = None, held_signals: Sequence[int] = ()) -> int:
    args = parse_args(argv)
    if args.command == "status":
        return status(args, held_signals)
    setup_logging(args.log_level, args.log_json)
    # A stop while the settings are read ends the start: a --config whose reading blocks (a
    # pipe whose writer hangs, a stalled network file system) held SIGTERM until SIGKILL (a
    # review).  SIGHUP stays held, for run_all: the file is read anyway.
    stop_handlers: dict[int, object] = {}
    stopped: list[int] = []

    def stopped_while_starting(signum: int, _frame: object) -> None:
        if not stopped:  # (once: a second signal right after it raised in the except, a traceback)
            stopped.append(signum)
            raise StoppedWhileStarting(signal.Signals(signum).name)

    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            stop_handlers[signum] = signal.signal(signum, stopped_while_starting)
        for signum in held_signals:
            if signum in stop_handlers:
                stopped_while_starting(signum, None)
        settings = load_settings(args)
    except StoppedWhileStarting as exc:
        logging.getLogger("pg_task_py").info("received %s while starting: stopped", exc)
        return 0
    except SetupError as exc:
        logging.getLogger("pg_task_py").error("%s", exc)
        return 2
    finally:
        for signum, handler in stop_handlers.items():
            signal.signal(signum, handler)
    return run_all(settings, args.metrics, reload=lambda: load_settings(args), held_signals=held_signals)
