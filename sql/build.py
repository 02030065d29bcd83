"""Assemble the scripts of the version in development from the SQL sources and sql/plpython.

The SQL sources are in two folders, by how a database gets them:

    sql/created_once/   tables, types, roles, policies: created by the install
                        script only; an upgrade changes them by a hand-written
                        step, sql/upgrade/FROM--TO.sql
    sql/replayed/       functions, procedures, triggers, their grants: every
                        upgrade script replays them all (CREATE OR REPLACE)

The install script is the files of both folders in the order of their names.

The files of sql/plpython/ are compiled once, by the script: the line
`{{ sql/plpython/*.py }}` (sql/replayed/12_python_modules.sql) becomes a call of
pgtaskpy.install_python_modules with every file's name and source, which
compiles them in the server's Python and keeps their bytecode in the function
pgtaskpy.python_modules() and their source in pgtaskpy.python_sources().  A
`{{ a.py b.py }}` line inside a function body is replaced by a short loader: on
a backend's first call it runs those modules' bytecode, in order, in one
namespace (compiling their source only when the server's Python is not the one
that compiled them), and keeps the last one's `main`, the entry point, in SD;
every call then calls that `main`.  So each file stays a real, lintable Python
module, and a new worker backend loads bytecode instead of compiling 2,600 lines
of Python (bench/RESULTS.md).  Functions rather than a table: a table of the
extension would be copied into a subscriber's by a publication FOR ALL TABLES.

PL/Python gives a body `plpy`, `GD`, `SD` and the routine's arguments as
globals.  Only the generated call reads them: `main` is passed the globals
named as its parameters, e.g. `main(plpy, GD, SD, task_id, claimer)`, and
passes them on, so that every file imports in plain Python as well.

    python3 sql/build.py install > sql/pg_task_py--1.3.sql
    python3 sql/build.py upgrade 1.2 1.3 > sql/pg_task_py--1.2--1.3.sql
    python3 sql/build.py upgrade 1.0 1.2 1.3 > sql/pg_task_py--1.0--1.3.sql

An upgrade script is sql/upgrade/FROM--TO.sql (what CREATE OR REPLACE cannot
do: drops of changed signatures and of what is gone, changes of created_once
objects), followed by every file of sql/replayed with CREATE turned into
CREATE OR REPLACE, then sql/upgrade/FROM--TO.after.sql if there is one (what
needs the new functions: checks of the rows).  So a function is written once, and an upgraded database
gets the same code as a fresh install (tests/test_upgrade.py checks).
"""

import ast
import pathlib
import re
import sys
import warnings

HERE = pathlib.Path(__file__).parent
INCLUDE = re.compile(r"^\{\{\s*(.+?)\s*\}\}$", re.MULTILINE)
ALL_MODULES = "sql/plpython/*.py"
CREATE_ROUTINE = re.compile(r"^CREATE (FUNCTION|PROCEDURE|TRIGGER) ", re.MULTILINE)
CREATED_ONCE = HERE / "created_once"
REPLAYED = HERE / "replayed"


def entry_point_parameters(name: str, source: str) -> list[str]:
    """The parameters of the file's `main`: the PL/Python globals the body passes it, by name."""
    for node in ast.parse(source, name).body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            params = node.args
            if params.posonlyargs or params.kwonlyargs or params.vararg or params.kwarg or params.defaults:
                sys.exit(f"{name}: main(...) takes PL/Python's globals by their names, and nothing else")
            return [param.arg for param in params.args]
    sys.exit(f"{name}: the last file of a body has the entry point, main(...)")


