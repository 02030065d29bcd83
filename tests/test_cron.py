"""Cron schedules (columns cron and tz), named series (key, task_schedule, task_unschedule) and the
view task_series: the parser and the next-match rule against an independent reference (croniter
for the matches, zoneinfo for daylight saving), then series through the real launcher."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest
from croniter import croniter
from pg_task_py_testing import insert_as, most_at_once, new_database, wait_until
from psycopg import sql

UTC = timezone.utc
SECOND = timedelta(seconds=1)

# pg_cron's syntax: fields, lists, ranges, steps, names, both Sunday numbers, "$", macros.
EXPRESSIONS = [
    "* * * * *", "*/5 * * * *", "0 * * * *", "15,45 * * * *", "0-10/3 9-17 * * *", "1-30/7 * * * *",
    "*/7 * * * *", "23 0-20/2 * * *", "*/15 */6 * * *", "0 0 * * *", "30 2 * * *", "0 12 1 * *",
    "0 0 1 1 *", "0 0 29 2 *", "0 0 31 * *", "0 0 30 * *", "0 4 8-14 * *", "*/10 * 10-15 * *",
    "0 9 * * mon-fri", "0 9 * * 1-5", "0 22 * * MON-FRI", "0 0 * * 0", "0 0 * * 7", "0 0 * * 5-7",
    "0 0 * * 6-7", "0 0 * * sun", "5 4 * * sun", "0 0 * * sat,sun", "0 0 * * */2", "0 8 * jan,jul *",
    "0 8 1 jan-mar *", "0 0 * feb *", "0 0,12 1 */2 *", "0 8 1 JAN *", "0\t0  *\t*  *",
    "0 0 13 * fri", "0 0 1,15 * mon", "0 0 1-7 * 1",  # both day fields restricted: either matches
    "0 0 $ * *", "0 12 $ feb *", "0 0 1,$ * *", "59 23 $ * *", "0 0 $ * fri",
    "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
    "00005 000002-0000010/00003 * * *",  # (leading zeros, as pg_cron reads them: 00005 was out of range)
]
AFTER = ["2024-02-28 23:59:30+00", "2023-12-31 23:59:59+00", "2025-06-15 12:34:56.5+00",
         "2100-02-27 00:00+00", "2024-03-31 00:00+00"]


def next_runs(db, cron: str, tz: str | None, n: int, after: str | datetime) -> list[datetime]:
    return [row[0] for row in db.sql("SELECT task_next_runs(%s, %s, %s, %s::timestamptz)", [cron, tz, n, after])]


def croniter_runs(cron: str, n: int, after: datetime) -> list[datetime]:
    matches = croniter(cron.replace("$", "L"), after)  # croniter's "last day of the month" is L
    return [matches.get_next(datetime) for _ in range(n)]


def test_next_matches_agree_with_croniter(db):
    for cron in EXPRESSIONS:
        for after in AFTER:
            expected = croniter_runs(cron, 25, datetime.fromisoformat(after))
            assert next_runs(db, cron, "UTC", 25, after) == expected, (cron, after)


def test_next_runs_are_those_before_the_year_10000(db):
    """Fewer than n when the calendar ends first (it failed with no rows)."""
    runs = next_runs(db, "0 0 1 1 *", "UTC", 10, "9994-06-01 00:00+00")
    assert [run.year for run in runs] == [9995, 9996, 9997, 9998, 9999]
    assert next_runs(db, "0 0 1 1 *", "UTC", 3, "9999-06-01 00:00+00") == []
    # (20:00 on 31 December 9999 in New York is in the year 10000 in UTC, where no plan may be)
    assert next_runs(db, "0 20 31 12 *", "America/New_York", 3, "9999-06-01 00:00+00") == []
    assert next_runs(db, "* * * * *", "Europe/Berlin", 3, "294276-12-31 23:59:59+00") == []  # (out of range)
    # ('N seconds' ran on into the year 10000)
    assert [run.isoformat() for run in next_runs(db, "30 seconds", "UTC", 3, "9999-12-31 23:59+00")] == [
        "9999-12-31T23:59:30+00:00"]


def test_a_default_repeat_leaves_cron_tasks_alone(db):
    """pg_task.repeat is the default of `repeat`: a cron task, which may not repeat as well,
    takes none from it (ALTER ROLE ... SET pg_task.repeat failed every cron insert of the role);
    a repeat written beside a cron is still refused."""
    db.sql("SET pg_task.repeat = '5 min'")
    task_id = db.insert("SELECT 1", cron="0 3 * * *", delete=False)
    scheduled = db.value("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1')")
    assert db.sql("SELECT repeat FROM task WHERE id = ANY(%s)", [[task_id, scheduled]]) == [(timedelta(0),)] * 2
    assert db.value("SELECT repeat FROM task WHERE id = %s", [db.insert("SELECT 1", delete=False)]) == timedelta(
        minutes=5)
    with pytest.raises(psycopg.errors.CheckViolation, match="cron and task.repeat"):
        db.insert("SELECT 1", cron="0 3 * * *", repeat="1 min")
    db.sql("RESET pg_task.repeat")


def test_a_superusers_session_checks_its_rows_after_the_scheduler_made_a_next_run_in_it(db):
    """task_cancel of a series' waiting run makes the series' next run in the caller's session,
    marked as the scheduler's own (pgtaskpy.next_run) for that transaction.  After it, the mark
    reads '' (not NULL): the superuser's session went on skipping every row check, and took a
    cron of hour 25, an infinite plan and a cron beside a repeat."""
    db.sql("SELECT task_schedule('nightly', '0 0 * * *', 'SELECT 1')")
    assert db.value("SELECT task_cancel(id) FROM task WHERE key = 'nightly' AND state = 'PLAN'") is True
    assert db.value("SELECT current_setting('pgtaskpy.next_run', true)") == ""
    with pytest.raises(psycopg.errors.CheckViolation, match='invalid task.cron "0 25'):
        db.insert("SELECT 1", cron="0 25 * * *")
    with pytest.raises(psycopg.errors.CheckViolation, match="cron and task.repeat"):
        db.insert("SELECT 1", cron="0 3 * * *", repeat="1 hour")
    with pytest.raises(psycopg.errors.CheckViolation, match="plan"):
        db.insert("SELECT 1", plan="infinity")
    assert db.value("SELECT count(*) FROM task WHERE key IS NULL") == 0


def test_day_fields_follow_vixie_cron(db):
    """A day matches both day fields when either starts with "*" (so "*/2" restricts with AND, as in
    pg_cron; croniter differs here), and either field when both are restricted."""
    after = datetime(2023, 12, 31, tzinfo=UTC)
    odd_mondays = next_runs(db, "0 0 */2 * mon", "UTC", 12, after)
    assert all(run.weekday() == 0 and run.day % 2 == 1 for run in odd_mondays)
    assert odd_mondays[:3] == [datetime(2024, 1, d, tzinfo=UTC) for d in (1, 15, 29)]
    either = next_runs(db, "0 0 1-31/2 * mon", "UTC", 40, after)
    assert either == croniter_runs("0 0 1-31/2 * mon", 40, after)  # no "*": odd days or Mondays
    assert {run.weekday() for run in either if run.day % 2 == 0} == {0}
    # Sunday is 0 and 7; the macros are their five fields.
    assert next_runs(db, "0 0 * * 7", "UTC", 5, after) == next_runs(db, "0 0 * * 0", "UTC", 5, after)
    assert next_runs(db, "@weekly", "UTC", 5, after) == next_runs(db, "0 0 * * sun", "UTC", 5, after)
    # "$" is the last day of each month, leap years included.
    assert [r.date().isoformat() for r in next_runs(db, "0 12 $ * *", "UTC", 3, "2100-01-15+00")] == \
        ["2100-01-31", "2100-02-28", "2100-03-31"]
    assert [r.date().isoformat() for r in next_runs(db, "0 12 $ 2 *", "UTC", 3, "2023-06-01+00")] == \
        ["2024-02-29", "2025-02-28", "2026-02-28"]


def test_seconds_intervals_are_on_the_clock(db):
    """pg_cron's 'N seconds' (1-59): every N seconds of the clock, in any zone."""
    assert next_runs(db, "5 seconds", "Europe/Berlin", 3, "2024-01-15 00:00:03.5+00") == [
        datetime(2024, 1, 15, 0, 0, s, tzinfo=UTC) for s in (5, 10, 15)]
    assert next_runs(db, "000005 seconds", "UTC", 3, "2024-01-15 00:00:03.5+00") == [
        datetime(2024, 1, 15, 0, 0, s, tzinfo=UTC) for s in (5, 10, 15)]
    assert next_runs(db, "1 second", None, 2, "2024-01-15 00:00:03+00") == [
        datetime(2024, 1, 15, 0, 0, s, tzinfo=UTC) for s in (4, 5)]
    runs = next_runs(db, " 59 SECONDS ", None, 3, "2024-01-15 00:00:00+00")  # on the epoch's 59 s grid
    assert [b - a for a, b in zip(runs, runs[1:])] == [59 * SECOND] * 2
    assert runs[0].timestamp() % 59 == 0 and runs[0] - datetime(2024, 1, 15, tzinfo=UTC) <= 59 * SECOND


