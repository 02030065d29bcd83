"""How a task's results and errors are written into `output` and `error`, as pg_task does.

Output: every statement that returns rows adds its rows (columns joined by
`delimiter`, rows by newline, a header line of column names when `header` is
set and the result has more than one column); a statement without rows adds its
command tag (`DELETE 0`); NULL prints as the task's `null`.  `COPY ... TO STDOUT` adds its
rows as the COPY formats them, then its tag (`COPY 2`), as psql prints them.  With a `quote`, values are
quoted and `quote`/`escape` characters inside them are escaped; with `string`
every value but those of UNQUOTED_TYPES is quoted, header names always.

Error: byte for byte as the server log prints it (log_error_verbosity
default): `ERROR:  message` with ` at character N` when the error has a
position, then DETAIL, HINT, QUERY and CONTEXT lines where present, then
`STATEMENT:  <input>`; a line break inside any of them continues on a line
that starts with a tab.
"""

TYPE_CHECKING = False  # (not typing's: importing it slows a worker's first call; bench/RESULTS.md)

if TYPE_CHECKING:  # assembled into one function body with libpq.py by sql/build.py
    from libpq import (
        PG_DIAG_CONTEXT,
        PG_DIAG_INTERNAL_POSITION,
        PG_DIAG_INTERNAL_QUERY,
        PG_DIAG_MESSAGE_DETAIL,
        PG_DIAG_MESSAGE_HINT,
        PG_DIAG_MESSAGE_PRIMARY,
        PG_DIAG_SEVERITY,
        PG_DIAG_STATEMENT_POSITION,
    )


class OutputTooLarge(Exception):
    """The output passed the task's byte limit."""


# With `string` on, the types whose values pg_task writes as they are: numbers, booleans, bit
# strings and the system's ids, by their own oids (an array of them is quoted; a domain's values come
# with its base type's oid, so a domain over a number is not).  Every
# other value is quoted: a timestamp, a uuid, json and an array too, whose text may hold the
# delimiter (a CSV of them had a field too many when only type category S was quoted).
UNQUOTED_TYPES = frozenset((
    16,  # boolean
    20, 21, 23,  # bigint, smallint, integer
    26, 27, 28, 29,  # oid, tid, xid, cid
    700, 701, 1700,  # real, double precision, numeric
    1560,  # bit
))


