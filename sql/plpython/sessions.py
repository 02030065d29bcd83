"""A worker's task sessions, and which one each task runs in.

A task runs in a session of its own, opened with libpq and logged in as its
owner (or to `remote`).  A worker keeps sessions for the tasks to come:

- the kept session: the one the last task ran in, kept for the next task of
  the same owner, remote and group while `count`/`live` allow.  Its reset
  (DISCARD ALL, unless `save`) is only sent when a task ends: it runs in the
  session while the worker writes the end, and its answer is read before the
  claim of the next task (settle_reset);
- sessions started ahead: new sessions of the owner of a task without
  `count`/`live`, started while that task runs, so that a backend's start-up
  is off the next task's path.  One is used only if a new session would start
  the same: the owner's and database's settings and login rights have not
  changed since (login_fingerprint).

TaskSessions.choose decides, once per task, which session it runs in and
whether that one is ready now; TaskSessions.take hands it over.

A task sees itself in its session as in pg_task's (task_settings): a new
session opened for a known task starts with those settings (libpq's
`options`: no statement, no round trip); any other is sent them
(send_prepare) before its input.
"""

import time

TYPE_CHECKING = False  # (not typing's: importing it slows a worker's first call; bench/RESULTS.md)

if TYPE_CHECKING:  # assembled with libpq.py by sql/build.py
    from libpq import ConnectError, RemoteRefused, Session, connect_timeout_seconds, conninfo_options, startup_options
    from task_rows import LOGIN_RIGHTS

# How far the standby a session is on is behind the primary, in seconds: 0 when it has replayed
# the primary's WAL up to $1 (the primary's flush position when the task's session was asked for),
# else the age of the last transaction it replayed (infinite: none since it started; NULL: not a
# standby).  Run as the task's owner: these functions need no privilege.
STANDBY_LAG = ("SELECT CASE WHEN NOT pg_catalog.pg_is_in_recovery() THEN NULL"
               " WHEN pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_catalog.pg_lsn THEN 0"
               " ELSE coalesce(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()"
               " - pg_catalog.pg_last_xact_replay_timestamp()), 'Infinity') END")

# Every task session's client_encoding, whatever its role's, database's or conninfo's: this code
# sends the input and reads the results as UTF-8 (libpq.py), and the server converts them from
# and to the database's encoding.  A role with client_encoding LATIN1 had the input's UTF-8 read
# as LATIN1: a task's U+00E9 written as U+00C3 U+00A9.
TASK_CLIENT_ENCODING = "UTF8"

# What a task sees of itself, as pg_task's sessions do: pg_task.id, pg_task.group (so that tasks
# it inserts join its group and name it their parent), the task table (pg_task.schema,
# pg_task.table, pg_task.oid), and its timeout as statement_timeout.
TASK_SETTINGS = ("pg_task.id", "pg_task.group", "pg_task.schema", "pg_task.table", "pg_task.oid", "statement_timeout")
PREPARE_QUERY = "SELECT " + ", ".join(
    f"pg_catalog.set_config('{name}', ${number}, false)" for number, name in enumerate(TASK_SETTINGS, 1))
# The startup options of a session not started with a task's settings: PREPARE_QUERY, and a kept
# session's reset, run without the database's or role's statement_timeout (20 ms, and a JIT
# threshold of 0, failed a task of timeout 0 before its input ran); the task's own timeout is
# set by PREPARE_QUERY, and DISCARD ALL goes back to this.
PLAIN_SESSION_OPTIONS = "-c statement_timeout=0"
# A task of target 'standby' that runs here (no standby at hand) is read-only as there: a write
# that fails on the standby succeeded on the primary whenever the standby was down or behind.
STANDBY_FALLBACK_OPTIONS = PLAIN_SESSION_OPTIONS + " -c default_transaction_read_only=on"
# A client certificate file that does not exist, so libpq sends none (it skips a missing file):
# a remote task of a role that is not a superuser has no certificate of the server's OS user.
NO_CLIENT_CERTIFICATE = "/nonexistent/pg_task_py: no client certificate"
# How long a task `after` others waits for the standby to replay the primary's WAL as it was when
# the task's session was asked for (its prerequisites' ends and writes included), before it runs
# on the primary: within standby_max_lag, a report `after` a load read the standby before the load.
# Also the longest any task waits for a standby whose last replayed transaction is older than
# standby_max_lag to replay up to the primary's flush position (open_standby).
STANDBY_CATCH_UP_WAIT = 1.0
STANDBY_CATCH_UP_STEP = 0.01
# The SQLSTATEs of a remote session refused by open_remote's rules (RemoteRefused).
REFUSED_LOGIN = "28000"  # (invalid_authorization_specification: the password rule)
BAD_REMOTE = "22023"  # (options a role may not set there, a replication connection)

