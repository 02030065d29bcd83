"""The cron expressions a backend's series end with, kept parsed for their next runs.

Every end of a cron series computes its next match. Parsing the expression again each time
(pgtaskpy.cron_parse, PL/pgSQL) took about 45 us of a 250 us end; a lookup here takes about
2 us. cron_parse stays the only reader of the syntax: a miss asks it.
"""

MOST_KEPT = 256  # expressions one backend keeps; past that it starts again (a series is rarely alone)


def main(plpy, SD, expr):
    """cron_parse's bit masks for expr, or None when it cannot be read (the caller then asks
    cron_parse itself, for its error)."""
    specs = SD.setdefault("cron_specs", {})
    spec = specs.get(expr)
    if spec is None:
        if "parse" not in SD:
            SD["parse"] = plpy.prepare("SELECT pgtaskpy.cron_parse($1, false) AS spec", ["text"])
        spec = plpy.execute(SD["parse"], [expr])[0]["spec"]
        if spec is None:
            return None
        if len(specs) >= MOST_KEPT:
            specs.clear()
        specs[expr] = spec
    return spec