def python_body(match: re.Match) -> str:
    if match.group(1) == ALL_MODULES:
        return install_python_modules()
    names = match.group(1).split()
    for name in names:
        if not (HERE / "plpython" / name).is_file():
            sys.exit(f"{{{{ {match.group(1)} }}}}: no sql/plpython/{name}")
    parameters = entry_point_parameters(names[-1], (HERE / "plpython" / names[-1]).read_text())
    return f"""if "pgtaskpy.main" not in SD:  # this backend's first call: load the modules (sql/build.py)
    # (not importlib.util.MAGIC_NUMBER: importing importlib.util costs a new backend 5 ms)
    import _frozen_importlib_external as _importlib, binascii as _binascii, marshal as _marshal, zlib as _zlib
    _names = {names!r}
    _modules = plpy.execute(plpy.prepare(
        "SELECT m.name, m.code FROM pgtaskpy.python_modules() AS m WHERE m.name = ANY ($1) AND m.magic = $2",
        ["text[]", "bytea"]), [_names, _importlib.MAGIC_NUMBER])
    if len(_modules) != len(_names):  # compiled by another Python than the server's: compiled here
        _modules = plpy.execute(plpy.prepare(
            "SELECT s.name, s.source FROM pgtaskpy.python_sources() AS s WHERE s.name = ANY ($1)", ["text[]"]),
            [_names])
    _by_name = {{module["name"]: module for module in _modules}}
    if len(_by_name) != len(_names):
        plpy.error("pg_task_py's Python modules are missing: run ALTER EXTENSION pg_task_py UPDATE, or"
                   " DROP and CREATE EXTENSION pg_task_py")
    _namespace = {{"__name__": "pgtaskpy"}}
    for _name in _names:
        _module = _by_name[_name]
        exec(_marshal.loads(_zlib.decompress(_binascii.a2b_base64(_module["code"]))) if "code" in _module
             else compile(_module["source"], "sql/plpython/" + _name, "exec"), _namespace)
    SD["pgtaskpy.main"] = _namespace["main"]
return SD["pgtaskpy.main"]({", ".join(parameters)})"""


def compiles_cleanly(name: str, source: str) -> None:
    """Refuse a module that Python compiles with a warning: a SyntaxWarning ('"..." (...)', a
    string called, "perhaps you missed a comma?") is an error only when its line runs, and one
    such line in a hint failed every task whose session could not be opened (a review)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            compile(source, f"sql/plpython/{name}", "exec")
        except SyntaxError as exc:  # (a SyntaxWarning made an error is raised as a SyntaxError)
            sys.exit(f"sql/plpython/{name}:{exc.lineno}: {exc.msg}")


def install_python_modules() -> str:
    """The call that compiles every file of sql/plpython and keeps it in pgtaskpy.python_modules()."""
    names, sources = [], []
    for path in sorted((HERE / "plpython").glob("*.py")):
        source = path.read_text()
        if "$python$" in source:
            sys.exit(f"{path.name}: contains the $python$ quote")
        compiles_cleanly(path.name, source)
        names.append(f"'{path.name}'")
        sources.append(f"$python${source}$python$")
    return (f"SELECT pgtaskpy.install_python_modules(\n    ARRAY[{', '.join(names)}],\n    ARRAY[\n"
            + ",\n".join(sources) + "]);")


def source(path: pathlib.Path) -> str:
    return f"-- ---- sql/{path.relative_to(HERE)}\n" + INCLUDE.sub(python_body, path.read_text())


# CREATE and ALTER EXTENSION run a script with the extension's schema on the search_path, and a
# role that can create objects there (a database's owner owns `public`) could have an operator or
# function of the exact types the script names (`=` of the state enum, `cardinality` of an array:
# pg_catalog has only polymorphic ones) run as the superuser, or bound for good into an index,
# trigger or constraint (tests/test_name_capture.py).  The script resolves through pg_catalog
# alone: every name of the extension's own is written with its schema (PostgreSQL searches pg_temp
# for no function nor operator).  LOCAL: the server gives the session its search_path back as the
# script ends, which it does not do after a plain SET.
SAFE_SEARCH_PATH = "SET LOCAL search_path TO pg_catalog, pg_temp;"


def header(how: str) -> list[str]:
    return ["-- Generated by sql/build.py from sql/created_once, sql/replayed, sql/upgrade and sql/plpython:"
            " edit those, then `make`.",
            f"\\echo Use \"{how}\" to load this file. \\quit", "", SAFE_SEARCH_PATH, ""]


REVOKED_ROUTINE = re.compile(r"REVOKE ALL ON (?:FUNCTION|PROCEDURE) (.+?) FROM PUBLIC;", re.DOTALL)


def public_execute() -> str:
    """The last statement of each script: EXECUTE for PUBLIC on every routine of the extension but
    those its sources revoke it from.  A DBA's ALTER DEFAULT PRIVILEGES ... REVOKE EXECUTE ON
    FUNCTIONS FROM PUBLIC left the extension's own with none, and a task author's INSERT failed
    (`permission denied for function setting_default`, in the column defaults)."""
    private = sorted({" ".join(match.split()) for path in REPLAYED.glob("*.sql")
                      for match in REVOKED_ROUTINE.findall(path.read_text())})
    revokes = sum(path.read_text().count("REVOKE ") for path in REPLAYED.glob("*.sql"))
    if revokes != sum(len(REVOKED_ROUTINE.findall(path.read_text())) for path in REPLAYED.glob("*.sql")):
        # (one this does not read would be granted to PUBLIC again below)
        sys.exit("sql/replayed: every REVOKE there is `REVOKE ALL ON FUNCTION|PROCEDURE f(...) FROM PUBLIC;`")
    listed = ",\n        ".join(f"'{signature}'" for signature in private)
    return f"""-- ---- sql/build.py: public_execute()