# Longest a worker waits for the session started ahead for its group's next task to connect,
# before that task's claim: a session ready at the claim takes the task straight to WORK, in the
# transaction of the end before it; one still connecting costs a TAKE, a commit and another update
# (with 8 groups on 2 cores, 77 % of the tasks before this wait).  The end it follows is
# committed that much later; its stop is stamped already.
NEXT_SESSION_WAIT = 0.05

# Seconds between a waiting remote connect's calls of its on_wait (open_remote).
CONNECT_WAIT_STEP = 0.05

# The longest startup packet a PostgreSQL server reads (MAX_STARTUP_PACKET_LENGTH, in bytes): it
# closes the connection on a longer one, and libpq says only "server closed the connection
# unexpectedly ... terminated abnormally", which sent a remote task's author looking at the server.
STARTUP_PACKET_MOST = 10000

# Where a worker keeps its TaskSessions in GD: they outlive the call that opened them.
# (Code of 1.2 kept its sessions under other keys; dispatch's POOL_LAYOUT drops its workers.)
SESSIONS_KEY = "pgtaskpy.task_sessions"


def session_key(task):
    """The tasks a kept session may run: those of the same owner, remote and group."""
    return (task["owner"], task["remote"], task["hash"])


def reuses_sessions(task):
    """Whether the task's session may run further tasks of its group (`count`/`live`)."""
    return task["count"] > 0 or task["live_s"] > 0


def task_table(ctx):
    """The task table's schema (unquoted), name and oid, looked up once per backend."""
    if "pgtaskpy.task_table" not in ctx.SD:
        ctx.SD["pgtaskpy.task_table"] = ctx.run(
            "task_table",
            "SELECT n.nspname AS schema, c.relname AS table, c.oid::text AS oid FROM pg_catalog.pg_class AS c"
            " JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = '{ext}.task'::regclass",
        )[0]
    return ctx.SD["pgtaskpy.task_table"]


def task_settings(ctx, task):
    """TASK_SETTINGS of the task ({name: value}); `task` needs its id, group and timeout_s."""
    table = task_table(ctx)
    return dict(zip(TASK_SETTINGS, (str(task["id"]), task["group"], table["schema"], table["table"], table["oid"],
                                    f"{timeout_ms(task['timeout_s'])}ms")))


def timeout_ms(seconds):
    """A task's timeout as statement_timeout's whole milliseconds, rounded up: 0.9 ms cut to 0
    was no timeout at all.  (Rounded to microseconds first, the timeout's precision: the bound,
    2147483.647 s, times 1000 is a little over statement_timeout's most as a float.)"""
    ms = round(seconds * 1000, 3)
    whole = int(ms)
    return whole + (whole < ms)


def settings_at_start(ctx, task):
    """The task's settings (task_settings) and the startup options that carry them, for a new
    session of the task; (None, None) when they cannot go there (startup_options)."""
    settings = task_settings(ctx, task)
    options = startup_options(settings)
    return (settings, options) if options else (None, None)


def send_prepare(ctx, session, task, started_with=None):
    """Send the task's settings to a session that did not start with them: one started ahead
    of knowing its task, one that ran another, or one started with the task's settings of
    an earlier moment (`started_with`: its author changed the task's timeout since); whether
    it sent them.  Only sent: the answer is read (session.collect) after the WORK commit it
    overlaps."""
    settings = task_settings(ctx, task)
    if settings == started_with:
        return False
    session.send(PREPARE_QUERY, list(settings.values()))
    return True


def startup_packet_bytes(options, fallback_application_name):
    """The size of the startup packet libpq sends for a conninfo's options: its length and
    protocol words, the parameters it passes on to the server, each name and value ended by a
    NUL byte, and a last NUL.  (A service file's or the environment's options are not counted.)"""
    sent = {"user": options.get("user"), "database": options.get("dbname"), "options": options.get("options"),
            "replication": options.get("replication"),
            "application_name": options.get("application_name") or fallback_application_name,
            "client_encoding": TASK_CLIENT_ENCODING}
    return 9 + sum(len(name) + len(value.encode()) + 2 for name, value in sent.items() if value)


