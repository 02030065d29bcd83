"""The next matches a backend's cron series end with, remembered for the next ends.

Every end of a cron series computes its next match (next_plan). Computed in PL/pgSQL, that
took about 50 us of the end's transaction (PL/pgSQL prepares each expression of a function
again in every transaction, and a series end is one transaction). The ends of many series of
one expression fall between the same two matches, and so share the answer:

    if cron_next(expr, tz, a) = r, then cron_next(expr, tz, b) = r for every b in [a, r)

(r is the first match after a, so there is none in (b, r)). This keeps, per expression and
zone, the last [a, r) that pgtaskpy.cron_next computed, and asks it again outside it:
cron_next stays the only reader of the syntax, of time zones and of daylight saving. The
backend's time zone rules do not change while it runs (PostgreSQL loads them once), so an
answer kept is the answer cron_next would give.
"""

MOST_KEPT = 256  # expressions one backend keeps; past that it starts again (a series is rarely alone)
# Epochs of the times cron_next looks at (from 4685 BC, a margin after PostgreSQL's first day for
# the zones' local times, to the year 10000, its own last): a direct call of this PUBLIC function
# with NaN, infinity or 1e300 showed a Python traceback; outside them, no match.
EARLIEST_EPOCH, LATEST_EPOCH = -2.1e11, 253402300800.0


def main(plpy, SD, expr, tz, after):
    """The epoch of the first match of expr in zone tz strictly after epoch `after`; None (NULL)
    when `after` is no time."""
    if not EARLIEST_EPOCH < after < LATEST_EPOCH:  # (NaN too)
        return None
    kept = SD.setdefault("cron_matches", {})
    known = kept.get((expr, tz))
    if known is not None and known[0] <= after < known[1]:
        return known[1]
    if "next" not in SD:
        SD["next"] = plpy.prepare(
            "SELECT extract(epoch FROM pgtaskpy.cron_next($1, $2, pg_catalog.to_timestamp($3)))::float8 AS r",
            ["text", "text", "float8"])
    match = plpy.execute(SD["next"], [expr, tz, after])[0]["r"]
    if match is None:
        return None
    if len(kept) >= MOST_KEPT:
        kept.clear()
    kept[(expr, tz)] = (after, match)
    return match