# --- daylight saving -------------------------------------------------------------------------

def instant_of(local: datetime, zone: ZoneInfo) -> datetime:
    """The rule, computed with zoneinfo: a wall time that occurs twice is its first occurrence; one
    that does not exist is the first instant whose wall time is past it (the end of the gap)."""
    first = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == local:
        return first  # fold=0: the earlier of two occurrences (PEP 495)
    instant = min(first, local.replace(tzinfo=zone, fold=1).astimezone(UTC))
    while instant.astimezone(zone).replace(tzinfo=None) < local:
        instant += timedelta(minutes=1)
    return instant


def reference_runs(cron: str, tz: str, n: int, after: datetime) -> list[datetime]:
    """croniter for the wall times that match, instant_of to place them on the time line."""
    zone = ZoneInfo(tz)
    matches = croniter(cron, after.astimezone(zone).replace(tzinfo=None) - timedelta(hours=3))
    runs: set[datetime] = set()
    while len(runs) < n:
        instant = instant_of(matches.get_next(datetime), zone)
        if instant > after:
            runs.add(instant)
    return sorted(runs)[:n]


# (zone, the day before a spring-forward change, the day before a fall-back change)
TRANSITIONS = [
    ("America/New_York", "2024-03-09", "2024-11-02"),   # north: 02:00 -> 03:00, 02:00 -> 01:00
    ("Europe/Berlin", "2024-03-30", "2024-10-26"),      # north: 02:00 -> 03:00, 03:00 -> 02:00
    ("Australia/Sydney", "2024-10-05", "2024-04-06"),   # south: 02:00 -> 03:00, 03:00 -> 02:00
    ("America/Santiago", "2024-09-07", "2024-04-06"),   # south, at midnight: 00:00 -> 01:00, 00:00 -> 23:00
    ("Australia/Lord_Howe", "2024-10-05", "2024-04-06"),  # half an hour: 02:00 -> 02:30, 02:00 -> 01:30
]
DST_EXPRESSIONS = ["30 2 * * *", "0 2 * * *", "0 3 * * *", "30 1 * * *", "0 0 * * *", "45 23 * * *",
                   "*/15 * * * *", "*/20 0-3 * * *", "0 * * * *", "10,40 2 * * *"]


@pytest.mark.parametrize(("tz", "spring", "fall"), TRANSITIONS)
def test_daylight_saving_runs_once(db, tz, spring, fall):
    for day in (spring, fall):
        for hour in (0, 12, 22):
            after = datetime.fromisoformat(day).replace(hour=hour, tzinfo=ZoneInfo(tz)).astimezone(UTC)
            for cron in DST_EXPRESSIONS:
                runs = next_runs(db, cron, tz, 120, after)
                assert runs == reference_runs(cron, tz, 120, after), (tz, cron, after)
                assert len(set(runs)) == len(runs)


def test_a_daily_repeat_keeps_its_local_time_in_its_tz_whoever_ends_it(running):
    """`repeat => '1 day'` with `tz`: each run at the plan's local time in that zone, across
    daylight-saving changes, whatever the TimeZone of the session that ends a run (the worker's:
    the database's, UTC here; a client's that cancels a waiting run: Tokyo's)."""
    summer = "2026-07-01 12:00 America/New_York"  # (EDT: 16:00 UTC; 17:00 UTC in winter)
    first = running.insert("SELECT 1", repeat="1 day", plan=summer, tz="America/New_York", delete=False)
    running.wait_done(first)
    run = wait_until(lambda: running.sql("SELECT id, plan AT TIME ZONE 'America/New_York' FROM task"
                                         " WHERE parent = %s", [first]), message="the next run")[0]
    assert run[1].time().isoformat() == "12:00:00", run
    with running.connect() as client:
        client.execute("SET TimeZone = 'Asia/Tokyo'")
        assert client.execute("SELECT task_cancel(%s)", [run[0]]).fetchone()[0] is True
    after_cancel = wait_until(lambda: running.sql("SELECT plan AT TIME ZONE 'America/New_York' FROM task"
                                                  " WHERE parent = %s", [run[0]]), message="the run after it")[0]
    assert after_cancel[0].time().isoformat() == "12:00:00" and after_cancel[0].date() > run[1].date(), after_cancel


@pytest.mark.parametrize("zone", ["America/Santiago", "Australia/Lord_Howe", "Europe/Berlin"])
def test_a_repeat_in_a_tz_is_summed_as_postgresql_sums_it_in_that_timezone(db, zone):
    """A repeat's next plan is the last one plus the repeat as PostgreSQL adds them in a session of
    the task's tz (README, `tz`): the months, then the days, then the time.  The months and days
    in one step differed where the month landed in a spring-forward gap (Santiago, 2024-08-08
    00:16 + '1 mon 1 day': 09-09 00:16, where PostgreSQL says 01:16; a probe: 5 in 100,000)."""
    db.sql(f"SET TimeZone = '{zone}'")
    try:
        differing = db.sql(
            "SELECT m, s, m + s, pgtaskpy.plus_in_zone(m, s, %s)"
            " FROM generate_series(timestamptz '2024-08-01 00:00+00', timestamptz '2024-10-15 00:00+00',"
            "                      interval '17 minutes') AS m,"
            "      unnest(ARRAY['1 day', '1 mon', '1 mon 1 day', '1 day 1 hour',"
            "                    '1 year 2 mons 3 days 04:05']::interval[]) AS s"
            " WHERE m + s IS DISTINCT FROM pgtaskpy.plus_in_zone(m, s, %s)", [zone, zone])
    finally:
        db.sql("RESET TimeZone")
    assert differing == []


def test_a_daily_repeat_in_an_abbreviations_zone_goes_on(running):
    """A tz that is an abbreviation (PST: UTC-8 all year, as cron reads it) is no TimeZone the
    server takes: a daily repeat counted by setting it ended its first run FAIL, series gone."""
    first = running.insert("SELECT 1", repeat="1 day", plan="2026-07-01 12:00-08", tz="PST", active="1000 days",
                           delete=False)
    assert running.wait_done(first)["state"] == "DONE", running.task(first)
    run = wait_until(lambda: running.sql("SELECT plan AT TIME ZONE 'UTC' FROM task WHERE parent = %s", [first]),
                     message="the next run")[0]
    assert run[0].time().isoformat() == "20:00:00", run