class KeptSession:
    """The session a task runs or ran in, kept for the next task of its owner, remote and group."""

    __slots__ = ("key", "login", "session", "runs", "born", "resetting", "target", "settings")

    def __init__(self, key, login, session, target=None, settings=None):
        self.key = key
        self.login = login  # the owner's role it logged in as (the task's `login`)
        self.session = session
        self.target = target  # the target of the task it was opened for
        self.settings = settings  # the task settings it started with (task_settings), if any
        self.runs = 0  # tasks run in it
        self.born = time.monotonic()
        self.resetting = False  # a reset is sent and its answer not read yet

    def may_run(self, task):
        """Whether `count`/`live` let the task run in this session, it is still open, and its owner
        is still the role it logged in as, with the right to log in (a new role of a dropped or
        renamed one's name ran in the old role's session, with its rights)."""
        return (
            self.key == session_key(task)
            and self.login is not None and self.login == task["login"]
            and self.target == task["target"]
            and (task["count"] <= 0 or self.runs < task["count"])
            and (task["live_s"] <= 0 or time.monotonic() < self.born + task["live_s"])
            and reuses_sessions(task)
            and (self.resetting or self.session.open_while_idle())  # (a reset's answer is still to come)
        )

    def reset_done(self):
        """Read the answer to the reset sent when the last task ended; False if it failed."""
        if self.resetting:
            self.resetting = False
            try:
                self.session.collect()
            except ConnectError:
                return False
        return True


