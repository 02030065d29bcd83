"""A small libpq client for the worker, loaded with ctypes.

Why libpq and not SPI or dblink: a task's input must arrive at a backend as
one top-level simple query (so VACUUM, CREATE DATABASE and procedures that
COMMIT work, as in pg_task), and every result of a multi-statement input must
be read with its column names and types.  SPI sees only the last result and
never runs at top level; dblink_get_result needs the column list in advance.
libpq is on every PostgreSQL server (dblink links it), so no package is needed.
"""

import ctypes
import select
import time


def _load_libpq():
    """libpq by its soname, as dblink links it.  ctypes.util only if that fails: importing
    it slows a worker's first call (bench/RESULTS.md), and find_library runs ldconfig in a subprocess."""
    try:
        return ctypes.CDLL("libpq.so.5")
    except OSError:
        from ctypes import util  # noqa: PLC0415

        return ctypes.CDLL(util.find_library("pq") or "libpq.so")


_lib = _load_libpq()

_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int


def _fn(name, restype, *argtypes):
    function = getattr(_lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


PQconnectdbParams = _fn("PQconnectdbParams", _P, ctypes.POINTER(_S), ctypes.POINTER(_S), _I)
PQconnectStartParams = _fn("PQconnectStartParams", _P, ctypes.POINTER(_S), ctypes.POINTER(_S), _I)
PQconnectPoll = _fn("PQconnectPoll", _I, _P)
PQstatus = _fn("PQstatus", _I, _P)
PQerrorMessage = _fn("PQerrorMessage", _S, _P)
PQfinish = _fn("PQfinish", None, _P)
PQbackendPID = _fn("PQbackendPID", _I, _P)
PQsocket = _fn("PQsocket", _I, _P)
PQsendQuery = _fn("PQsendQuery", _I, _P, _S)
PQsendQueryParams = _fn(
    "PQsendQueryParams", _I, _P, _S, _I, _P, ctypes.POINTER(_S), _P, _P, _I
)
PQconsumeInput = _fn("PQconsumeInput", _I, _P)
PQnotifies = _fn("PQnotifies", _P, _P)
PQisBusy = _fn("PQisBusy", _I, _P)
PQgetResult = _fn("PQgetResult", _P, _P)
PQsetSingleRowMode = _fn("PQsetSingleRowMode", _I, _P)
PQresultStatus = _fn("PQresultStatus", _I, _P)
PQntuples = _fn("PQntuples", _I, _P)
PQnfields = _fn("PQnfields", _I, _P)
PQbinaryTuples = _fn("PQbinaryTuples", _I, _P)
PQfname = _fn("PQfname", _P, _P, _I)
PQftype = _fn("PQftype", ctypes.c_uint, _P, _I)
PQgetvalue = _fn("PQgetvalue", _P, _P, _I, _I)
PQgetlength = _fn("PQgetlength", _I, _P, _I, _I)
PQgetisnull = _fn("PQgetisnull", _I, _P, _I, _I)
PQcmdStatus = _fn("PQcmdStatus", _P, _P)
PQresultErrorField = _fn("PQresultErrorField", _P, _P, _I)
PQclear = _fn("PQclear", None, _P)
PQtransactionStatus = _fn("PQtransactionStatus", _I, _P)
PQputCopyEnd = _fn("PQputCopyEnd", _I, _P, _S)
PQgetCopyData = _fn("PQgetCopyData", _I, _P, ctypes.POINTER(_P), _I)
PQfreemem = _fn("PQfreemem", None, _P)
PQconnectionUsedPassword = _fn("PQconnectionUsedPassword", _I, _P)
PQgetCancel = _fn("PQgetCancel", _P, _P)
PQcancel = _fn("PQcancel", _I, _P, _S, _I)
PQfreeCancel = _fn("PQfreeCancel", None, _P)
PQparameterStatus = _fn("PQparameterStatus", _P, _P, _S)
NoticeReceiver = ctypes.CFUNCTYPE(None, _P, _P)


class PQconninfoOption(ctypes.Structure):
    _fields_ = [("keyword", _S), ("envvar", _S), ("compiled", _S), ("val", _S),
                ("label", _S), ("dispchar", _S), ("dispsize", _I)]


PQconninfoParse = _fn("PQconninfoParse", ctypes.POINTER(PQconninfoOption), _S, ctypes.POINTER(_P))
PQconninfoFree = _fn("PQconninfoFree", None, ctypes.POINTER(PQconninfoOption))
PQconndefaults = _fn("PQconndefaults", ctypes.POINTER(PQconninfoOption))
PQconninfo = _fn("PQconninfo", ctypes.POINTER(PQconninfoOption), _P)
PQsetNoticeReceiver = _fn("PQsetNoticeReceiver", _P, _P, NoticeReceiver, _P)
PQsetErrorVerbosity = _fn("PQsetErrorVerbosity", _I, _P, _I)

CONNECTION_OK, CONNECTION_BAD = 0, 1
PGRES_POLLING_FAILED, PGRES_POLLING_READING, PGRES_POLLING_WRITING, PGRES_POLLING_OK = 0, 1, 2, 3
PGRES_EMPTY_QUERY, PGRES_COMMAND_OK, PGRES_TUPLES_OK = 0, 1, 2
PGRES_COPY_OUT, PGRES_COPY_IN = 3, 4
PGRES_FATAL_ERROR = 7
PGRES_COPY_BOTH, PGRES_SINGLE_TUPLE = 8, 9
PQTRANS_INTRANS, PQTRANS_INERROR = 2, 3
PQERRORS_DEFAULT, PQERRORS_VERBOSE = 1, 2

# What PQERRORS_VERBOSE adds to a server's error: its SQLSTATE after the severity, and a line
# with the function, file and line that raised it (both labels in the server's language).
_VERBOSE_SQLSTATE = r"(\S:  )([0-9A-Z]{5}): "
_VERBOSE_LOCATION = r"\n[^\n]*:  [^\n]*, [^\n]*\.c:[0-9]+$"

# Error fields, from postgres_ext.h.
PG_DIAG_SEVERITY = ord("S")
PG_DIAG_SEVERITY_NONLOCALIZED = ord("V")
PG_DIAG_MESSAGE_PRIMARY = ord("M")
PG_DIAG_MESSAGE_DETAIL = ord("D")
PG_DIAG_MESSAGE_HINT = ord("H")
PG_DIAG_CONTEXT = ord("W")
PG_DIAG_STATEMENT_POSITION = ord("P")
PG_DIAG_INTERNAL_POSITION = ord("p")
PG_DIAG_INTERNAL_QUERY = ord("q")
PG_DIAG_SQLSTATE = ord("C")


def _text(pointer, length=None, codec="utf-8", errors="replace"):
    """Decode a C string from libpq; invalid text is kept visible, never fatal."""
    if not pointer:
        return None
    raw = ctypes.string_at(pointer, length) if length is not None else ctypes.string_at(pointer)
    return raw.decode(codec, errors)


# Python's codec of each encoding a task may switch its session to (SET client_encoding): the
# server then sends that encoding, and reads what it is sent as that encoding.  A session starts
# in UTF-8 (sessions.py).  Python has no codec of EUC_TW (nor of MULE_INTERNAL, which the server
# does not send): a task's results in it are read as UTF-8, and converted by the server once the
# input has ended (run_task.py, InputResults.end).
_CODECS = {
    "UTF8": "utf-8", "SQL_ASCII": "utf-8", "LATIN1": "latin-1", "LATIN2": "iso8859-2", "LATIN3": "iso8859-3",
    "LATIN4": "iso8859-4", "LATIN5": "iso8859-9", "LATIN6": "iso8859-10", "LATIN7": "iso8859-13",
    "LATIN8": "iso8859-14", "LATIN9": "iso8859-15", "LATIN10": "iso8859-16", "ISO_8859_5": "iso8859-5",
    "ISO_8859_6": "iso8859-6", "ISO_8859_7": "iso8859-7", "ISO_8859_8": "iso8859-8", "WIN866": "cp866",
    "WIN874": "cp874", "WIN1250": "cp1250", "WIN1251": "cp1251", "WIN1252": "cp1252", "WIN1253": "cp1253",
    "WIN1254": "cp1254", "WIN1255": "cp1255", "WIN1256": "cp1256", "WIN1257": "cp1257", "WIN1258": "cp1258",
    "KOI8R": "koi8-r", "KOI8U": "koi8-u", "SJIS": "cp932", "SHIFT_JIS_2004": "shift_jis_2004",
    "EUC_JP": "euc_jp", "EUC_JIS_2004": "euc_jis_2004", "EUC_KR": "euc_kr", "EUC_CN": "gb2312", "GBK": "gbk",
    "GB18030": "gb18030", "BIG5": "big5", "UHC": "cp949", "JOHAB": "johab",
}


class ConnectError(Exception):
    """The task's session could not be opened or used: libpq's message, and the server's
    SQLSTATE and severity when the server sent the error (None: libpq's own, the connection
    broke; its severity ERROR).  The server's end of a session is FATAL."""

    def __init__(self, message, sqlstate=None, severity=None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.severity = severity or "ERROR"


class RemoteRefused(ConnectError):
    """A remote session refused by the rules of sessions.py's open_remote, which no retry can
    pass: the task fails with its SQLSTATE, not retried as a network error (08001)."""


def _without_sqlstate(message):
    """(the message as libpq's default verbosity writes it, the SQLSTATE) of a verbose one; a
    message that carries none comes back as it is, with None."""
    import re  # noqa: PLC0415 (here, on a failed connect only: importing re costs a new worker 10 ms)

    found = re.search(_VERBOSE_SQLSTATE, message)
    if found is None:
        return message, None
    message = message[:found.end(1)] + message[found.end():]
    return re.sub(_VERBOSE_LOCATION, "", message, flags=re.MULTILINE), found.group(2)


# The server's words as it ends a session for being idle (idle_session_timeout, 57P05): when its
# FATAL comes as the worker writes to the session, libpq keeps only the words, no SQLSTATE, and the
# task read as a run lost while it ran (08006, FAIL), though its input never ran.
_IDLE_ENDED_WORDS = "terminating connection due to idle-session timeout"


_ENDED_BY_THE_SERVER = ("57P05", "57P01", "57P02")  # idle_session_timeout, pg_terminate_backend, shutdown


def lost_sqlstate(message, sqlstate=None):
    """The SQLSTATE of a session that broke with libpq's `message` and no result of the server's:
    57P05 when the server had ended it for being idle (the query never ran), 57P01 or 57P02 when
    a DBA's pg_terminate_backend or a shutdown did (as a result of the server's says, when one
    came: it was taken for a lost connection, 08006), else None.  Told by the SQLSTATE in libpq's
    verbose words (Session.error), in any language; else, from a session whose words are not
    verbose (a remote one connected by libpq's blocking call), by English ones for 57P05."""
    if sqlstate in _ENDED_BY_THE_SERVER:
        return sqlstate
    return "57P05" if _IDLE_ENDED_WORDS in message else None


class MalformedConninfo(ConnectError):
    """A conninfo that libpq cannot parse (PQconninfoParse's message): nothing was connected."""


def conninfo_options(conninfo):
    """The options a conninfo string or URI sets, {keyword: value}; ConnectError if it is malformed."""
    if _uri_with_unencoded_userinfo(conninfo):
        raise MalformedConninfo("a URI's user or password holds \"@\" or \"/\": write them percent-encoded"
                                " (%40, %2F)")
    error = _P()
    options = PQconninfoParse(conninfo.encode(), ctypes.byref(error))
    if not options:
        message = _text(error.value) if error.value else "out of memory"
        if error.value:
            PQfreemem(error)
        raise MalformedConninfo(_without_conninfo_text((message or "invalid connection string").strip(), conninfo))
    return _options_set(options)


def _uri_with_unencoded_userinfo(conninfo):
    """Whether a URI has "@" after its first "@" or "/" before it, in its part before "?": a password
    with "@" or "/" not percent-encoded, which libpq reads as part of the host or as a port
    ('postgresql://u:Se@cret@db/x', host "cret@db"), and whose piece its error then quotes, into the
    task's `error` and the launcher's log.  (A "@" in the database's name must be encoded too.)"""
    scheme, found, rest = conninfo.strip().partition("://")
    if not found or scheme not in ("postgresql", "postgres"):
        return False
    rest = rest.split("?", 1)[0]
    at = rest.find("@")
    return at >= 0 and ("@" in rest[at + 1:] or "/" in rest[:at])


def _without_conninfo_text(message, conninfo):
    """libpq's message of a malformed conninfo, each quoted piece of the conninfo in it (the
    whole URI, or a word: a password, perhaps) as "...", but for the keywords libpq knows and
    punctuation ("]"): the message goes into the task's `error`, which must hold no password.

    libpq quotes a piece as it is, quotes inside it too: from each quote, the piece hidden is
    the longest the conninfo holds (a password `p"SECRET` left `SECRET"` in the error when
    pieces ended at the next quote).  A URI's pieces are quoted percent-decoded too: `My%21Secret`
    as `My!Secret`."""
    from urllib.parse import unquote  # noqa: PLC0415 (here, on a malformed conninfo only)

    keywords = set(_options_set(PQconndefaults(), every=True))
    decoded = unquote(conninfo)

    def told(piece):
        return ((len(piece) == 1 and not piece.isalnum()) or piece in keywords
                or piece not in conninfo and piece not in decoded)

    lines = []
    for line in message.split("\n"):
        quotes = [at for at, char in enumerate(line) if char == '"']
        kept, done, index = [], 0, 0
        while index < len(quotes):
            start = quotes[index]
            end = next((later for later in range(len(quotes) - 1, index, -1)
                        if not told(line[start + 1:quotes[later]])), None)
            if end is None:
                index += 1
                continue
            kept.append(line[done:start] + '"..."')
            done, index = quotes[end] + 1, end + 1
        lines.append("".join(kept) + line[done:])
    return "\n".join(lines)


def _options_set(options, every=False):
    """{keyword: value} of a PQconninfoOption array's options that have a value (`every`: all,
    a value or None); frees the array."""
    try:
        found = {}
        i = 0
        while options[i].keyword is not None:
            if options[i].val is not None or every:
                value = options[i].val
                found[options[i].keyword.decode()] = None if value is None else value.decode("utf-8", "replace")
            i += 1
        return found
    finally:
        PQconninfoFree(options)


MOST_STARTUP_OPTIONS = 2000  # characters: a startup packet holds 10,000 bytes in all


def startup_options(settings):
    """`settings` ({name: value}) as the `options` connection keyword, `-c name=value` each,
    which the server sets as the session starts: no statement, and no round trip.  The server
    splits the options at spaces and reads a backslash as "the next character as it is", so
    every character but a letter, digit, `_` or `.` gets one.  None when they cannot go there:
    a value that is not ASCII (the server reads these bytes in no client encoding) or options
    too long for a startup packet."""
    options = " ".join(f"-c {_escaped_option(name)}={_escaped_option(value)}" for name, value in settings.items())
    if not options.isascii() or len(options) > MOST_STARTUP_OPTIONS:
        return None
    return options


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.")


def _escaped_option(text):
    # (most names and values need none, and a session is started for every one-off task)
    if _PLAIN.issuperset(text):
        return text
    return "".join(char if char in _PLAIN else "\\" + char for char in text)


def connect_timeout_seconds(value):
    """libpq's reading of connect_timeout (which its asynchronous connect leaves to the caller):
    None (no limit) when unset or at most 0, else at least 2 seconds; ConnectError, with libpq's
    message, when it is not a whole number."""
    if value is None or not value.strip():
        return None
    try:
        seconds = int(value)
    except ValueError:
        raise ConnectError(f'invalid integer value "{value}" for connection option "connect_timeout"') from None
    return max(seconds, 2) if seconds > 0 else None


class Result:
    """One PGresult, freed when the with-block ends."""

    def __init__(self, handle, codec="utf-8"):
        self.handle = handle
        self.codec = codec  # of the session's client_encoding when the result came

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        PQclear(self.handle)

    @property
    def status(self):
        return PQresultStatus(self.handle)

    # `escaped`: the bytes that are not text in the codec are kept as lone surrogates
    # (surrogateescape), for output.settled to read again once the session's encoding is known.

    def field(self, code, escaped=False):
        return _text(PQresultErrorField(self.handle, code), None, self.codec,
                     "surrogateescape" if escaped else "replace")

    def columns(self, escaped=False):
        errors = "surrogateescape" if escaped else "replace"
        return [
            (_text(PQfname(self.handle, c), None, self.codec, errors), PQftype(self.handle, c))
            for c in range(PQnfields(self.handle))
        ]

    def rows(self, escaped=False):
        """Each row as a list of str, None for NULL."""
        handle, codec, errors = self.handle, self.codec, "surrogateescape" if escaped else "replace"
        ncolumns = PQnfields(handle)
        for r in range(PQntuples(handle)):
            yield [
                None
                if PQgetisnull(handle, r, c)
                else _text(PQgetvalue(handle, r, c), PQgetlength(handle, r, c), codec, errors)
                for c in range(ncolumns)
            ]

    def command_tag(self):
        return _text(PQcmdStatus(self.handle), codec=self.codec) or ""

    @property
    def binary(self):
        """Whether a COPY's data comes in its binary format."""
        return bool(PQbinaryTuples(self.handle))


def _connect_beside(arrays, on_wait, wait_step):
    """PQconnectdbParams in a thread of its own, and `on_wait` (which acts on this backend's
    interrupts, and raises to give the attempt up) every `wait_step` seconds meanwhile; the new
    connection's handle.  libpq's blocking connect is the one that gives each of several hosts
    its connect_timeout, and in this backend's thread it was deaf to cancels and terminates: a
    task author's ten hosts that never answer, with connect_timeout=60, held a worker, and a fast
    shutdown of the server, ten minutes.  A connection given up is closed by its thread once
    libpq returns; the backend's exit ends the thread."""
    import threading  # noqa: PLC0415 (here, on a several-hosts connect only: a new worker's first call)

    box = {"handle": None, "given_up": False}
    guard = threading.Lock()
    done = threading.Event()

    def attempt():
        handle = PQconnectdbParams(*arrays)
        with guard:
            if box["given_up"]:
                PQfinish(handle)
            else:
                box["handle"] = handle
        done.set()

    threading.Thread(target=attempt, name="pg_task_py connect", daemon=True).start()
    while not done.wait(wait_step):
        try:
            on_wait()
        except BaseException:
            with guard:
                box["given_up"] = True
                if box["handle"] is not None:  # (it returned just now)
                    PQfinish(box["handle"])
            raise
    return box["handle"]


class Session:
    """A libpq connection that runs one query at a time and yields its results."""

    def __init__(self, keywords, wait=True, on_wait=None, wait_step=1.0):
        """Connect; with wait=False only start to, and let advance()/wait_connected() go on.
        With `on_wait`, libpq's blocking connect runs beside this backend, which runs on_wait
        every `wait_step` seconds meanwhile (_connect_beside).

        A new backend takes milliseconds to start, most of them in the server:
        a session started early is ready by the time a task needs it.
        """
        keys = [k.encode() for k in keywords] + [None]
        values = [str(v).encode() for v in keywords.values()] + [None]
        arrays = ((_S * len(keys))(*keys), (_S * len(values))(*values), 1)
        if wait and on_wait is not None:
            self.handle = _connect_beside(arrays, on_wait, wait_step)
        else:
            self.handle = (PQconnectdbParams if wait else PQconnectStartParams)(*arrays)
        if not self.handle:
            raise ConnectError("out of memory")
        self.broke_with = None  # libpq's words for the break, when the connection broke mid-answer (_broke)
        self.notices = []
        self.notice_room = None  # characters the notices may still take (limit_notices); None: no limit
        self.notice_limit = 0
        self.answered = True  # no query sent, or every result of the last one read
        self.cancelled_at = None  # time.monotonic() of the first cancel of the query sent last
        self.on_standby = False  # opened on a standby (TaskSessions.open_standby)
        self.ended = None  # (message, SQLSTATE) of the server's FATAL that came while the session was idle
        # Kept on self: ctypes must not collect the callback while libpq holds it.  Set before
        # the attempt is taken on: the server's end of a session that waited connected before
        # this code read its last step (a burst's worker busy elsewhere) is read with that step,
        # and would go to libpq's default, stderr, not to `ended`.
        self._receiver = NoticeReceiver(self._on_notice)
        PQsetNoticeReceiver(self.handle, self._receiver, None)
        self._polling = None if wait else PGRES_POLLING_WRITING
        if not wait:
            # A server's error before the session is open (too many clients, starting up) comes
            # as text in the server's language (lc_messages): verbose, it carries its SQLSTATE.
            PQsetErrorVerbosity(self.handle, PQERRORS_VERBOSE)
        if wait or PQstatus(self.handle) == CONNECTION_BAD:
            self._connected()

    def _connected(self):
        """Raise libpq's message if the connection failed (with the server's SQLSTATE, when it
        sent the error to an attempt started with wait=False); else make the session usable."""
        self._polling = None
        if PQstatus(self.handle) != CONNECTION_OK:
            message, sqlstate = _without_sqlstate(_text(PQerrorMessage(self.handle)).strip())
            self.close()
            raise ConnectError(message, sqlstate)
        # Verbose from here on too: an error libpq keeps as words only (the server's end of the
        # session, come as the worker writes to it) carries its SQLSTATE in them (Session.error).
        # The task's own errors are read from their fields, which the verbosity leaves as they are.
        PQsetErrorVerbosity(self.handle, PQERRORS_VERBOSE)

    def advance(self, timeout=0.0):
        """Take the connection attempt a step on if its socket is ready; True once it is done."""
        while self._polling is not None:
            socket = PQsocket(self.handle)
            reading = self._polling == PGRES_POLLING_READING
            ready = select.select([socket] if reading else [], [] if reading else [socket], [], timeout)
            if not ready[0] and not ready[1]:
                return False
            self._polling = PQconnectPoll(self.handle)
            if self._polling in (PGRES_POLLING_OK, PGRES_POLLING_FAILED):
                self._connected()
        return True

    def wait_connected(self, timeout=60.0, on_wait=None, wait_step=1.0):
        """Wait until the connection attempt ends; ConnectError if it failed, or if it took
        `timeout` seconds (None: no limit).  `on_wait` runs every `wait_step` seconds meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = wait_step if on_wait is not None else (timeout if deadline is not None else None)
            if deadline is not None:
                step = min(step, max(0.0, deadline - time.monotonic()))
            if self.advance(step) or self._polling is None:
                return
            if deadline is not None and time.monotonic() >= deadline:
                self.close()
                raise ConnectError("timeout expired while connecting")
            if on_wait is not None:
                try:
                    on_wait()
                except BaseException:
                    self.close()  # the attempt is given up
                    raise

    def effective_options(self):
        """The options this connection uses ({keyword: value}), its conninfo's and those libpq took
        from the environment or a service file."""
        options = PQconninfo(self.handle)
        if not options:
            return {}
        return _options_set(options)

    def _on_notice(self, _arg, handle):
        # libpq frees the notice's PGresult when this returns: copy the text now.
        notice = Result(handle, self.codec)
        if notice.field(PG_DIAG_SEVERITY_NONLOCALIZED) in ("FATAL", "PANIC"):
            # The server's end of the session, come while no query ran: libpq passes an error
            # there to the notice receiver.  Raised by the next send, not a notice of a task.
            self.ended = (notice.field(PG_DIAG_MESSAGE_PRIMARY), notice.field(PG_DIAG_SQLSTATE),
                          notice.field(PG_DIAG_SEVERITY))
            return
        if self.notice_room is not None and self.notice_room <= 0:
            return  # (past the limit: dropped, and said so once)
        # (escaped: read again once the query has ended, as its output is: output.settled)
        # A line break inside a field continues on a line that starts with a tab, as in the server
        # log and in `error` (output.with_tabs): a message's own lines cannot pass for more notices.
        lines = [f"{notice.field(PG_DIAG_SEVERITY) or 'NOTICE'}:  {notice.field(PG_DIAG_MESSAGE_PRIMARY, True)}"]
        for label, code in (("DETAIL", PG_DIAG_MESSAGE_DETAIL), ("HINT", PG_DIAG_MESSAGE_HINT)):
            value = notice.field(code, True)
            if value:
                lines.append(f"{label}:  {value}")
        text = "\n".join(line.replace("\n", "\n\t") for line in lines)
        if self.notice_room is not None:
            self.notice_room -= len(text) + 1
            if self.notice_room < 0:
                text = f"(notices past {self.notice_limit} characters dropped: pg_task_py.output_limit)"
        self.notices.append(text)

    def limit_notices(self, limit):
        """Collect the notices of the next query anew, at most `limit` characters of them (0: no
        limit): a task's RAISE NOTICE in a loop must not fill the worker's memory and its row."""
        self.notices.clear()
        self.notice_limit = limit
        self.notice_room = limit or None

    def close(self):
        self._polling = None  # a closed attempt is over: advance() must not poll a freed handle
        if self.handle:
            PQfinish(self.handle)
            self.handle = None

    @property
    def ok(self):
        """Connected (or still connecting) and not broken."""
        return bool(self.handle) and (self._polling is not None or PQstatus(self.handle) == CONNECTION_OK)

    def open_while_idle(self):
        """Whether a session that has been idle (started ahead, or kept between tasks) is still
        open.  A server that ends a session on its own (idle_session_timeout, pg_terminate_backend,
        a shutdown) sends its error and closes the socket, which libpq reads only at the next
        query: the task sent there would fail without having run.  An idle session has nothing
        to read, so anything waiting on its socket means it is, or may be, gone: it is closed
        here, and the task takes another.  So does a FATAL that libpq read already, with the last
        answer of the connection's start (ended just as it started, before its worker read that
        answer): parsed here, it goes to _on_notice.  What is waiting is read, though: a
        notification for a `save` session that LISTENs is no end (it was taken for one, and the
        session's state lost), and is dropped.  Never waits."""
        if not self.ok or self._polling is not None:
            return self.ok
        readable, _, _ = select.select([PQsocket(self.handle)], [], [], 0)
        if readable and not PQconsumeInput(self.handle):  # (the server closed it)
            self.close()
            return False
        self.drop_notifications()  # (parses what libpq holds, FATAL included)
        PQisBusy(self.handle)
        if self.ended is not None or PQstatus(self.handle) != CONNECTION_OK:
            self.close()
        return self.ok

    @property
    def connecting(self):
        """Still connecting: advance() takes the attempt on."""
        return self._polling is not None

    @property
    def socket(self):
        """The socket to wait on, and whether for writing (else for reading)."""
        return PQsocket(self.handle), self._polling == PGRES_POLLING_WRITING

    @property
    def pid(self):
        return PQbackendPID(self.handle)

    @property
    def used_password(self):
        return bool(PQconnectionUsedPassword(self.handle))

    @property
    def transaction_status(self):
        return PQtransactionStatus(self.handle)

    def error(self):
        """libpq's last error: (its words as its default verbosity writes them, the server's
        SQLSTATE in them or None)."""
        words = self.broke_with or _text(PQerrorMessage(self.handle)) or ""
        # (libpq starts the lines after a message's first with a tab; error texts add their own)
        message = "\n".join(line.lstrip("\t") for line in words.strip().split("\n"))
        return _without_sqlstate(message) if message else ("", None)

    def cancel(self):
        """Ask the server to cancel the running query (safe from any thread).  Not while the
        session still connects: it has no backend's pid yet, and the server logged the request
        ('PID 0 in cancel request did not match any process')."""
        if not self.handle or not PQbackendPID(self.handle):
            return
        cancel = PQgetCancel(self.handle)
        if cancel:
            buffer = ctypes.create_string_buffer(256)
            PQcancel(cancel, buffer, 256)
            PQfreeCancel(cancel)
            if self.cancelled_at is None:
                self.cancelled_at = time.monotonic()

    @property
    def encoding(self):
        """The session's client_encoding now: a task may SET it, and the server then writes and
        reads that encoding (libpq follows it, the server reports each change)."""
        name = PQparameterStatus(self.handle, b"client_encoding") if self.handle else None
        return ctypes.string_at(name).decode("ascii", "replace") if name else "UTF8"

    @property
    def in_hot_standby(self):
        """The server's in_hot_standby as it last reported it ('on' on a standby): a standby's
        promotion reaches a session with the answer to its next query."""
        value = PQparameterStatus(self.handle, b"in_hot_standby") if self.handle else None
        return ctypes.string_at(value).decode("ascii", "replace") if value else None

    @property
    def server_encoding(self):
        """The database's encoding, as its server reports it."""
        name = PQparameterStatus(self.handle, b"server_encoding") if self.handle else None
        return ctypes.string_at(name).decode("ascii", "replace") if name else "UTF8"

    @property
    def codec(self):
        """Python's codec of the session's client_encoding (UTF-8 for EUC_TW, which has none).
        SQL_ASCII converts nothing: the server sends the database's own bytes, read in the
        database's encoding (UTF-8 in a SQL_ASCII database, whose bytes are in no encoding)."""
        encoding = self.encoding
        if encoding == "SQL_ASCII":
            encoding = self.server_encoding
        return _CODECS.get(encoding, "utf-8")

    @property
    def has_codec(self):
        return self.encoding in _CODECS

    def send(self, query, params=None):
        self._raise_if_ended()
        self.cancelled_at = None
        codec = self.codec
        try:
            encoded = query.encode(codec)
            values = None if params is None else [None if p is None else str(p).encode(codec) for p in params]
        except UnicodeEncodeError as exc:  # (PostgreSQL's untranslatable_character)
            raise ConnectError(f"character {exc.object[exc.start:exc.end]!r} has no equivalent in the session's"
                               f" client_encoding ({codec}), which a task before this one set", "22P05") from None
        if params is None:
            sent = PQsendQuery(self.handle, encoded)
        else:
            sent = PQsendQueryParams(
                self.handle, encoded, len(values), None,
                (_S * len(values))(*values), None, None, 0,
            )
        if not sent:
            message, sqlstate = self.error()
            raise ConnectError(message, lost_sqlstate(message, sqlstate))
        self.answered = False
        # One row at a time keeps a worker's memory flat on huge results.
        PQsetSingleRowMode(self.handle)

    def _raise_if_ended(self):
        """ConnectError with the server's own error and SQLSTATE when the server has ended this
        session while it was idle, rather than write to its closed socket: libpq, writing there,
        can lose what the server said first, and reports "server closed the connection
        unexpectedly", which cannot tell idle_session_timeout (57P05: the query never ran) from
        a session that broke while a task ran.  Never waits."""
        if self.ended is None and self.answered and self.handle and self._polling is None:
            if select.select([PQsocket(self.handle)], [], [], 0)[0]:
                PQconsumeInput(self.handle)
                PQisBusy(self.handle)  # parses what came: the server's FATAL goes to _on_notice
        if self.ended is not None:
            self.close()
            raise ConnectError(*self.ended)

    def results(self, on_wait=None, wait_step=1.0):
        """Yield each PGresult of the query sent last, until libpq has none left.

        Waits on the socket rather than in libpq, so that `on_wait` runs every
        `wait_step` seconds while the query runs.
        """
        codec = self.codec  # (a change by the query itself is reported only as it ends: output.settled)
        while True:
            while PQisBusy(self.handle):
                readable, _, _ = select.select([PQsocket(self.handle)], [], [], wait_step)
                if not readable:
                    if on_wait is not None:
                        on_wait()
                    continue
                if not PQconsumeInput(self.handle):
                    self._broke()
                    break
                self.drop_notifications()
            handle = PQgetResult(self.handle)
            if not handle:
                self.answered = True
                return
            yield Result(handle, codec)

    def arrived_results(self):
        """Yield each result of the query sent last that has arrived, without waiting for more
        (a worker running several tasks waits on all their sockets at once); `answered` once
        the query has no result left."""
        broken = not PQconsumeInput(self.handle)  # then libpq has its error result at once
        if broken:
            self._broke()
        self.drop_notifications()
        codec = self.codec
        while broken or not PQisBusy(self.handle):
            handle = PQgetResult(self.handle)
            if not handle:
                self.answered = True
                return
            yield Result(handle, codec)

    def drop_notifications(self):
        """Free the notifications libpq has read for the session (a task that LISTENs and
        NOTIFYs itself): no one reads them, and libpq keeps each until asked.  Kept while the
        input ran, 30,000 of 8 kB grew the worker by 230 MB, past pg_task_py.output_limit,
        in a backend that runs every role's tasks (a probe)."""
        while notify := PQnotifies(self.handle):
            PQfreemem(notify)

    def _broke(self):
        """Keep libpq's words for a connection that broke as its answer was read: the
        PQgetResult that follows waits on the closed socket, and adds "invalid socket" to them."""
        self.broke_with = _text(PQerrorMessage(self.handle))

    def refuse_copy_in(self):
        """End a COPY FROM STDIN the task started with an error: the server fails the COPY, and
        the input's implicit transaction with it (a task has no client to stream from)."""
        PQputCopyEnd(self.handle, b"COPY FROM STDIN is not supported")

    def copy_data(self):
        """Yield each row (bytes) of a COPY TO STDOUT in progress, until the COPY has ended; its
        end, or its error, is the query's next result.  Waits in libpq: a COPY's rows come as
        fast as the server reads them."""
        buffer = _P()
        while True:
            size = PQgetCopyData(self.handle, ctypes.byref(buffer), 0)
            if size < 0:  # -1: the COPY is done; -2: the connection failed (the next result says so)
                return
            try:
                data = ctypes.string_at(buffer, size)
            finally:
                PQfreemem(buffer)
            yield data

    def execute(self, query, params=None):
        """Run a query of the worker's own and raise on error; return the last rows."""
        self.send(query, params)
        return self.collect()

    def collect(self):
        """The rows of the query sent last (by send); ConnectError if it failed."""
        rows, error, sqlstate, severity = [], None, None, None
        for result in self.results():
            with result:
                if result.status == PGRES_FATAL_ERROR:
                    words, verbose_sqlstate = self.error()
                    error = result.field(PG_DIAG_MESSAGE_PRIMARY) or words
                    sqlstate = result.field(PG_DIAG_SQLSTATE) or lost_sqlstate(words, verbose_sqlstate)
                    severity = result.field(PG_DIAG_SEVERITY)
                rows.extend(result.rows())
        if error:
            raise ConnectError(error, sqlstate, severity)
        return rows