def test_an_abbreviation_is_read_by_one_list_whoever_reads_it(db):
    """IST is India's +05:30 by timezone_abbreviations 'India' and Israel's +02:00 by 'Default': a
    series its author scheduled where the database's list was India's was planned by the one as
    she checked it and inserted it, and by the other as the scheduler planned its next runs (a
    probe).  A session with a list other than Default may not name an abbreviation; the plans
    are made by Default whoever makes them: the scheduler, whatever the database's list, and a
    task_cancel of the waiting run in such a session (a review), which its owner may call."""
    db.sql(f"ALTER DATABASE {db.name} SET timezone_abbreviations = 'India'")
    db.sql("CREATE ROLE tz_ann LOGIN IN ROLE pgtaskpy_user")
    try:
        with db.connect("tz_ann") as ann:
            ann.autocommit = True
            with pytest.raises(psycopg.errors.InvalidParameterValue, match='this session reads "IST" by its'
                               " timezone_abbreviations 'India' as the offset 05:30:00, and the scheduler by"
                               " 'Default' as the offset 02:00:00"):
                ann.execute("SELECT task_next_runs('0 12 * * *', 'IST', 1)")
            with pytest.raises(psycopg.errors.CheckViolation, match='this session reads "IST"'):
                ann.execute("INSERT INTO task (input, cron, tz) VALUES ('SELECT 1', '0 12 * * *', 'IST')")
            ann.execute("SELECT task_next_runs('0 12 * * *', 'Asia/Kolkata', 1)")  # (a zone's name: any list)
            ann.execute("SET timezone_abbreviations = 'Default'")
            first = ann.execute("INSERT INTO task (input, cron, tz, plan, \"delete\") VALUES ('SELECT 1',"
                                " '0 12 * * *', 'IST', now() - interval '1 s', false) RETURNING id").fetchone()[0]
        launcher = db.launcher()
        assert db.wait_done(first)["state"] == "DONE"
        second = wait_until(lambda: db.sql("SELECT id, plan AT TIME ZONE 'UTC' FROM task WHERE parent = %s",
                                           [first]), message="the next run")[0]
        assert second[1].time().isoformat() == "10:00:00", second  # (India's: 06:30)
        assert launcher.stop() == 0, launcher.output()
        with db.connect("tz_ann") as ann:  # (the database's list, India's)
            ann.autocommit = True
            ann.execute("UPDATE task SET input = 'SELECT 2' WHERE id = %s", [second[0]])  # (tz as it was)
            assert ann.execute("SELECT task_cancel(%s)", [second[0]]).fetchone() == (True,)
            failed = db.value("INSERT INTO task (input, tz, owner, state, stop) VALUES ('SELECT 1', 'IST', 'tz_ann',"
                              " 'FAIL', now()) RETURNING id")
            assert ann.execute("SELECT task_retry(%s) IS NOT NULL", [failed]).fetchone() == (True,)  # (a review)
            with pytest.raises(psycopg.errors.CheckViolation, match='this session reads "IST"'):  # (not a copy)
                ann.execute("INSERT INTO task (input, tz, parent) VALUES ('SELECT 1', 'IST', %s)", [failed])
            # (EST names a zone and is Default's -05:00, and Australia's list reads it +10:00: a review)
            ann.execute("SET timezone_abbreviations = 'Australia'")
            with pytest.raises(psycopg.errors.InvalidParameterValue, match='this session reads "EST" by its'
                               " timezone_abbreviations 'Australia' as the offset 10:00:00"):
                ann.execute("SELECT task_next_runs('0 12 * * *', 'EST', 1)")
            ann.execute("SELECT task_next_runs('0 12 * * *', 'PST', 1)")  # (the same offset in both lists)
        third = db.sql("SELECT plan AT TIME ZONE 'UTC' FROM task WHERE parent = %s AND state = 'PLAN'", [second[0]])
        assert third == [(second[1] + timedelta(days=1),)], third
    finally:
        db.sql("DELETE FROM task")
        db.sql("DROP OWNED BY tz_ann; DROP ROLE tz_ann")


def test_daylight_saving_examples(db):
    """The rule in the README, north and south."""
    def utc(text: str) -> datetime:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    # New York springs forward on 10 March 2024 at 02:00: 02:30 does not exist, the run is at 03:00 EDT.
    assert next_runs(db, "30 2 * * *", "America/New_York", 3, "2024-03-09 12:00+00") == \
        [utc("2024-03-10 07:00"), utc("2024-03-11 06:30"), utc("2024-03-12 06:30")]
    # Every 15 minutes through the gap: one run at 03:00 EDT for the four that do not exist.
    assert next_runs(db, "*/15 * * * *", "America/New_York", 3, "2024-03-10 06:40+00") == \
        [utc("2024-03-10 06:45"), utc("2024-03-10 07:00"), utc("2024-03-10 07:15")]
    # It falls back on 3 November at 02:00: 01:30 comes twice, the run is at the first (EDT).
    assert next_runs(db, "30 1 * * *", "America/New_York", 2, "2024-11-02 12:00+00") == \
        [utc("2024-11-03 05:30"), utc("2024-11-04 06:30")]
    # Sydney springs forward on 6 October 2024 at 02:00 and falls back on 7 April at 03:00.
    assert next_runs(db, "30 2 * * *", "Australia/Sydney", 2, "2024-10-05 00:00+00") == \
        [utc("2024-10-05 16:00"), utc("2024-10-06 15:30")]
    assert next_runs(db, "30 2 * * *", "Australia/Sydney", 2, "2024-04-06 00:00+00") == \
        [utc("2024-04-06 15:30"), utc("2024-04-07 16:30")]
    # 03:00 in New York is 03:00 local on every day of the year, whatever the offset.
    zone = ZoneInfo("America/New_York")
    year = next_runs(db, "0 3 * * *", "America/New_York", 366, "2024-01-01 00:00-05")
    assert [run.astimezone(zone).strftime("%H:%M") for run in year] == ["03:00"] * 366
    assert len({run.astimezone(zone).date() for run in year}) == 366
    assert {run.astimezone(zone).utcoffset() for run in year} == {timedelta(hours=-5), timedelta(hours=-4)}


def test_tz_default_from_setting(db):
    assert db.task(db.insert("SELECT 1"))["tz"] == "UTC"
    db.sql("SET pg_task.tz = 'Asia/Tokyo'")
    row = db.task(db.insert("SELECT 1", cron="0 9 * * *"))
    assert row["tz"] == "Asia/Tokyo"
    assert row["plan"] == next_runs(db, "0 9 * * *", None, 1, row["plan"] - timedelta(days=1))[0]
    assert row["plan"].astimezone(ZoneInfo("Asia/Tokyo")).strftime("%H:%M") == "09:00"
    db.sql("SET pg_task.tz = 'Mars/Olympus_Mons'")
    with pytest.raises(psycopg.errors.CheckViolation, match='invalid task.tz "Mars/Olympus_Mons"'):
        db.insert("SELECT 1")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:  # (no tz given: the setting's, said so)
        next_runs(db, "0 9 * * *", None, 1, row["plan"])
    assert "it is the setting pg_task.tz = 'Mars/Olympus_Mons'" in raised.value.diag.message_hint


def test_insert_plans_the_first_match_unless_a_plan_is_given(db):
    before = db.value("SELECT clock_timestamp()")
    first = db.task(db.insert("SELECT 1", cron="0 3 * * *", tz="Europe/Berlin"))
    after = db.value("SELECT clock_timestamp()")
    assert first["plan"] in {next_runs(db, "0 3 * * *", "Europe/Berlin", 1, t)[0] for t in (before, after)}
    assert first["plan"].astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") == "03:00"
    explicit = db.value("SELECT now() + interval '90 s'")
    assert db.task(db.insert("SELECT 1", cron="0 3 * * *", plan=explicit))["plan"] == explicit
    # A waiting task whose expression or zone changes moves to the new first match; its plan stays
    # when the plan is given in the same UPDATE.
    db.sql("UPDATE task SET cron = '0 4 * * *' WHERE id = %s", [first["id"]])
    assert db.task(first["id"])["plan"].astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") == "04:00"
    db.sql("UPDATE task SET tz = 'Asia/Tokyo' WHERE id = %s", [first["id"]])
    assert db.task(first["id"])["plan"].astimezone(ZoneInfo("Asia/Tokyo")).strftime("%H:%M") == "04:00"
    db.sql("UPDATE task SET cron = '0 5 * * *', plan = %s WHERE id = %s", [explicit, first["id"]])
    assert db.task(first["id"])["plan"] == explicit