class AheadSession:
    """A new session of `owner`, started before a task needed it, with the owner's
    login_fingerprint of that moment; `settings`: the task settings it started with
    (task_settings), when its task was known (a group's next due task), else None."""

    __slots__ = ("owner", "fingerprint", "session", "settings")

    def __init__(self, owner, fingerprint, session, settings=None):
        self.owner = owner
        self.fingerprint = fingerprint
        self.session = session
        self.settings = settings

    @property
    def prepared_for(self):
        """The id of the task whose settings it started with, or None."""
        return int(self.settings["pg_task.id"]) if self.settings is not None else None

    def connected(self, within=0.0):
        """Whether it has connected, waiting up to `within` seconds for that, and is still open
        (not failed, nor ended by the server while it waited: closed then)."""
        deadline = time.monotonic() + within
        try:
            while not self.session.advance(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    return False
            return self.session.open_while_idle()
        except ConnectError:
            return False


class SessionChoice:
    """Which session a task runs in: the kept one, one started ahead, or (neither) a new one;
    and whether it is ready now.  `fingerprint`: the owner's, when choosing read it."""

    __slots__ = ("kept", "ahead", "ready", "fingerprint")

    def __init__(self, kept=None, ahead=None, ready=False, fingerprint=None):
        self.kept = kept
        self.ahead = ahead
        self.ready = ready
        self.fingerprint = fingerprint

    @property
    def session(self):
        return self.kept.session if self.kept is not None else self.ahead.session

    @property
    def prepared_for(self):
        """The id of the task whose settings the chosen session started with, if any."""
        return self.ahead.prepared_for if self.ahead is not None else None


def connect_watched(keywords, on_wait):
    """A session connected with `keywords` asynchronously, `on_wait` run every CONNECT_WAIT_STEP
    seconds meanwhile (it raises to give the attempt up), and connect_timeout kept by this code,
    as libpq keeps it only in its blocking connect: a server that never answers (a dead host
    behind a proxy) would hold libpq's blocking call, and the worker with it, deaf to cancels,
    for ever when no connect_timeout is set.  With several hosts and a connect_timeout, libpq's
    blocking connect still makes the attempt: it gives each host connect_timeout and moves on to
    the next, which an asynchronous attempt cannot make it do; it runs beside the worker, which
    goes on acting on interrupts (libpq.py, _connect_beside)."""
    session = Session(keywords, wait=False)
    effective = session.effective_options()  # (the environment's and a service file's too)
    try:
        timeout = connect_timeout_seconds(effective.get("connect_timeout"))
    except ConnectError:
        session.close()
        raise
    if timeout is not None and "," in effective.get("host", "") + effective.get("hostaddr", ""):
        session.close()
        return Session(keywords, on_wait=on_wait or (lambda: None), wait_step=CONNECT_WAIT_STEP)
    session.wait_connected(timeout, on_wait=on_wait, wait_step=CONNECT_WAIT_STEP)
    return session


class TaskSessions:
    """The kept session and the sessions started ahead of one worker backend."""

    def __init__(self, ctx):
        self.ctx = ctx  # of the call that made this; every call of this code has the same plpy, GD, SD
        self.kept = None  # KeptSession
        self.ahead = []  # AheadSession, all of one owner, in the order they were started
        self.loopback = None  # this server's socket directory, port and database: read once
        # (owner, login_fingerprint) read by the latest choice, for the sessions start_ahead
        # starts next: read before they start, it is as good as a new read (one a task, not two).
        self.chosen_with = None
        # Tasks of target 'standby' that ran here instead, and why: {"id", "reason"}, for the
        # launcher's log (a reporting load that moved to the primary was seen nowhere).
        self.standby_fallbacks = []

    @classmethod
    def of_worker(cls, ctx):
        """This backend's TaskSessions, made by this very code.

        Sessions that other code left in GD (the code before ALTER EXTENSION
        UPDATE, or before this procedure was replaced) are closed, by that
        code, and never used: no session, nor an exception its code raises,
        crosses from one code to another.
        """
        sessions = ctx.GD.get(SESSIONS_KEY)
        if type(sessions) is not cls:
            if sessions is not None:
                sessions.close()
            sessions = ctx.GD[SESSIONS_KEY] = cls(ctx)
        return sessions

    def choose(self, task, early=None, next_of=False):
        """Which session the task runs in, and whether it is ready now; with `next_of`, which
        one the group's next task after `task` would run in, before it is known: the one started
        ahead with the settings of the task expected next (start_ahead), else one without.

        The kept session when `count`/`live` allow (ready).  Else, for a local
        task without `count`/`live`, a session started ahead that may run it
        (ahead_for): ready when it has connected and a new session would start
        the same.  Else a new session (not ready): take opens it, unless it
        finds one started ahead after all.  `early`: (owner, login_fingerprint)
        read since the task was inserted (fingerprint_ahead), used for that
        owner.
        """
        if self.kept is not None and self.kept.may_run(task):
            return SessionChoice(kept=self.kept, ready=True)
        if task["remote"] is not None or task["target"] is not None or reuses_sessions(task):
            return SessionChoice()
        ahead = self.ahead_for(task["owner"], None if next_of else task["id"])
        if ahead is None or not ahead.connected(within=NEXT_SESSION_WAIT if next_of else 0.0):
            return SessionChoice()
        if early is not None and early[0] == task["owner"]:
            fingerprint = early[1]
        else:
            fingerprint = self.login_fingerprint(task["owner"])
        self.chosen_with = (task["owner"], fingerprint)
        return SessionChoice(ahead=ahead, ready=ahead.fingerprint == fingerprint, fingerprint=fingerprint)

    def ahead_for(self, owner, task_id, prepared_ok=True):
        """The first session started ahead for `owner` that may run the task `task_id` (None: the
        group's next, not known yet): one started with its settings (with any task's settings),
        else one started with none.  One started with another task's settings runs no other: a
        RESET in that other task would bring the first one's back (claim_next_task checks).
        `prepared_ok` False: one started with none only, for a task whose session runs others."""
        mine = [entry for entry in self.ahead if entry.owner == owner]
        if not prepared_ok:
            prepared = []
        elif task_id is None:
            prepared = [entry for entry in mine if entry.prepared_for is not None]
        else:
            prepared = [entry for entry in mine if entry.prepared_for == task_id]
        return next(iter(prepared + [entry for entry in mine if entry.prepared_for is None]), None)

    def fingerprint_ahead(self):
        """(owner, login_fingerprint) of the first session started ahead, or None: read by a worker
        while its task's claim commits, for the choice of that task's session.  Read after the
        launcher's claim saw the task, so after its insert: as good as reading it once the
        task is taken, which would put the lookup between the claim and the task's start."""
        if not self.ahead:
            return None
        owner = self.ahead[0].owner
        return owner, self.login_fingerprint(owner)

    def take(self, task, choice, on_wait=None):
        """The task's session, as chosen, kept from now on for the tasks after it;
        ConnectError if a new one cannot be opened.  `on_wait`: see open_remote."""
        if choice.kept is not None and choice.kept.reset_done():
            return choice.kept
        self.close_kept()
        settings = None
        if task["remote"] is not None:
            session = self.open_remote(task, on_wait)
        elif task["target"] == "standby":
            session, (why, reason) = self.open_standby(task["owner"], caught_up=task["after_others"],
                                                       on_wait=on_wait)
            if session is None:
                session = self.open_local(task["owner"], STANDBY_FALLBACK_OPTIONS)
                self.standby_fallbacks.append({"id": task["id"], "why": why, "reason": reason})
        elif choice.ahead is not None and choice.ready:
            self.ahead.remove(choice.ahead)
            session, settings = choice.ahead.session, choice.ahead.settings
        else:
            ahead = self.take_ahead(task, choice.fingerprint)
            if ahead is not None:
                session, settings = ahead.session, ahead.settings
            else:
                session, settings = self.open_for(task)
        self.kept = KeptSession(session_key(task), task["login"], session, task["target"], settings)
        return self.kept

    def open_for(self, task):
        """A new session of the local task's owner, waited for, and the task settings it started
        with: this one's, unless its session may run others (`count`/`live`: a RESET in those
        would bring this task's settings back)."""
        settings, options = (None, None) if reuses_sessions(task) else settings_at_start(self.ctx, task)
        return self.open_local(task["owner"], options), settings

    def release(self, task):
        """The task in the kept session has ended: keep the session for the group's next
        task, or close it.  The reset is only sent: it runs while the worker writes the end."""
        kept = self.kept
        if kept is None:  # its session broke, and no other could be opened (run_task's run_input)
            return
        kept.runs += 1
        if not reuses_sessions(task) or not kept.session.ok:
            self.close_kept()
            return
        try:
            kept.session.send("RESET statement_timeout; RESET pg_task.id" if task["save"] else "DISCARD ALL")
            kept.resetting = True
        except ConnectError:
            self.close_kept()

    def settle_reset(self):
        """Read the answer to the reset sent when the task ended (it ran while the end was written).

        Read before the claim: from the claim to the commit, the scheduling lock is
        held, and no wait for another process may lengthen that.
        """
        if self.kept is not None and not self.kept.reset_done():
            self.close_kept()

    def close_kept(self):
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.session.close()

    def close(self):
        """Close every session: when other code finds these in GD (of_worker)."""
        self.close_kept()
        ahead, self.ahead = self.ahead, []
        for entry in ahead:
            entry.session.close()

    def start_ahead(self, owner, upcoming):
        """Start new sessions for `owner` until one is starting or ready for each of the
        `upcoming` tasks (in the order they will be claimed; None: a task this worker does not
        know it will run): the next tasks on this worker then find a backend that has started
        while this one ran.  One for a known task starts with its settings; those started for a
        task no longer upcoming (claimed elsewhere, stopped) are closed."""
        if any(entry.owner != owner for entry in self.ahead):
            return  # those of another owner are taken or dropped first
        known = {task["id"] for task in upcoming if task is not None}
        for entry in [entry for entry in self.ahead if entry.prepared_for not in known | {None}]:
            self.ahead.remove(entry)
            entry.session.close()
        chosen_with, self.chosen_with = self.chosen_with, None
        fingerprint = chosen_with[1] if chosen_with is not None and chosen_with[0] == owner else None
        for task in upcoming:
            if len(self.ahead) >= len(upcoming):
                return
            if task is not None and any(entry.prepared_for == task["id"] for entry in self.ahead):
                continue
            fingerprint = fingerprint or self.login_fingerprint(owner)
            settings, options = settings_at_start(self.ctx, task) if task is not None else (None, None)
            try:
                session = Session(self.loopback_keywords(owner, options), wait=False)
                session.advance()  # sends the startup packet: the server starts the backend now
            except ConnectError:
                return  # the next task opens its own, and reports what goes wrong
            self.ahead.append(AheadSession(owner, fingerprint, session, settings))

    def advance_ahead(self):
        """Take the sessions being started ahead a step on, without waiting."""
        for entry in self.ahead:
            try:
                entry.session.advance()
            except ConnectError:
                entry.session.close()  # not ok any more: take_ahead drops it

    def take_ahead(self, task, fingerprint=None):
        """A session started ahead that may run the task (ahead_for; its AheadSession), if a new
        one would start the same; else None.  Those passed over (another owner's, failed, or
        started with other login settings) are closed; those started with another task's
        settings stay for it."""
        for entry in [entry for entry in self.ahead if entry.owner != task["owner"]]:
            self.ahead.remove(entry)
            entry.session.close()
        while True:
            # (One started with this task's settings runs no task after it: a RESET ALL there brought
            # this one's id and timeout back.)
            entry = self.ahead_for(task["owner"], task["id"], prepared_ok=not reuses_sessions(task))
            if entry is None:
                return None
            self.ahead.remove(entry)
            if entry.session.connecting or entry.session.open_while_idle():
                fingerprint = fingerprint or self.login_fingerprint(task["owner"])
                if entry.fingerprint == fingerprint:
                    try:
                        entry.session.wait_connected()
                    except ConnectError:
                        continue  # a failed attempt ahead of need is no task's failure: open one now
                    if entry.session.open_while_idle():  # (else it ended as it started)
                        return entry
            entry.session.close()

    def take_standby_fallbacks(self):
        """The standby tasks run here since the last look (standby_fallbacks), forgotten."""
        fallbacks, self.standby_fallbacks = self.standby_fallbacks, []
        return fallbacks

    def worker_returns(self):
        """The worker goes back to its launcher: close the sessions started ahead with a task's
        settings (it does not know which task it is given next, and they run no other), and
        forget the latest choice's login fingerprint (the next call's sessions read their own)."""
        self.chosen_with = None
        for entry in [entry for entry in self.ahead if entry.prepared_for is not None]:
            self.ahead.remove(entry)
            entry.session.close()

    def login_fingerprint(self, owner):
        """What a new session of `owner` would start with: the role's and database's
        settings (ALTER ROLE/DATABASE ... SET) and the role's login rights (task_rows.LOGIN_RIGHTS)."""
        return self.ctx.run(
            "fingerprint",
            "SELECT md5(concat_ws('|',"
            " (SELECT string_agg(s.setdatabase || ':' || s.setrole || ':' || s.setconfig::text, ','"
            "   ORDER BY s.setdatabase, s.setrole)"
            "  FROM pg_catalog.pg_db_role_setting AS s"
            "  WHERE s.setdatabase IN (0, (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()))"
            "    AND s.setrole IN (0, (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $1))),"
            f" (SELECT {LOGIN_RIGHTS} = $1))) AS f",
            ["name"],
            [owner],
        )[0]["f"]

    def open_local(self, owner, options=None):
        """A new session of `owner` in this database, waited for.  Started asynchronously, as
        the sessions ahead are: a refusal of the server (too many clients) then carries its
        SQLSTATE, whatever the language of its message (libpq.Session)."""
        session = Session(self.loopback_keywords(owner, options), wait=False)
        session.wait_connected()
        return session

    def loopback_keywords(self, owner, options=None):
        """Connection keywords of a session in this database, logged in as `owner`, with the
        startup `options` (startup_options) if any."""
        if self.loopback is None:  # fixed for a backend's life: read once
            self.loopback = self.ctx.plpy.execute(
                "SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS host,"
                "       current_setting('port') AS port, current_database() AS dbname"
            )[0]
        keywords = {
            "host": self.loopback["host"].strip() or "localhost",
            "port": self.loopback["port"],
            "dbname": self.loopback["dbname"],
            "user": owner,
            "application_name": self.ctx.name_of("task"),
            "client_encoding": TASK_CLIENT_ENCODING,
        }
        keywords["options"] = options or PLAIN_SESSION_OPTIONS
        return keywords

    def open_standby(self, owner, caught_up=False, on_wait=None):
        """A session of `owner` in this database on the launcher's standby (--standby), read-only
        as every session of a standby is, and (None, None); or None and why the task runs here, on
        the primary, instead (a kind and a sentence): the launcher gave no standby, it cannot be reached, it is not in
        recovery, or it lags more than pg_task_py.standby_max_lag (`caught_up`: it has not
        replayed all the primary has written within STANDBY_CATCH_UP_WAIT).  The conninfo's host,
        port and options are used; user, password and database are the task's own, as for a
        session here.  Connected as connect_watched says, `on_wait` as open_remote's: a standby
        that accepts connections and never answers held the worker, deaf to cancels and to a
        shutdown, for its connect_timeout (for ever at 0)."""
        conninfo = self.ctx.run("standby", "SELECT pg_catalog.current_setting('pgtaskpy.standby', true) AS s")[0]["s"]
        if not conninfo:
            return None, ("no_standby", "its launcher has no --standby")
        limit = self.ctx.run("standby_limit", "SELECT pgtaskpy.standby_max_lag() AS lag,"
                             " pg_catalog.pg_current_wal_flush_lsn()::text AS lsn,"
                             " pg_catalog.pg_current_wal_insert_lsn()::text AS written")[0]
        keywords = {"target_session_attrs": "standby", "connect_timeout": "2"}
        keywords.update(conninfo_options(conninfo))
        for secret_or_ours in ("password", "passfile", "user", "dbname"):
            keywords.pop(secret_or_ours, None)
        keywords.update(user=owner, dbname=self.loopback_keywords(owner)["dbname"],
                        application_name=self.ctx.name_of("task"), client_encoding=TASK_CLIENT_ENCODING)
        given_up = []  # (on_wait's own ConnectError, the task's cancel: no standby to fall back from)

        def watched():
            try:
                (on_wait or (lambda: None))()
            except BaseException:
                given_up.append(True)
                raise
        try:
            session = connect_watched(keywords, watched)
        except ConnectError as exc:
            if given_up:
                raise
            return None, ("unreachable", f"the standby could not be used: {first_line(exc)}")
        position = limit["written" if caught_up else "lsn"]
        allowed = 0.0 if caught_up else float(limit["lag"])
        # A standby that replays up to `position` within `allowed` seconds lagged less than that
        # when asked.  On a quiet primary, the age of the last transaction it replayed is the
        # quiet spell's: a standby streaming a few milliseconds behind the task's own insert was
        # judged 10 s and more behind, and the first standby task after a pause ran here (a probe).
        deadline = time.monotonic() + (STANDBY_CATCH_UP_WAIT if caught_up else min(allowed, STANDBY_CATCH_UP_WAIT))
        try:
            lag = session.execute(STANDBY_LAG, [position])[0][0]
            while lag is not None and float(lag) > allowed and time.monotonic() < deadline:
                time.sleep(STANDBY_CATCH_UP_STEP)
                lag = session.execute(STANDBY_LAG, [position])[0][0]
        except ConnectError as exc:
            session.close()
            return None, ("unreachable", f"the standby's session failed: {first_line(exc)}")
        if lag is not None and float(lag) <= allowed:
            session.on_standby = True  # (run_task.py: a kept one is not used once its server is promoted)
            return session, (None, None)
        session.close()
        if lag is None:
            return None, ("not_in_recovery", "the standby is not in recovery")
        if caught_up:
            return None, ("behind", f"the standby had not replayed what the primary had written when the task's"
                          f" session was asked for (its prerequisites' ends) within {STANDBY_CATCH_UP_WAIT:g} s")
        lag = float(lag)
        behind = "has replayed no transaction since it started" if lag == float("inf") else f"lags {lag:.1f} s"
        return None, ("behind", f"the standby {behind}, more than pg_task_py.standby_max_lag ({allowed:g} s)")

    def open_remote(self, task, on_wait=None):
        """The session on `remote`, under dblink's rule for roles that are not superusers:
        `remote` must carry a password of its own, and the server must ask for it.

        Otherwise a role could reach servers, this one included, through trust or
        peer authentication or the server OS user's ~/.pgpass, as someone else.

        Connected as connect_watched says.
        """
        options = conninfo_options(task["remote"])  # a malformed one connects nowhere, not even as a dbname
        packet = startup_packet_bytes(options, self.ctx.name_of("task"))
        if packet > STARTUP_PACKET_MOST:
            # (the conninfo's mistake, which no retry passes: it was retried as a network error, 08001)
            raise RemoteRefused(f"the conninfo's user, dbname, options and application_name make a startup packet of"
                                f" {packet} bytes, over the {STARTUP_PACKET_MOST} a PostgreSQL server reads",
                                BAD_REMOTE)
        if str(options.get("replication") or "off").lower() not in ("off", "false", "no", "0"):
            # (its protocol takes no parameters, which the task's settings are sent with: every
            # input failed 08P01, and was retried as a network error)
            raise RemoteRefused("a task's session cannot be a replication connection (the conninfo's replication=)",
                                BAD_REMOTE)
        checked = not self.owner_is_superuser(task["owner"])
        if checked and not options.get("password"):
            raise RemoteRefused("password is required: a remote task of a role that is not a superuser must give "
                                "password= in its conninfo", REFUSED_LOGIN)
        if checked and options.get("options"):
            self.check_remote_options(options["options"])
        if checked and (options.get("sslcert") or options.get("sslkey")):
            raise RemoteRefused("a remote task of a role that is not a superuser cannot name a client certificate"
                                " (sslcert, sslkey): its files are the server's OS user's", BAD_REMOTE)
        if checked and str(options.get("gssencmode") or "disable").lower() != "disable":
            raise RemoteRefused("a remote task of a role that is not a superuser cannot use GSSAPI encryption"
                                " (gssencmode): its credentials are the server's OS user's", BAD_REMOTE)
        keywords = remote_keywords(task["remote"], options, self.remote_defaults(task["owner"], options),
                                   self.ctx.name_of("task"), own_credentials=checked)
        session = connect_watched(keywords, on_wait)
        if checked and not session.used_password:
            session.close()
            raise RemoteRefused("password is required: the remote server did not ask for the password given",
                                REFUSED_LOGIN)
        return session

    def check_remote_options(self, text):
        """A remote conninfo's `options` of a role that is not a superuser: `-c name=value` (or
        `--name=value`) of settings any role may set only.  The rule above is checked once the
        session has logged in, and a server that lets the login through unasked (trust, peer)
        applied the options first, as whoever the conninfo named: `-c session_preload_libraries=`
        loaded any file as a library in a superuser's backend.  RemoteRefused (22023) otherwise."""
        names, words, word, escaped = [], [], "", False
        for char in text + " ":  # (libpq's split: spaces apart, a backslash keeps the next character)
            if escaped:
                word, escaped = word + char, False
            elif char == "\\":
                escaped = True
            elif char.isspace():
                if word:
                    words.append(word)
                word = ""
            else:
                word += char
        while words:
            word = words.pop(0)
            if word == "-c" and words:
                word = words.pop(0)
            elif word.startswith("-c"):
                word = word[2:]
            elif word.startswith("--"):
                word = word[2:]
            else:
                names.append(None)
                continue
            names.append(word.split("=", 1)[0].replace("-", "_").lower() if "=" in word else None)
        # (each word's own false: bool_and skips NULLs, and one -c of work_mem let a `-Pc
        # session_preload_libraries=...` beside it through, which the server's getopt reads as -c)
        allowed = self.ctx.run("user_settings", "SELECT coalesce(bool_and(coalesce(s.context = 'user', false)), false)"
                               " AS ok"
                               " FROM unnest($1::text[]) AS n(name) LEFT JOIN pg_catalog.pg_settings AS s"
                               " ON s.name = n.name", ["text[]"], [names])[0]["ok"]
        if not names or not allowed:
            raise RemoteRefused("the conninfo's options may only set settings any role may (-c name=value, "
                                "pg_settings.context 'user') in a remote task of a role that is not a superuser",
                                BAD_REMOTE)

    def remote_defaults(self, owner, options):
        """What a `remote` conninfo leaves out, as keywords that go before it (its own override
        them): the task's owner as `user`, and this server's socket and port when it names no
        host.  libpq's defaults were the server's OS user, a superuser (`remote => 'dbname=app'`
        of a role ran as postgres), and a socket and port that are not this server's unless it
        was built with them.  A conninfo that names a `service` keeps the service file's."""
        if "service" in options:
            return {}
        defaults = {} if options.get("user") else {"user": owner}
        if not options.get("host") and not options.get("hostaddr"):
            local = self.loopback_keywords(owner)
            defaults["host"] = local["host"]
            defaults["port"] = options.get("port") or local["port"]
        return defaults

    def owner_is_superuser(self, owner):
        rows = self.ctx.run("superuser", "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1",
                            ["name"], [owner])
        return bool(rows and rows[0]["rolsuper"])


def remote_keywords(remote, options, defaults, application_name, own_credentials):
    """The connection keywords of a remote session: `defaults` (remote_defaults), the conninfo
    `remote` (its `options`, parsed), then what overrides it.  A default the conninfo sets empty
    (`user=''`) goes after it: libpq reads an empty value as none, and `user=''` logged in as the
    server's OS user, not the task's owner.  `own_credentials` (a role that is not a superuser):
    no client certificate, where libpq sent the server OS user's ~/.postgresql/postgresql.crt,
    and a server that asks for a certificate and a password took that one for the role's; and
    no GSSAPI encryption, which libpq set up with the server OS user's Kerberos credentials."""
    emptied = {name: value for name, value in defaults.items() if options.get(name) == ""}
    keywords = {**{name: value for name, value in defaults.items() if name not in emptied},
                "dbname": remote, **emptied,
                "fallback_application_name": application_name,
                "client_encoding": TASK_CLIENT_ENCODING}  # (after dbname: it overrides the conninfo's)
    if own_credentials:
        keywords.update(sslcert=NO_CLIENT_CERTIFICATE, gssencmode="disable")
    return keywords


def first_line(exc):
    """An error's first line: libpq's go on with details and hints."""
    return (str(exc).strip().splitlines() or [""])[0]