DO $public_execute$
DECLARE
    private regprocedure[] := ARRAY[
        {listed}]::regprocedure[];
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid
         AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND d.deptype = 'e'
        JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pg_task_py'
        WHERE p.oid <> ALL (private)
          AND NOT pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON ROUTINE %s TO PUBLIC', routine);
    END LOOP;
END
$public_execute$;
"""


def install_script() -> str:
    out = header("CREATE EXTENSION pg_task_py CASCADE")
    paths = [*CREATED_ONCE.glob("*.sql"), *REPLAYED.glob("*.sql")]
    out += [source(path) for path in sorted(paths, key=lambda path: path.name)]
    out.append(public_execute())
    return "\n".join(out)


def upgrade_script(old: str, new: str) -> str:
    out = header("ALTER EXTENSION pg_task_py UPDATE")
    out.append(upgrade_body(old, new))
    return "\n".join(out)


def upgrade_body(old: str, new: str) -> str:
    """The upgrade script without its header."""
    out = [source(HERE / "upgrade" / f"{old}--{new}.sql")]
    for path in sorted(REPLAYED.glob("*.sql")):
        out.append(CREATE_ROUTINE.sub(r"CREATE OR REPLACE \1 ", source(path)))
    out.append(public_execute())
    after = HERE / "upgrade" / f"{old}--{new}.after.sql"  # (what needs the new version's functions)
    if after.exists():
        out.append(source(after))
    return "\n".join(out)


def direct_upgrade_script(old: str, previous: str, new: str) -> str:
    """OLD -> NEW in one script: the released steps from OLD to PREVIOUS, byte for byte but their
    two header lines, then PREVIOUS -> NEW.  The released steps of 1.0 and 1.1 ran with the
    search_path the server gives an extension's script (its schema first); in one script of this
    version's they run with SAFE_SEARCH_PATH, as CREATE EXTENSION does.  ALTER EXTENSION UPDATE
    takes the shortest path, so this one script, not the steps."""
    out = header("ALTER EXTENSION pg_task_py UPDATE")
    for step in released_steps(old, previous):
        out.append(f"-- ---- sql/{step.name} (released)")
        out.append(step.read_text().split("\n", 2)[2])
    out.append(upgrade_body(previous, new))
    return "\n".join(out)


def released_steps(old: str, previous: str) -> list[pathlib.Path]:
    """The released update scripts that take OLD to PREVIOUS, one version at a time (the released
    versions are those whose install script sql/released.sha256 records)."""
    names = [line.split()[1] for line in (HERE / "released.sha256").read_text().splitlines()]
    versions = sorted((name.removeprefix("pg_task_py--").removesuffix(".sql") for name in names
                       if name.count("--") == 1), key=lambda version: tuple(map(int, version.split("."))))
    chain = versions[versions.index(old):versions.index(previous) + 1]
    return [HERE / f"pg_task_py--{a}--{b}.sql" for a, b in zip(chain, chain[1:])]


def ascii_only(script: str) -> str:
    """The script, which must be ASCII: PostgreSQL reads an extension's script in the database's
    encoding, and a UTF-8 '…' in a comment failed CREATE EXTENSION in an EUC_JP database (and
    a string literal's was read as three LATIN1 characters in a LATIN1 one)."""
    for number, line in enumerate(script.splitlines(), 1):
        if not line.isascii():
            wide = next(char for char in line if not char.isascii())
            sys.exit(f"build.py: line {number} of the script holds {wide!r} (U+{ord(wide):04X}): the script must be"
                     f" ASCII (write it as a Python escape, or in words):\n{line.strip()}")
    return script


def main() -> None:
    if sys.argv[1:2] == ["install"]:
        sys.stdout.write(ascii_only(install_script()))
    elif sys.argv[1:2] == ["upgrade"] and len(sys.argv) == 4:
        sys.stdout.write(ascii_only(upgrade_script(sys.argv[2], sys.argv[3])))
    elif sys.argv[1:2] == ["upgrade"] and len(sys.argv) == 5:
        sys.stdout.write(ascii_only(direct_upgrade_script(sys.argv[2], sys.argv[3], sys.argv[4])))
    else:
        sys.exit("usage: build.py install | build.py upgrade OLD NEW | build.py upgrade OLD PREVIOUS NEW")


if __name__ == "__main__":
    main()