# (an error quotes the token as written: "l" for L was the lower-cased copy's; and the day forms
# of Quartz and croniter, which a user coming from them writes, are named)
QUARTZ = '; L, W, # and ? are not read here: "$" is the last day of the month'
BAD = [
    ("0 25 * * *", 'cron field "hour": 25 is out of range 0-23'),
    ("60 * * * *", 'cron field "minute": 60 is out of range 0-59'),
    ("0 0 0 * *", 'cron field "day of month": 0 is out of range 1-31'),
    ("0 0 * 13 *", 'cron field "month": 13 is out of range 1-12'),
    ("0 0 * * 8", 'cron field "day of week": 8 is out of range 0-7'),
    ("0 0 * foo *", 'cron field "month": "foo" is not a number or a month name (jan-dec)'),
    ("0 0 * * funday", 'cron field "day of week": "funday" is not a number or a day name (sun-sat)'),
    ("0 0 L * *", 'cron field "day of month": "L" is not a number or $ (the last day of the month)' + QUARTZ),
    ("0 0 15W * *", 'cron field "day of month": "15W" is not a number or $ (the last day of the month)' + QUARTZ),
    ("0 0 ? * MON", 'cron field "day of month": "?" is not a value, a range or a step' + QUARTZ),
    ("0 0 * * 5L", 'cron field "day of week": "5L" is not a number or a day name (sun-sat)' + QUARTZ),
    ("0 0 * * MONDAY", 'cron field "day of week": "MONDAY" is not a number or a day name (sun-sat)'),
    ("0 0 * Dec-Jan *", 'cron field "month": range Dec-Jan runs backwards'),
    ("0 0 jul * *", 'cron field "day of month": "jul" is not a number or $ (the last day of the month)'),
    ("0 0 1-L * *", 'cron field "day of month": "L" is not a number or $ (the last day of the month)' + QUARTZ),
    ("0 0 * * SUN-L", 'cron field "day of week": "L" is not a number or a day name (sun-sat)' + QUARTZ),
    ("5/10 * * * *", 'cron field "minute": "5/10": a step needs a range or "*" (5-59/10)'),
    ("*/0 * * * *", 'cron field "minute": step 0 is out of range 1-60'),
    ("0 5-2 * * *", 'cron field "hour": range 5-2 runs backwards'),
    ("0 0 1,,2 * *", 'cron field "day of month": "" is not a value, a range or a step'),
    ("0 0 * * 1#2", 'cron field "day of week": "1#2" is not a value, a range or a step' + QUARTZ),
    ("$ * * * *", 'cron field "minute": "$" (the last day of the month) belongs in the day-of-month field'),
    ("0 0 $-3 * *", 'cron field "day of month": "$-3": "$" takes no range or step'),
    ("0 0 1-$ * *", 'cron field "day of month": "1-$" is not a value, a range or a step'),
    ("0 0 31 2 *", 'cron expression "0 0 31 2 *" never matches'),
    ("0 0 30,31 feb *", 'cron expression "0 0 30,31 feb *" never matches'),
    ("* * * *", 'cron expression "* * * *" has 4 fields'),
    ("* * * * * *", 'cron expression "* * * * * *" has 6 fields'),
    ("", 'cron expression "" has 0 fields'),
    ("@reboot", 'cron macro "@reboot" is unknown'),
    ("0 seconds", 'cron interval "0 seconds": the seconds must be from 1 to 59'),
    ("60 seconds", 'cron interval "60 seconds": the seconds must be from 1 to 59'),
]


@pytest.mark.parametrize(("cron", "message"), BAD)
def test_bad_expression_is_rejected_naming_field_and_token(db, cron, message):
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        db.insert("SELECT 1", cron=cron)
    assert f'invalid task.cron "{cron}": {message}' in str(raised.value)
    assert raised.value.diag.constraint_name == "task.cron must be a cron expression that matches"
    with pytest.raises(psycopg.errors.CheckViolation, match=re.escape(message)):
        db.value("SELECT task_schedule('bad', %s, 'SELECT 1')", [cron])
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        next_runs(db, cron, "UTC", 1, "2024-01-01+00")
    assert message in str(raised.value)
    assert (QUARTZ in str(raised.value)) == (QUARTZ in message)  # (named for those forms only: not "jul")
    assert db.value("SELECT count(*) FROM task") == 0  # nothing inserted


def test_a_day_range_may_end_on_sunday_by_name(db):
    """`sat-sun` and `mon-sun` were refused, "range sat-sun runs backwards" (`sun` is 0), where
    `6-7` and `1-7` were taken: a range that ends on `sun` ends the week."""
    for named, numbered in (("sat-sun", "6-7"), ("mon-sun", "1-7"), ("fri-sun/2", "5-7/2"), ("sun-sun", "0"),
                            ("sun-sat", "0-6"), ("0-sun", "0"), ("sun-7", "0-7")):  # (README's two edges)
        assert (next_runs(db, f"0 0 * * {named}", "UTC", 10, "2024-01-01 00:00+00")
                == next_runs(db, f"0 0 * * {numbered}", "UTC", 10, "2024-01-01 00:00+00")), named
    assert [run.strftime("%a") for run in next_runs(db, "0 0 * * sat-sun", "UTC", 4, "2024-01-01 00:00+00")] == [
        "Sat", "Sun", "Sat", "Sun"]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="step 0 is out of range 1-8"):
        next_runs(db, "0 0 * * sun-sat/0", "UTC", 1, "2024-01-01 00:00+00")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="range sat-mon runs backwards"):
        next_runs(db, "0 0 * * sat-mon", "UTC", 1, "2024-01-01 00:00+00")


def test_bad_time_zone_and_cron_with_repeat_are_rejected(db):
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        db.insert("SELECT 1", cron="@daily", tz="Europe/Atlantis")
    assert 'invalid task.tz "Europe/Atlantis": time zone "Europe/Atlantis" not recognized' in str(raised.value)
    assert raised.value.diag.constraint_name == "task.tz must be a time zone PostgreSQL knows"
    with pytest.raises(psycopg.errors.CheckViolation, match="Europe/Atlantis"):
        db.value("SELECT task_schedule('nightly', '@daily', 'SELECT 1', 'Europe/Atlantis')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Europe/Atlantis"):
        next_runs(db, "@daily", "Europe/Atlantis", 1, "2024-01-01+00")
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        db.insert("SELECT 1", cron="@daily", repeat="1 hour")
    assert raised.value.diag.constraint_name == "task.cron and task.repeat must not both be set"
    assert db.value("SELECT count(*) FROM task") == 0
    # An UPDATE to a bad value changes nothing.
    task_id = db.insert("SELECT 1", cron="@daily", tz="Europe/Berlin")
    before = db.task(task_id)
    for column, value in (("cron", "0 0 * * 9"), ("tz", "Nowhere/Land"), ("repeat", "1 min")):
        with pytest.raises(psycopg.errors.CheckViolation):
            db.sql(sql.SQL("UPDATE task SET {} = %s WHERE id = %s").format(sql.Identifier(column)), [value, task_id])
    assert db.task(task_id) == before
    # Any name PostgreSQL accepts: zone names, abbreviations, POSIX zones.
    for tz in ("UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "EST5EDT", "PST", "UTC+3"):
        assert db.task(db.insert("SELECT 1", cron="@daily", tz=tz))["tz"] == tz


# --- through the launcher --------------------------------------------------------------------

CHAIN = ("WITH RECURSIVE s AS (SELECT * FROM task WHERE id = %s"
         " UNION ALL SELECT t.* FROM task t JOIN s ON t.parent = s.id)")


def series(db, first: int) -> list[dict]:
    """The runs of a series, first run first, following parent."""
    cursor = db.conn.execute(
        f"{CHAIN} SELECT id, parent, plan, start, stop, state::text AS state, input, cron, tz, key FROM s ORDER BY id",
        [first])
    return [dict(zip([d.name for d in cursor.description], row)) for row in cursor.fetchall()]


def ended(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["state"] not in ("PLAN", "TAKE", "WORK")]


def end_all(db) -> None:
    """Stop every waiting task until none is left (a run in progress may insert one as it ends)."""
    def ended_all() -> bool:
        db.sql("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")
        return db.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") == 0
    wait_until(ended_all, 30, 0.05, f"every series to end; unfinished: {db.unfinished()}")


def assert_one_next_row_each(db) -> None:
    assert db.value("SELECT count(*) - count(DISTINCT parent) FROM task WHERE parent IS NOT NULL") == 0
    assert db.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") <= 1


def spare_worker_warm(db) -> bool:
    """Whether the launcher's spare worker has PL/Python and its code loaded (its warm-up call
    returned): a run that meets it still warming waits for that, 50-70 ms of CPU, longer when
    the cores are shared (tests in two processes)."""
    return db.value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'pg_task_py worker' AND state = 'idle'"
                    " AND query LIKE 'CALL pgtaskpy.run_task(0, %'") > 0


