"""sql/plpython/output.py in plain Python: how results and errors become `output` and `error`.

The module is pasted into a PL/Python body after libpq.py (sql/build.py); here it is loaded by
path, with libpq.py's PG_DIAG_* field codes as the globals it expects, and errors come from a
small stand-in for a PGresult (`.field(code)`).  The same formats against a real server:
tests/test_output.py and tests/test_fidelity.py."""

import ast
import importlib.util
from pathlib import Path

import pytest

PLPYTHON = Path(__file__).resolve().parents[2] / "sql" / "plpython"
TAB = "\t"


def field_codes() -> dict[str, int]:
    """libpq.py's `PG_DIAG_... = ord("X")` constants, read without loading libpq."""
    codes = {}
    for node in ast.parse((PLPYTHON / "libpq.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.startswith("PG_DIAG_"):
            codes[node.targets[0].id] = eval(compile(ast.Expression(node.value), "libpq.py", "eval"), {"ord": ord})
    return codes


CODES = field_codes()


@pytest.fixture(scope="module")
def output():
    spec = importlib.util.spec_from_file_location("pg_task_py_output", PLPYTHON / "output.py")
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(CODES)
    spec.loader.exec_module(module)
    return module


class Result:
    """What format_error reads of a PGresult: its error fields, by libpq's codes."""

    def __init__(self, **fields: str) -> None:
        self.fields = {CODES[f"PG_DIAG_{name}"]: value for name, value in fields.items()}

    def field(self, code: int, escaped: bool = False) -> str | None:
        return self.fields.get(code)


TEXT, INT4 = 25, 23


def task(**columns):
    return {"delimiter": TAB, "quote": "", "escape": "", "null": "\\N", "header": True, "string": True, **columns}


def writer(output, limit=0, **columns):
    return output.OutputWriter(task(**columns), limit=limit)


def test_one_column_has_no_header(output):
    out = writer(output)
    out.rows([("a", INT4)], [("1",), ("2",)])
    out.end_rows()
    assert out.text() == "1\n2"


def test_several_results_several_columns_header_and_null(output):
    out = writer(output)
    out.rows([("a", INT4), ("b", TEXT)], [("1", None)])
    out.rows([], [])  # (more rows of the same result set: no second header)
    out.rows([("a", INT4), ("b", TEXT)], [("2", "x")])
    out.end_rows()
    out.command("DELETE 0")
    out.rows([("c", INT4)], [("3",)])
    out.end_rows()
    assert out.text() == f"a{TAB}b\n1{TAB}\\N\n2{TAB}x\nDELETE 0\n3"


def test_no_header_when_switched_off_and_no_rows_no_header(output):
    out = writer(output, header=False)
    out.rows([("a", INT4), ("b", INT4)], [("1", "2")])
    out.end_rows()
    out.rows([("c", INT4), ("d", INT4)], [])
    out.end_rows()
    assert out.text() == f"1{TAB}2"


def test_quote_and_escape_string_values_only_unless_string_is_off(output):
    out = writer(output, quote='"', escape="\\", delimiter=",", null="null")
    out.rows([("s", TEXT), ("n", INT4)], [('a"b\\c', "7"), (None, "8")])
    out.end_rows()
    assert out.text() == '"s","n"\n"a\\"b\\\\c",7\nnull,8'
    out = writer(output, quote="'", string=False)
    out.rows([("n", INT4)], [("7",)])
    out.end_rows()
    assert out.text() == "'7'"


def test_nothing_at_all_is_null(output):
    assert writer(output).text() is None


def test_output_past_the_limit_is_an_error(output):
    out = writer(output, limit=10)
    out.rows([("a", TEXT)], [("12345",)])
    with pytest.raises(output.OutputTooLarge, match="task output exceeds 10 characters"):
        out.rows([("a", TEXT)], [("67890",)])


def test_output_of_exactly_the_limit_is_kept(output):
    """The limit counts the characters `output` holds: the newlines between lines, none after the last."""
    one = writer(output, limit=10)
    one.rows([("a", TEXT)], [("1234567890",)])
    assert one.text() == "1234567890"
    two = writer(output, limit=10)
    two.rows([("a", TEXT)], [("1234",), ("56789",)])
    assert len(two.text()) == 10
    with pytest.raises(output.OutputTooLarge):
        two.command("X")


def test_error_is_the_message_and_the_statement(output):
    assert output.format_error(Result(SEVERITY="ERROR", MESSAGE_PRIMARY="division by zero"), "SELECT 1/0 AS a") \
        == "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0 AS a"


def test_error_with_its_position(output):
    result = Result(SEVERITY="ERROR", MESSAGE_PRIMARY='syntax error at or near "SELEC"', STATEMENT_POSITION="1")
    assert output.format_error(result, "SELEC 1") == \
        'ERROR:  syntax error at or near "SELEC" at character 1\nSTATEMENT:  SELEC 1'


def test_error_fields_in_the_logs_order_with_continuation_lines_tabbed(output):
    result = Result(SEVERITY="ERROR", MESSAGE_PRIMARY="first\nsecond", MESSAGE_DETAIL="one\ntwo",
                    MESSAGE_HINT="try this", INTERNAL_QUERY="SELECT nosuch FROM pg_class", INTERNAL_POSITION="8",
                    CONTEXT='PL/pgSQL function f() line 1 at PERFORM\nPL/pgSQL function g() line 1 at RETURN')
    assert output.format_error(result, "SELECT g();\nSELECT 2") == "\n".join([
        "ERROR:  first\n\tsecond at character 8",
        "DETAIL:  one\n\ttwo",
        "HINT:  try this",
        "QUERY:  SELECT nosuch FROM pg_class",
        "CONTEXT:  PL/pgSQL function f() line 1 at PERFORM\n\tPL/pgSQL function g() line 1 at RETURN",
        "STATEMENT:  SELECT g();\n\tSELECT 2",
    ])


def test_error_without_a_message_falls_back(output):
    assert output.format_error(Result(), "SELECT 1", fallback="server closed the connection") == \
        "ERROR:  server closed the connection\nSTATEMENT:  SELECT 1"
    assert output.format_error(Result(SEVERITY="FATAL"), "SELECT 1").startswith("FATAL:  ")
    # (libpq's words of a session ended as the answer came hold the server's FATAL: not doubled)
    assert output.format_error(Result(), "SELECT 1", fallback="FATAL:  terminating connection due to administrator"
                               " command\nserver closed the connection unexpectedly") == \
        ("FATAL:  terminating connection due to administrator command\n\tserver closed the connection unexpectedly"
         "\nSTATEMENT:  SELECT 1")


def test_the_schedulers_own_errors_in_the_same_layout(output):
    assert output.format_message("could not connect\n", "SELECT 1", hint="check pg_hba.conf",
                                 detail='missing "=" after "x"') == \
        'ERROR:  could not connect\nDETAIL:  missing "=" after "x"\nHINT:  check pg_hba.conf\nSTATEMENT:  SELECT 1'
    assert output.format_message("task not active", None) == "ERROR:  task not active"


def test_settled_reads_the_bytes_that_were_not_utf8_again_in_the_sessions_encoding(output):
    """A task that SET client_encoding had its later results sent in it; the lines read as UTF-8
    with those bytes kept are read again in the encoding the session ended with, the others kept."""
    latin1 = "café".encode("latin-1").decode("utf-8", "surrogateescape")
    read_latin1 = lambda raw: raw.decode("latin-1")  # noqa: E731
    assert output.settled(f"SET\n{latin1}\nété", read_latin1) == "SET\ncafé\nété"
    # not text in the session's encoding either
    assert output.settled(latin1, lambda raw: raw.decode("utf-8", "replace")) == "caf\ufffd"
    assert output.settled("plain", read_latin1) == "plain"
    assert output.settled(None, read_latin1) is None


def test_settled_reads_every_line_again_when_the_session_ended_in_another_encoding(output):
    """Lines read in the encoding the session had as the input was sent, whose bytes happened to
    be text in it too, were kept as read: UTF-8's 'é' read as LATIN1 stayed 'Ã©', GB18030's '通知'
    read as UTF-8 stayed '֪ͨ'.  When the session ended in another encoding, each line is read again."""
    read_latin1 = lambda raw: raw.decode("latin-1")  # noqa: E731
    # (a LATIN1 session sent 'Ã©' as the bytes of UTF-8's 'é')
    assert output.settled("SET\nx\tn\né\t2", read_latin1, "utf-8", every_line=True) == "SET\nx\tn\nÃ©\t2"
    assert output.settled("RESET\nÃ©", lambda raw: raw.decode("utf-8"), "latin-1", every_line=True) == "RESET\né"
    gb18030 = "通知".encode("gb18030").decode("utf-8", "surrogateescape")
    assert output.settled(f"SET\n{gb18030}", lambda raw: raw.decode("gb18030"), "utf-8", every_line=True) == \
        "SET\n通知"
    assert output.settled("SET\nÃ©", read_latin1, "utf-8") == "SET\nÃ©"  # (the same encoding: kept)
    # (an ASCII line reads the same in every encoding: not read again, which for EUC_TW is a server call)
    read = []
    assert output.settled("SET\n1\tabc\né", lambda raw: read.append(raw) or raw.decode("latin-1"), "utf-8",
                          every_line=True) == "SET\n1\tabc\nÃ©"
    assert read == ["é".encode()]
    # (the worker's own text in a line, a task's null or delimiter, is kept as it is)
    assert output.settled("SET\n∅│é", read_latin1, "utf-8", every_line=True, own=("∅", "│", "\t")) == \
        "SET\n∅│Ã©"


def test_a_writers_lines_are_read_again_value_by_value(output):
    """The worker's own text in a line (a task's null, delimiter, quote) is not read again, and
    a value's bytes are escaped only once read: SJIS's '表' ends with the byte of a backslash,
    which was escaped ('"表\\"'), and a LATIN1 value whose bytes read as UTF-8's 'é' was taken for
    a task's null 'é' (a probe)."""
    read_latin1 = lambda raw: raw.decode("latin-1")  # noqa: E731
    out = output.OutputWriter(task(null="∅", delimiter="│"), 0, keep_values=True)
    out.command("SET")
    out.rows([("x", TEXT), ("y", TEXT)], [[None, "é"]])
    assert out.settled(read_latin1, 3, "utf-8", True, "latin-1") == "SET\nx│y\n∅│Ã©"
    out = output.OutputWriter(task(null="é"), 0, keep_values=True)
    out.rows([("a", TEXT), ("b", TEXT)], [["é", None]])
    assert out.settled(read_latin1, 2, "utf-8", True, "latin-1") == "a\tb\nÃ©\té"
    sjis = "表".encode("shift_jis").decode("utf-8", "surrogateescape")
    out = output.OutputWriter(task(quote='"', escape="\\"), 0, keep_values=True)
    out.rows([("a", TEXT), ("b", TEXT)], [[sjis, 'x"\\']])
    assert out.settled(lambda raw: raw.decode("shift_jis"), 2, "utf-8", True, "shift_jis") == \
        '"a"\t"b"\n"表"\t"x\\"\\\\"'
    assert out.settled(lambda raw: raw.decode("shift_jis"), 0, "utf-8", False, "shift_jis") == \
        '"a"\t"b"\n"表"\t"x\\"\\\\"'  # (its lines read after the input returned: in the same encoding)
    plain = writer(output)
    plain.rows([("a", TEXT)], [["é"]])
    assert plain.settled(read_latin1, 1, "utf-8", False, "utf-8") == "é"  # (read where it was text)


@pytest.mark.parametrize("quote", ['"', "'", "\\", "é"])
@pytest.mark.parametrize("escape", ["", "\\", '"', "é"])
def test_each_quote_and_escape_in_a_value_is_escaped_once(output, quote, escape):
    """A quote or escape character inside a value gets one `escape` before it (the same character
    as both: doubled), whatever their order; by str.replace, not a character at a time."""
    def one_at_a_time(value):
        return "".join(escape + ch if escape and ch in (quote, escape) else ch for ch in value)
    out = writer(output, quote=quote, escape=escape)
    values = ['a"b\\c', "''", "\\\\\"", "é\"'\\é", "", "plain"]
    out.rows([("a", TEXT)], [[value] for value in values])
    assert out.text() == "\n".join(f"{quote}{one_at_a_time(value)}{quote}" for value in values)