class OutputWriter:
    """Collects the formatted lines of one task, bounded by `limit` characters.

    keep_values: the task may change its session's client_encoding (its input names it, or the
    session is in another encoding already), so the values of each line that is not all ASCII
    are kept beside it (`values`), to be formatted again once that encoding is known (settled):
    values read in the encoding before had a character's byte that reads as a quote or escape
    there escaped (SJIS's U+8868 ends with 0x5C: a backslash was added), and a value that read
    as the task's `null` or `delimiter` taken for it.  ASCII reads the same in every encoding the
    server has.  Kept as one string a line (values joined by NUL, which text never holds), not
    lists: a million lines of lists took a worker to 600 MB where their text took 200 (a review).
    """

    def __init__(self, task, limit, keep_values=False):
        self.delimiter = task["delimiter"]
        self.quote = task["quote"] or ""
        self.escape = task["escape"] or ""
        self.null = task["null"]
        self.header = task["header"]
        self.string = task["string"]
        self.limit = limit
        self.lines = []
        self.keep_values = keep_values
        self.values = {}  # a line's index: its values (packed_values), when kept
        self.size = 0
        self.columns = None  # the result set being read, None between sets

    def _add(self, line):
        self.size += len(line) + (1 if self.lines else 0)  # (the newline between lines, none after the last)
        if self.limit and self.size > self.limit:
            # (these words tell pgtaskpy.retry_plan that the input ran: retried only if retry_unsafe)
            raise OutputTooLarge(f"task output exceeds {self.limit} characters")
        self.lines.append(line)

    def _add_values(self, values, quoted):
        line = self.delimiter.join(map(self._cell, values, quoted))
        self._add(line)
        if self.keep_values and not line.isascii():
            self.values[len(self.lines) - 1] = packed_values(values, quoted)

    def _quoted(self, value):
        """The value in `quote`, each `quote` and `escape` in it after an `escape`.  By replace, not
        a character at a time: a value of 20 MB of quotes took its worker to 1.5 GB (a probe)."""
        if self.escape:
            value = value.replace(self.escape, self.escape * 2)
            if self.quote and self.quote != self.escape:
                value = value.replace(self.quote, self.escape + self.quote)
        return f"{self.quote}{value}{self.quote}"

    def _cell(self, value, quoted):
        if value is None:
            return self.null
        return self._quoted(value) if quoted else value

    def rows(self, columns, rows):
        """Add rows of a result set; the header goes before its first row."""
        if self.columns is None:
            self.columns = columns
            self.quoted = [
                bool(self.quote) and (not self.string or oid not in UNQUOTED_TYPES)
                for _, oid in columns
            ]
            self.pending_header = self.header and len(columns) > 1
        cell, join, quoted = self._cell, self.delimiter.join, self.quoted  # (a million rows a second)
        for row in rows:
            if self.pending_header:
                self.pending_header = False
                self._add_values([name for name, _ in columns], [bool(self.quote)] * len(columns))
            if self.keep_values:
                self._add_values(row, quoted)
            else:
                self._add(join(map(cell, row, quoted)))

    def end_rows(self):
        self.columns = None

    def command(self, tag):
        self._add(tag)

    def copy_row(self, data, codec, binary):
        """A row of COPY ... TO STDOUT, as the COPY wrote it (psql prints it so), less its line
        break; a row of COPY's binary format as bytea's hex text (`output` holds no zero byte)."""
        self._add("\\x" + data.hex() if binary else data.decode(codec, "surrogateescape").removesuffix("\n"))

    def text(self):
        """The output column: None when the task produced nothing at all."""
        return "\n".join(self.lines) if self.lines else None

    def settled(self, decode, returned, read_as, every_line, ended_as):
        """The output column in the session's encoding, once the input has ended (see settled()):
        its first `returned` lines were read in `read_as` (every_line: the session ended in
        another), the rest in the encoding it ended with (`ended_as`).  A line whose values were
        kept is formatted again from them, each read again; another is read again as a whole,
        but for the task's own text in it (`own`: its null, delimiter, quote, escape)."""
        if not every_line:
            text = self.text()
            if text is None or _is_plain(text):
                return text  # (every byte was text where it was read)
        own = (self.null, self.delimiter, self.quote, self.escape)

        def read(index, *codec):
            values = self.values.get(index)
            if values is None:
                return settled(self.lines[index], decode, *codec, own=own)
            return self.delimiter.join(self._cell(value if value is None else settled(value, decode, *codec), quoted)
                                       for value, quoted in unpacked_values(values))
        return "\n".join([read(index, read_as, every_line) for index in range(returned)]
                         + [read(index, ended_as) for index in range(returned, len(self.lines))])


def packed_values(values, quoted):
    """A line's values in one string: each 'n' (NULL), or 'q' (quoted) or 'v' and the value,
    joined by NUL."""
    return "\0".join("n" if value is None else ("q" if quote else "v") + value for value, quote in zip(values, quoted))


def unpacked_values(packed):
    """(value, quoted) of each value packed_values packed."""
    return [(None, False) if item == "n" else (item[1:], item[0] == "q") for item in packed.split("\0")]


def settled(text, decode, read_as="utf-8", every_line=False, own=()):
    """Text read with its undecodable bytes kept (Result's `escaped`), made plain: the lines that
    hold such bytes are read again by `decode` (bytes to str), in the session's client_encoding
    once the input has ended, the rest kept.  A task that SETs client_encoding has the server send what follows in
    that encoding at once, but libpq learns of the change only as the input ends: its results
    were read in the encoding the session had before (`read_as`), and 'caf\u00e9' was stored
    'caf\ufffd'.  When that encoding was another, `every_line` is read again: a line whose bytes
    happened to be text in it too was kept as read (LATIN1 reads any bytes: UTF-8's e-acute was
    stored as two letters; much of GB18030's Chinese is valid UTF-8).  Bytes that are not text in the session's encoding
    either are replaced (U+FFFD).  `own`: the text the worker wrote into the lines itself (a
    task's `null`, `delimiter`, `quote`), which is kept as it is: read again, an empty-set sign was
    stored as its UTF-8 bytes read in LATIN1 (a review).  None stays None."""
    if text is None or not every_line and _is_plain(text):
        return text
    own = tuple(piece for piece in own if piece and not piece.isascii())  # (ASCII reads the same in both)
    # (ASCII reads the same in every encoding the server has: a line of it is not read again, which
    # for EUC_TW is a call of the server's, a review)
    return "\n".join(line if line.isascii() or not every_line and _is_plain(line)
                      else _read_again(line, decode, read_as, own) for line in text.split("\n"))