@pytest.mark.parametrize("zone", ["CET", "EET", "WET", "MET", "cet"])
def test_a_zone_postgresql_reads_as_a_fixed_abbreviation_is_refused(db, zone):
    """AT TIME ZONE reads CET, EET, WET and MET as the abbreviations of fixed offsets, not as the
    zones of those names, which have daylight saving: a series in CET ran an hour late all summer."""
    with pytest.raises(psycopg.errors.CheckViolation, match="as the abbreviation of the fixed offset"):
        db.insert("SELECT 1", cron="0 3 * * *", tz=zone)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="as the abbreviation of the fixed offset"):
        next_runs(db, "0 3 * * *", zone, 1, "2027-04-01 00:00+00")
    assert db.value("SELECT count(*) FROM task") == 0


@pytest.mark.parametrize("zone", ["CEST", "BST", "edt", "AEDT"])
def test_a_summer_times_abbreviation_is_refused(db, zone):
    """CEST, BST, EDT and the like are read as the summer's fixed offset all year: a daily job in
    BST ran at 11:00 UTC all winter, an hour off, where CET was refused (a probe)."""
    with pytest.raises(psycopg.errors.CheckViolation, match="as the summer time's fixed offset"):
        db.insert("SELECT 1", cron="0 3 * * *", tz=zone)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="as the summer time's fixed offset"):
        next_runs(db, "0 3 * * *", zone, 1, "2027-01-15 00:00+00")
    assert db.value("SELECT count(*) FROM task") == 0


@pytest.mark.parametrize("zone", ["localtime", "posixrules"])
def test_the_hosts_own_zone_is_refused(db, zone):
    """`localtime` is whatever zone the server's host is set to: another server of a failover, or a
    restore, may run the series at other hours.  A zone's name says which."""
    with pytest.raises(psycopg.errors.CheckViolation, match="a link that the server's time zone files set"):
        db.insert("SELECT 1", cron="0 3 * * *", tz=zone)


def test_zones_that_match_their_abbreviation_are_accepted(db):
    """UTC, GMT and EST never leave their abbreviation's offset: read either way, the same."""
    for zone, hour in (("UTC", 3), ("GMT", 3), ("EST", 8)):
        assert next_runs(db, "0 3 * * *", zone, 1, "2027-07-01 00:00+00")[0].hour == hour
    with db.connect() as conn, conn.transaction(force_rollback=True):  # (the check reads zones through TimeZone)
        conn.execute("SET TimeZone = 'Asia/Tokyo'")
        conn.execute("SELECT task_next_runs('0 3 * * *', 'EST', 1)")
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)


def test_a_running_series_key_takes_no_one_off_task(running):
    """A one-off task under the key of a series whose run was running took the key from the next
    run, and the series ended without a word; 'replace' gave a series' waiting run its input."""
    running.value("SELECT task_schedule('beat', '1 seconds', 'SELECT pg_sleep(0.6), ''series''')")

    def state_of_key() -> list[str]:
        return [row[0] for row in running.sql("SELECT state::text FROM task WHERE key = 'beat'"
                                              " AND state IN ('PLAN', 'TAKE', 'WORK')")]

    later = running.insert("SELECT 'one-off'", key="report", plan=datetime(2099, 1, 1, tzinfo=timezone.utc))
    wait_until(lambda: state_of_key() == ["WORK"], 20, 0.01, "a run of the series running, none waiting")
    # (nor a waiting task's key changed to it: the series ended, its next run the one-off of 2099)
    with pytest.raises(psycopg.errors.UniqueViolation, match="key \"beat\" names a series of postgres"):
        running.sql("UPDATE task SET key = 'beat' WHERE id = %s", [later])
    running.sql("INSERT INTO task (input, key, state) VALUES ('SELECT 1', 'beat', 'STOP')")  # (waits for nothing)
    with pytest.raises(psycopg.errors.UniqueViolation, match="key \"beat\" names a series of postgres"):
        running.value("SELECT task_enqueue('SELECT ''now''', key => 'beat', on_conflict => 'skip')")
    wait_until(lambda: state_of_key() == ["PLAN"], 20, 0.01, "the series' next run waiting")
    for repeat in ("NULL", "'1 s'"):  # (a repeat of the call's own changed nothing, but let the input through)
        with pytest.raises(psycopg.errors.UniqueViolation, match="names a series: .* would change what each"):
            running.value(f"SELECT task_enqueue('SELECT ''now''', key => 'beat', on_conflict => 'replace',"
                          f" repeat => {repeat})")
    assert running.value("SELECT input FROM task WHERE key = 'beat' AND state = 'PLAN'") == \
        "SELECT pg_sleep(0.6), 'series'"
    assert running.value("SELECT task_unschedule('beat')") is True


def test_one_second_series_through_the_launcher_and_a_restart(db):
    launcher = db.launcher()
    wait_until(lambda: spare_worker_warm(db), 10, 0.02, "the spare worker to be warm")
    before = db.value("SELECT now()")
    first = db.insert("SELECT 1", cron="1 seconds", delete=False)
    plan = db.task(first)["plan"]  # the first whole second after the insert (read before it: a busy machine's
    assert plan > before and plan.microsecond == 0  # next statement came after that second)
    wait_until(lambda: len(ended(series(db, first))) >= 5, 20, 0.05, "5 runs")
    assert launcher.stop() == 0, launcher.output()
    before_restart = len(ended(series(db, first)))
    launcher = db.launcher()
    wait_until(lambda: len(ended(series(db, first))) >= before_restart + 5, 20, 0.05, "5 runs after the restart")
    assert launcher.stop() == 0, launcher.output()
    rows = series(db, first)
    runs = ended(rows)
    assert all(r["state"] == "DONE" for r in runs)
    assert all(r["plan"].microsecond == 0 for r in rows)  # on the clock's seconds
    assert [r["parent"] for r in rows[1:]] == [r["id"] for r in rows[:-1]]  # one next row per run
    assert_one_next_row_each(db)
    assert len(rows) == len(runs) + 1 and rows[-1]["state"] == "PLAN"  # the series waits on
    assert most_at_once([(r["start"], r["stop"]) for r in runs]) == 1  # runs never overlap
    assert {(r["cron"], r["tz"]) for r in rows} == {("1 seconds", "UTC")}
    # While a launcher runs, a run that ended before the next second is followed by that second's
    # match, and each run starts within 0.8 s of its plan (a generous bound: 100 ms failed once on
    # a CI machine running other work beside it; a run that a stall of the machine's keeps past
    # its next second skips that match, as any missed match is skipped).  The restart (no launcher
    # for a moment) skips the matches it missed rather than running them late.
    restart = before_restart  # the index of the first run planned after the first launcher stopped
    for earlier, later in zip(runs, runs[1:]):
        step = later["plan"] - earlier["plan"]
        assert step >= SECOND and step.microseconds == 0, (earlier, later)
        if runs[restart] not in (earlier, later) and earlier["stop"] < earlier["plan"] + SECOND:
            assert step == SECOND, (earlier, later)
    for run in runs:
        if run is not runs[restart]:
            assert run["start"] - run["plan"] < timedelta(milliseconds=800), run


def test_missed_matches_are_skipped_and_failures_repeat(running):
    slow = running.insert("SELECT pg_sleep(1.3)", cron="1 seconds", delete=False)
    failing = running.insert("SELECT 1/0", cron="1 seconds", group="failing")
    wait_until(lambda: len(ended(series(running, slow))) >= 3 and len(ended(series(running, failing))) >= 3,
               30, 0.05, "3 runs of each series")
    end_all(running)
    runs = ended(series(running, slow))
    for earlier, later in zip(runs, runs[1:]):
        if later["state"] == "STOP":
            continue
        # the first match after the run ended: one run, not a burst of the missed ones
        assert later["plan"].microsecond == 0
        assert timedelta(0) < later["plan"] - earlier["stop"] <= SECOND + timedelta(milliseconds=50)
        assert later["plan"] - earlier["plan"] >= 2 * SECOND
    fails = ended(series(running, failing))
    assert [r["state"] for r in fails[:3]] == ["FAIL"] * 3  # a failed run has its next run too
    assert_one_next_row_each(running)


def test_minute_cron_with_time_zone_and_key_through_the_launcher(running):
    # Begun well inside a minute: a first run that ended in a minute's last second had its next
    # run started by the time the test looked (the next minute's), not waiting.
    wait_until(lambda: running.value("SELECT extract(second FROM clock_timestamp())") < 45, 20,
               message="a minute's first 45 seconds")
    first = running.insert("SELECT 'tick'", cron="* * * * *", tz="Asia/Kolkata", key="ticks", delete=False,
                           plan=running.value("SELECT now()"))  # an explicit plan: the first run now
    done = running.wait_done(first)
    assert done["state"] == "DONE" and done["output"] == "tick"
    following = series(running, first)[1]
    assert (following["cron"], following["tz"], following["key"], following["state"]) == \
        ("* * * * *", "Asia/Kolkata", "ticks", "PLAN")
    assert following["plan"] == next_runs(running, "* * * * *", "Asia/Kolkata", 1, done["stop"])[0]
    assert following["plan"].second == 0 and following["plan"] - done["stop"] <= timedelta(minutes=1)
    # The view: the series, its next plan and its last run.
    view = running.sql("SELECT key, id, state::text, cron, tz, next_plan, last_state::text, last_stop, input"
                       " FROM task_series")
    assert view == [("ticks", following["id"], "PLAN", "* * * * *", "Asia/Kolkata", following["plan"], "DONE",
                     done["stop"], "SELECT 'tick'")]


def test_task_cancel_with_stop_series_ends_a_cron_series(running):
    first = running.insert("SELECT pg_sleep(30)", cron="1 seconds")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE id = %s", [first]) == "WORK", 20)
    assert running.value("SELECT task_cancel(%s, true)", [first]) is True
    assert running.wait_done(first)["state"] == "FAIL"
    assert running.value("SELECT count(*) FROM task") == 1  # no next run


def test_a_run_that_cancels_itself_with_stop_series_is_told_its_series_goes_on(running):
    """task_cancel(own id, stop_series => true) from the run itself: the cancel rolled back the
    series' end with the run's transaction, and the series went on, the call's promise broken
    without a word.  Now the call fails saying so (the run ends FAIL with it), and the series goes
    on as after any failed run; task_unschedule from the run ends it."""
    first = running.insert("SELECT task_cancel(current_setting('pg_task.id')::bigint, stop_series => true)",
                           repeat="1 s", key="self", delete=False)
    row = running.wait_done(first, 20)
    assert (row["state"], row["sqlstate"]) == ("FAIL", "55000"), row
    assert row["error"].startswith(f"ERROR:  task {first} cannot end its own series with task_cancel\nDETAIL:  "), row
    assert "task_unschedule(key)" in row["error"] and "SET repeat = '0', cron = NULL" in row["error"], row
    assert running.value("SELECT count(*) FROM task WHERE key = 'self' AND state = 'PLAN'") == 1  # it goes on
    assert running.value("SELECT task_cancel(id, true) FROM task WHERE key = 'self' AND state = 'PLAN'") is True


@pytest.mark.parametrize("owner", ["postgres", "series_author"])
@pytest.mark.parametrize("schedule", [{"repeat": "1 s"}, {"cron": "1 seconds"}])
def test_a_run_ends_its_unnamed_series_by_its_own_row(running, schedule, owner):
    """A series without a key has no task_unschedule: its run ends it by writing its own row, as
    README and task_cancel's HINT say (the end reads the row as it is then).  A task author's
    run was refused, `task N is running: only its data can change`, and its series went on
    failing at every run (a probe)."""
    ends = "UPDATE task SET repeat = '0', cron = NULL WHERE id = current_setting('pg_task.id')::bigint"
    if owner == "postgres":
        first = running.insert(ends, delete=False, **schedule)
    else:
        running.sql("CREATE ROLE series_author LOGIN IN ROLE pgtaskpy_user")
        with running.connect("series_author") as author:
            first = insert_as(author, ends, delete=False, **schedule)
    try:
        row = running.wait_done(first, 20)
        assert (row["state"], row["output"]) == ("DONE", "UPDATE 1"), row
        assert running.value("SELECT count(*) FROM task") == 1  # no next run
        if owner != "postgres":  # From another session of the author too; nothing else may change.
            with running.connect("series_author") as author:
                sleeper = insert_as(author, "SELECT pg_sleep(1)", repeat="1 day", delete=False)
                wait_until(lambda: running.task(sleeper)["state"] == "WORK", 20, message="the run running")
                for change in ("repeat = '0', input = 'SELECT 2'", "repeat = '24 hours'"):  # (= '1 day')
                    with pytest.raises(psycopg.errors.ObjectInUse, match="only its data can change"):
                        author.execute(f"UPDATE task SET {change} WHERE id = %s", [sleeper])
                author.execute("UPDATE task SET repeat = '0' WHERE id = %s", [sleeper])
            assert running.wait_done(sleeper)["state"] == "DONE"
            assert running.value("SELECT count(*) FROM task WHERE input = 'SELECT pg_sleep(1)'") == 1
    finally:
        running.sql("DELETE FROM task")
        if owner != "postgres":
            running.sql("DROP ROLE series_author")


def key_rows(db, key: str) -> list[dict]:
    cursor = db.conn.execute("SELECT id, parent, plan, start, stop, state::text AS state, input, cron"
                             " FROM task WHERE key = %s ORDER BY id", [key])
    return [dict(zip([d.name for d in cursor.description], row)) for row in cursor.fetchall()]


def test_task_schedule_replaces_and_never_duplicates(db):
    first = db.value("SELECT task_schedule('report', '0 3 * * *', 'SELECT 1', 'Europe/Berlin')")
    assert db.value("SELECT task_schedule('report', '0 3 * * *', 'SELECT 1', 'Europe/Berlin')") == first
    plan = db.task(first)["plan"]
    # A new definition: the same waiting row, with the new expression's first match.
    assert db.value("SELECT task_schedule('report', '30 6 * * mon-fri', 'SELECT 2', \"group\" => 'reports',"
                    " max => 1, timeout => '5 min')") == first
    row = db.task(first)
    assert (row["cron"], row["tz"], row["input"], row["group"], row["max"], str(row["timeout"]), row["state"]) == \
        ("30 6 * * mon-fri", "UTC", "SELECT 2", "reports", 1, "0:05:00", "PLAN")
    assert row["plan"] != plan and (row["plan"].hour, row["plan"].minute, row["plan"].weekday() < 5) == (6, 30, True)
    assert db.value("SELECT count(*) FROM task") == 1
    # A second waiting run of the key is refused, naming the key.
    with pytest.raises(psycopg.errors.UniqueViolation, match=r"\(owner, key\)=\(postgres, report\)"):
        db.insert("SELECT 3", key="report")
    assert db.value("SELECT task_unschedule('report')") is True
    assert db.task(first)["state"] == "STOP" and db.task(first)["stop"] is not None
    assert db.value("SELECT task_unschedule('report')") is False  # nothing left
    assert db.value("SELECT task_schedule('report', '@daily', 'SELECT 4')") != first  # a new series
    assert db.value("SELECT count(*) FROM task WHERE state = 'PLAN'") == 1


def test_task_schedule_again_while_a_run_runs_keeps_the_series_own_columns(db):
    """The series' columns task_schedule has no argument for (given by an UPDATE of its waiting
    run) went to their defaults when the same call came while a run was in progress: the new
    definition beside the run took the column defaults, and every later run kept them."""
    call = "SELECT task_schedule('c', '0 3 * * *', 'SELECT 1', \"delete\" => false)"
    first = db.value(call)
    db.sql("UPDATE task SET active = '7 min', header = false, data = 'mine', live = '1 min' WHERE id = %s", [first])
    db.sql("UPDATE task SET state = 'WORK', start = now(), pid = 1 WHERE id = %s", [first])  # (as a worker would)
    beside = db.value(call)
    assert beside != first
    row = db.task(beside)
    assert (str(row["active"]), row["header"], row["data"], str(row["live"]), row["delete"]) == (
        "0:07:00", False, "mine", "0:01:00", False), row
    db.sql("UPDATE task SET state = 'FAIL', stop = now() WHERE id = %s", [first])  # (a repair: no run was there)
    assert db.value(call.replace("'SELECT 1'", "'SELECT 2'")) == beside  # (a waiting run: changed in place)
    row = db.task(beside)
    assert (str(row["active"]), row["header"], row["data"], row["input"]) == ("0:07:00", False, "mine", "SELECT 2")