def _read_again(line, decode, read_as, own=()):
    """The line's bytes, as they came, read by `decode`, but for the pieces `own`; the line as it
    is when it cannot be made bytes of `read_as` again (a character of the worker's own words
    that it lacks)."""
    for piece in own:
        if piece in line:
            return piece.join(_read_again(part, decode, read_as, own) for part in line.split(piece))
    try:
        raw = line.encode(read_as, "surrogateescape")
    except UnicodeEncodeError:
        return line
    return decode(raw)


def _is_plain(text):
    """Whether the text holds no undecodable byte (surrogateescape's lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def with_tabs(text):
    """A field as the server log writes it: each line after the first starts with a tab."""
    return text.replace("\n", "\n\t")


FALLBACK_SEVERITIES = ("ERROR", "FATAL", "PANIC")  # (the labels libpq's words may begin with)


def format_error(result, statement, fallback=""):
    """An error result as the server log prints it (elog.c, send_message_to_server_log), ending
    with the statement: the same lines, labels, positions and tabs.  Its fields are read as the
    output is (`escaped`), for `settled` to read again in the session's encoding: a task that SET
    client_encoding had its error's U+00E9 stored as U+FFFD."""
    severity = result.field(PG_DIAG_SEVERITY)
    message = result.field(PG_DIAG_MESSAGE_PRIMARY, escaped=True) or fallback or "missing error text"
    if severity is None:
        severity, message = labelled(message)
    first = f"{severity}:  {with_tabs(message)}"
    position = result.field(PG_DIAG_STATEMENT_POSITION) or result.field(PG_DIAG_INTERNAL_POSITION)
    if position and int(position) > 0:
        first += f" at character {position}"
    lines = [first]
    for label, code in (
        ("DETAIL", PG_DIAG_MESSAGE_DETAIL),
        ("HINT", PG_DIAG_MESSAGE_HINT),
        ("QUERY", PG_DIAG_INTERNAL_QUERY),
        ("CONTEXT", PG_DIAG_CONTEXT),
    ):
        value = result.field(code, escaped=True)
        if value:
            lines.append(f"{label}:  {with_tabs(value)}")
    lines.append(f"STATEMENT:  {with_tabs(statement)}")
    return "\n".join(lines)


ERROR_FIRST_LINE_KEPT = 1000  # characters of an error's first line kept whatever the output limit


def bounded_error(error, most):
    """A task's error, cut at `most` characters (pg_task_py.output_limit, as its output and
    notices are) with a line that says so: a task could raise an error of 200 MB, every byte of
    it written to its row.  Its first line is kept up to ERROR_FIRST_LINE_KEPT characters, so a
    limit of 10 still says why the task failed (`task output exceeds 10 characters`)."""
    if error is None or len(error) <= most:
        return error
    most = max(most, min(len(error.split("\n", 1)[0]), ERROR_FIRST_LINE_KEPT))
    if len(error) <= most:
        return error
    return error[:most] + "\n(the rest of the error dropped: pg_task_py.output_limit)"


def labelled(message, severity="ERROR"):
    """(severity, message) of libpq's own words of a session the server ended, whose FATAL they
    begin with already: "ERROR:  FATAL:  terminating connection ..." was written (two probes,
    the second where the session broke as its query was sent)."""
    label, said, rest = message.partition(":  ")
    return (label, rest) if said and label in FALLBACK_SEVERITIES else (severity, message)


def format_message(message, statement, hint=None, detail=None, severity="ERROR"):
    """An error of the scheduler's own, or one of the server's without its PGresult (the server's
    end of a session: FATAL), in the same layout."""
    severity, message = labelled(message, severity)
    lines = [f"{severity}:  {with_tabs(message.rstrip())}"]  # (libpq's messages end with a line break)
    if detail:
        lines.append(f"DETAIL:  {with_tabs(detail.rstrip())}")
    if hint:
        lines.append(f"HINT:  {with_tabs(hint.rstrip())}")
    if statement is not None:
        lines.append(f"STATEMENT:  {with_tabs(statement)}")
    return "\n".join(lines)