def test_task_schedule_keeps_the_runs_that_return_nothing_when_asked(running):
    """A series' runs that return nothing were deleted at their end (`delete`'s default), and
    task_schedule could not say otherwise: a pg_cron user found no history of them."""
    running.value("SELECT task_schedule('quiet', '1 seconds', 'SELECT 1 WHERE false', \"delete\" => false)")
    wait_until(lambda: running.value("SELECT count(*) FROM task WHERE key = 'quiet' AND state = 'DONE'") >= 2, 20,
               message="two runs kept")
    # Replaced without the argument: the column's default again (delete), for the runs to come.
    waiting = running.value("SELECT task_schedule('quiet', '1 seconds', 'SELECT 1 WHERE false')")
    assert running.task(waiting)["delete"] is True
    running.value("SELECT task_unschedule('quiet')")


def test_pausing_a_series_group_pauses_that_series_and_task_series_says_so(db):
    """pg_cron's cron.alter_job(job, active => false): task_pause of the series' own group."""
    db.value("SELECT task_schedule('nightly', '0 3 * * *', 'SELECT 1')")
    db.value("SELECT task_schedule('hourly', '0 * * * *', 'SELECT 2')")
    assert db.value("SELECT task_pause('nightly')") is True
    assert db.sql("SELECT key, paused FROM task_series ORDER BY key") == [("hourly", False), ("nightly", True)]
    assert db.value("SELECT task_resume('nightly')") is True
    assert db.sql("SELECT key, paused FROM task_series ORDER BY key") == [("hourly", False), ("nightly", False)]


def readme_run_job_recipe() -> str:
    """README's `run_job` of TimescaleDB, the SQL block after its words, for series 'rollup'."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    words = readme.index("`run_job`, a one-off run")
    return re.search(r"```sql\n(.*?)```", readme[words:], re.DOTALL).group(1)


def test_readme_run_job_recipe_runs_a_job_now_with_its_own_settings(running):
    """TimescaleDB's run_job(id) as README writes it: a one-off run of the series' definition (its
    group, data, timeout and retries: a copy of the input alone ran in the default group without
    its data), while a run waits and while one is running."""
    recipe = readme_run_job_recipe()
    running.insert("SELECT data FROM task WHERE id = current_setting('pg_task.id')::bigint", key="rollup",
                   group="rollup", data="cfg-v1", repeat="1 day", plan=datetime.now(UTC) + timedelta(hours=1),
                   timeout="5 s", retry=2, retry_on=["*", "57014"], delete=False)
    running.sql(recipe)
    now = running.value("SELECT id FROM task WHERE key IS NULL")
    row = running.wait_done(now)
    assert (row["state"], row["output"], row["group"], row["data"], str(row["timeout"]), row["retry"],
            row["retry_on"], str(row["repeat"])) == ("DONE", "cfg-v1", "rollup", "cfg-v1", "0:00:05", 2,
                                                      ["*", "57014"], "0:00:00")
    assert running.value("SELECT count(*) FROM task WHERE key = 'rollup' AND state = 'PLAN'") == 1  # its beat kept

    running.sql("UPDATE task SET input = 'SELECT pg_sleep(30)', plan = now() WHERE key = 'rollup'")
    wait_until(lambda: running.value("SELECT state::text FROM task WHERE key = 'rollup'") == "WORK", 20,
               message="the series' run running")
    running.sql(recipe)
    copy = running.value("SELECT id FROM task WHERE key IS NULL AND state = 'PLAN'")
    assert copy is not None and running.task(copy)["group"] == "rollup"
    running.sql("UPDATE task SET state = 'STOP' WHERE id = %s", [copy])
    assert running.value("SELECT task_cancel(id, stop_series => true) FROM task WHERE key = 'rollup'") is True


def test_series_run_side_by_side_each_in_a_group_of_its_own(running):
    """As pg_cron's jobs: task_schedule without a group puts the series in a group named by its
    key, so two series due at once run at once; one group given to both runs them in turn."""
    for key in ("left", "right"):
        running.value("SELECT task_schedule(%s, '1 seconds', 'SELECT pg_sleep(1.5)')", [key])
    assert running.sql("SELECT key, \"group\" FROM task ORDER BY key") == [("left", "left"), ("right", "right")]
    wait_until(lambda: running.value("SELECT count(DISTINCT key) FROM task WHERE state = 'WORK'") == 2, 20,
               message="both series running at once")
    for key in ("left", "right"):
        running.value("SELECT task_schedule(%s, '1 seconds', 'SELECT pg_sleep(1.5)', \"group\" => 'nightly')", [key])
    assert running.value("SELECT count(*) FROM task WHERE state = 'PLAN' AND \"group\" = 'nightly'") == 2


def test_named_series_through_the_launcher(running):
    """Replaced while it runs, the run finishes and the series goes on with the new definition (never
    two runs at once); unscheduled while it runs, the run finishes and gets no next run."""
    running.value("SELECT task_schedule('job', '1 seconds', 'SELECT pg_sleep(1.2), ''old''')")
    wait_until(lambda: any(r["state"] == "WORK" for r in key_rows(running, "job")), 20, message="a run")
    old_run = next(r for r in key_rows(running, "job") if r["state"] == "WORK")
    replacement = running.value("SELECT task_schedule('job', '1 seconds', 'SELECT ''new''')")
    assert replacement != old_run["id"] and running.task(replacement)["state"] == "PLAN"
    assert running.wait_done(old_run["id"])["state"] == "DONE"
    wait_until(lambda: sum(r["state"] == "DONE" and r["input"] == "SELECT 'new'"
                           for r in key_rows(running, "job")) >= 3, 20, 0.05, "3 runs of the new definition")
    rows = key_rows(running, "job")
    assert running.task(replacement)["parent"] == old_run["id"]  # the series goes on from the old run
    assert not [r for r in rows if r["parent"] == old_run["id"] and r["id"] != replacement]  # and only there
    assert running.task(replacement)["start"] >= running.task(old_run["id"])["stop"]  # no overlap
    assert most_at_once([(r["start"], r["stop"]) for r in rows if r["stop"]]) == 1
    assert_one_next_row_each(running)

    running.value("SELECT task_schedule('job', '1 seconds', 'SELECT pg_sleep(1.2), ''last''')")
    wait_until(lambda: any(r["state"] == "WORK" and "last" in r["input"] for r in key_rows(running, "job")), 20,
               message="a run of the last definition")
    last = next(r for r in key_rows(running, "job") if r["state"] == "WORK")
    assert running.value("SELECT task_unschedule('job')") is True
    running.wait_all_done()
    assert running.task(last["id"])["state"] == "DONE"
    assert [r for r in key_rows(running, "job") if r["parent"] == last["id"]] == []  # no next run
    assert running.value("SELECT count(*) FROM task_series") == 0


def test_task_unschedule_stops_a_claimed_run_that_has_not_started(running):
    """A claimed run that cannot start yet (its role at its CONNECTION LIMIT: claimed, refused,
    given back, claimed again): task_unschedule said true, the run went back to waiting as a
    one-off, out of task_series, and ran once the role had a free connection (a probe)."""
    with roles(running, "cron_limited") as (limited,):
        running.sql("ALTER ROLE cron_limited CONNECTION LIMIT 1")  # (limited's own session takes it)
        with limited:
            limited.execute("SELECT task_schedule('job', '1 seconds', 'SELECT ''ran''', \"delete\" => false)")
            wait_until(lambda: running.value("SELECT state::text FROM task WHERE owner = 'cron_limited'") == "TAKE",
                       20, 0.001, "the run claimed")
            assert limited.execute("SELECT task_unschedule('job')").fetchone()[0] is True
        assert running.sql("SELECT state::text, start FROM task WHERE owner = 'cron_limited'") == [("STOP", None)]


def test_a_series_re_planned_earlier_wakes_the_launchers(db):
    """task_schedule, or an UPDATE of cron or tz, moves a waiting run's plan in a BEFORE trigger,
    which an UPDATE OF plan trigger does not see: no NOTIFY, and the run started at a launcher's
    next look, up to a second late (a probe)."""
    with db.connect() as listener:
        listener.execute("LISTEN pg_task_py")
        db.value("SELECT task_schedule('far', '0 0 1 1 *', 'SELECT 1')")
        changes = ["SELECT task_schedule('far', '* * * * *', 'SELECT 1')",
                   "UPDATE task SET cron = '0 0 1 1 *', tz = 'UTC' WHERE key = 'far'",
                   "UPDATE task SET cron = '* * * * *' WHERE key = 'far'",
                   "UPDATE task SET cron = '0 0 * * *', tz = 'UTC' WHERE key = 'far'",
                   "UPDATE task SET tz = 'Pacific/Kiritimati' WHERE key = 'far'"]
        woken = 0
        for change in changes:
            list(listener.notifies(timeout=0.2))  # (what came before)
            before = db.value("SELECT plan FROM task WHERE key = 'far'")
            db.sql(change)
            if db.value("SELECT plan FROM task WHERE key = 'far'") < before:
                assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == ["pg_task_py"], change
                woken += 1
        assert woken >= 2

@contextlib.contextmanager
def roles(db, *names: str):
    for name in names:
        db.sql(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))  # (left by an interrupted run)
        db.sql(sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgtaskpy_user").format(sql.Identifier(name)))
    try:
        yield [db.connect(name) for name in names]
    finally:
        for name in names:
            db.sql(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            db.sql(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_role_sees_and_names_only_its_own_series(db):
    with roles(db, "cron_alice", "cron_bob") as (alice, bob):
        with alice, bob:
            alice.autocommit = bob.autocommit = True
            mine = alice.execute("SELECT task_schedule('nightly', '0 2 * * *', 'SELECT 1')").fetchone()[0]
            assert alice.execute("SELECT key, id FROM task_series").fetchall() == [("nightly", mine)]
            assert bob.execute("SELECT count(*) FROM task_series").fetchone()[0] == 0
            assert bob.execute("SELECT count(*) FROM task").fetchone()[0] == 0
            assert bob.execute("SELECT task_unschedule('nightly')").fetchone()[0] is False
            theirs = bob.execute("SELECT task_schedule('nightly', '0 5 * * *', 'SELECT 2')").fetchone()[0]
            assert theirs != mine  # bob's own series of the same name
            assert db.sql("SELECT owner, cron, state::text FROM task ORDER BY id") == [
                ("cron_alice", "0 2 * * *", "PLAN"), ("cron_bob", "0 5 * * *", "PLAN")]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                bob.execute("SELECT pgtaskpy.end_series('cron_alice', 'nightly')")
            assert bob.execute("SELECT task_unschedule('nightly')").fetchone()[0] is True
            assert db.sql("SELECT owner, state::text FROM task ORDER BY id") == [
                ("cron_alice", "PLAN"), ("cron_bob", "STOP")]


@pytest.mark.parametrize("old", ["1.0", "1.1", "1.2"])
def test_update_keeps_repeating_tasks_running(cluster, old):
    """ALTER EXTENSION UPDATE from a released version under a running launcher: a repeat series goes on
    (its new runs get tz UTC and no cron), and a cron series can start."""
    with new_database(cluster) as upgraded:
        upgraded.sql("DROP EXTENSION pg_task_py")
        upgraded.conn.execute(sql.SQL("CREATE EXTENSION pg_task_py VERSION {}").format(sql.Literal(old)))
        launcher = upgraded.launcher()
        first = upgraded.insert("SELECT 'repeat'", repeat="0.3 s", delete=False)
        wait_until(lambda: len(ended(series_before(upgraded, first))) >= 2, 20, 0.05, "2 runs before the update")
        upgraded.sql("ALTER EXTENSION pg_task_py UPDATE")
        updated_at = upgraded.value("SELECT clock_timestamp()")
        wait_until(lambda: sum(r["plan"] > updated_at for r in ended(series(upgraded, first))) >= 2, 20, 0.05,
                   "2 runs after the update")
        cron = upgraded.insert("SELECT 'cron'", cron="1 seconds", delete=False)
        assert upgraded.wait_done(cron)["output"] == "cron"
        end_all(upgraded)
        assert launcher.stop() == 0, launcher.output()
        rows = series(upgraded, first)
        assert all(r["state"] in ("DONE", "STOP") for r in rows)
        assert {(r["cron"], r["tz"], r["key"]) for r in rows} == {(None, "UTC", None)}
        assert_one_next_row_each(upgraded)


def series_before(db, first: int) -> list[dict]:
    """series() for a database of a released version (no cron, tz, key columns yet)."""
    cursor = db.conn.execute(f"{CHAIN} SELECT id, state::text AS state FROM s ORDER BY id", [first])
    return [dict(zip([d.name for d in cursor.description], row)) for row in cursor.fetchall()]


def test_a_backend_keeps_next_matches_as_cron_next_computes_them(db):
    """A series' end asks the backend's kept answers (cron_next_kept) before computing its next
    match: from every time in a row, across daylight-saving changes, one backend's answers are
    cron_next's, whether kept or computed.  next_plan still raises cron_parse's error for an
    expression that cannot be read.  What it saves is bench's figure (`make bench -s cron`)."""
    cases = [(cron, "UTC") for cron in EXPRESSIONS[:12]] + [
        (cron, tz) for tz, _, _ in TRANSITIONS[:3] for cron in ("30 2 * * *", "*/15 * * * *", "0 3 * * *")]
    for cron, tz in cases:
        for start in ("2024-03-09 20:00+00", "2024-11-02 20:00+00", "2024-10-05 10:00+00"):
            # (times in order, each 7 min 13 s after the one before: most fall in a kept range)
            pairs = db.sql(
                "SELECT to_timestamp(pgtaskpy.cron_next_kept(%(cron)s, %(tz)s, extract(epoch FROM t)::float8)),"
                " pgtaskpy.cron_next(%(cron)s, %(tz)s, t)"
                " FROM (SELECT %(start)s::timestamptz + i * interval '7 min 13 s' AS t"
                "       FROM generate_series(0, 400) AS i ORDER BY i) AS s",
                {"cron": cron, "tz": tz, "start": start})
            assert [kept for kept, _ in pairs] == [computed for _, computed in pairs], (cron, tz, start)
    # From a match itself: the one after it, not the match again.
    match = db.value("SELECT pgtaskpy.cron_next('*/5 * * * *', 'UTC', '2024-01-01 00:01+00')")
    assert db.value("SELECT to_timestamp(pgtaskpy.cron_next_kept('*/5 * * * *', 'UTC',"
                    " extract(epoch FROM %s::timestamptz)::float8))", [match]) == match + timedelta(minutes=5)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='cron field "hour": 25 is out of range 0-23'):
        db.sql("DO $$ DECLARE t task; BEGIN t.cron := '0 25 * * *'; t.plan := now();"
               " PERFORM pgtaskpy.next_plan(t); END $$")
    # A direct call with no time (the function is any role's, as task_series' view calls it):
    # no match, where it showed a Python traceback.
    for after in ("nan", "infinity", "-infinity", "1e300", "-1e300"):
        assert db.value("SELECT pgtaskpy.cron_next_kept('* * * * *', 'UTC', %s::float8)", [after]) is None, after


def test_task_schedule_and_task_cancel_of_its_waiting_run_side_by_side_do_not_deadlock(db):
    """task_schedule locks the series, then its waiting run; task_cancel of that run locked the row,
    then the series (to plan the next run): in turns from two clients, deadlock_detected (40P01)."""
    db.value("SELECT task_schedule('raced', '0 3 * * *', 'SELECT 1')")
    errors: list[str] = []
    stop_at = time.monotonic() + 4.0

    def loop(statement: str) -> None:
        with db.connect() as conn:
            while time.monotonic() < stop_at:
                try:
                    conn.execute(statement)
                except psycopg.Error as exc:
                    errors.append(f"{exc.sqlstate}: {exc}")

    threads = [threading.Thread(target=loop, args=[statement]) for statement in (
        "SELECT task_schedule('raced', '0 3 * * *', 'SELECT 1')",
        "SELECT task_cancel(id) FROM task WHERE key = 'raced' AND state = 'PLAN'")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert db.value("SELECT count(*) FROM task WHERE key = 'raced' AND state = 'PLAN'") == 1  # the series goes on
