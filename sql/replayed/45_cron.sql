-- Cron schedules (columns cron and tz): the parser and the next-match rule.
--
-- PL/pgSQL over PostgreSQL's own time-zone rules (AT TIME ZONE), so that any
-- zone name the server accepts works, with the server's time-zone data.  An
-- expression is read into bit masks (pgtaskpy.cron_parse), and the next match
-- is found field by field on local wall-clock time (cron_next_local), then
-- placed on the time line with the daylight-saving rule (cron_instant):
--   - a local time that does not exist (spring forward) runs once, at the
--     first instant after the gap;
--   - a local time that occurs twice (fall back) runs once, at its first
--     occurrence.
-- Syntax: pg_cron's (Vixie cron's), see README "Schedules".

-- The lowest bit of mask at or above bit `low` (-1: none).  Plain SQL without
-- SET: inlined into its callers' expressions.
CREATE FUNCTION pgtaskpy.cron_next_bit(mask bigint, low integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN mask >> low = 0 THEN -1
                ELSE low + pg_catalog.bit_count((((mask >> low) & -(mask >> low)) - 1)::bit(64))::integer END
$$;

-- A value of a cron field: a number, or a month or day name (NULL: neither).
CREATE FUNCTION pgtaskpy.cron_value(token text, field integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        -- (leading zeros read as pg_cron reads them, 00005 as 5; a longer number is out of every range)
        WHEN token ~ '^[0-9]+$' THEN CASE WHEN length(ltrim(token, '0')) > 4 THEN 9999 ELSE token::integer END
        WHEN field = 4 THEN pg_catalog.array_position('{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}'::text[], token)
        WHEN field = 5 THEN pg_catalog.array_position('{sun,mon,tue,wed,thu,fri,sat}'::text[], token) - 1
    END
$$;

-- A cron expression read into bit masks: {minutes, hours, days of month (bit
-- 0: "$", the last day), months, days of week (bit 0: Sunday), flags (1: the
-- day-of-month field starts with "*", 2: the day-of-week field does), seconds
-- of a 'N seconds' interval (0: a cron expression)}.  A bad expression raises
-- invalid_parameter_value with a message naming the field and the token, or,
-- with raise_error false, returns NULL (no exception block on any path).
CREATE FUNCTION pgtaskpy.cron_parse(expr text, raise_error boolean DEFAULT true) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    field_names CONSTANT text[] := '{minute,hour,"day of month",month,"day of week"}';
    lows CONSTANT integer[] := '{0,0,1,1,0}';
    highs CONSTANT integer[] := '{59,23,31,12,7}';
    spec bigint[] := '{0,0,0,0,0,0,0}';
    source text := btrim(expr, E' \t\r\n');
    cron text := lower(source);
    fields text[];
    part text;
    m text[];
    f integer;
    lo integer;
    hi integer;
    step integer;
    e integer;
    mask bigint;
    problem text;
    at_field integer;  -- the field and the part read last: the one a problem is of
    at_part text;
BEGIN
    <<parse>>
    BEGIN
        IF cron ~ E'^[0-9]+\\s*seconds?$' THEN  -- pg_cron's interval form
            step := pgtaskpy.cron_value(substring(cron FROM '^[0-9]+'), 0);
            IF step NOT BETWEEN 1 AND 59 THEN
                problem := format('cron interval "%s": the seconds must be from 1 to 59', source);
                EXIT parse;
            END IF;
            spec[7] := step;
            RETURN spec;
        ELSIF left(cron, 1) = '@' THEN
            cron := CASE cron
                WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
                WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
                WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
                WHEN '@hourly' THEN '0 * * * *' END;
            IF cron IS NULL THEN
                problem := format('cron macro "%s" is unknown: use @yearly, @annually, @monthly, @weekly, '
                                  '@daily, @midnight or @hourly', source);
                EXIT parse;
            END IF;
        END IF;
        -- (the fields as written, each token matched without regard to case: an error quotes
        -- what its author wrote, not "monday" for MONDAY)
        fields := regexp_split_to_array(CASE WHEN left(source, 1) = '@' THEN cron ELSE source END, E'\\s+');
        IF cardinality(fields) <> 5 OR cron = '' THEN
            problem := format('cron expression "%s" has %s fields: expected 5 (minute hour day-of-month month '
                              'day-of-week), a macro such as @daily, or ''N seconds''',
                              source, CASE WHEN cron = '' THEN 0 ELSE cardinality(fields) END);
            EXIT parse;
        END IF;
        FOR f IN 1..5 LOOP
            mask := 0;
            FOREACH part IN ARRAY string_to_array(fields[f], ',') LOOP
                at_field := f;
                at_part := part;
                m := regexp_match(part, E'^(?:(\\*)|([a-z0-9]+|\\$)(?:-([a-z0-9]+))?)(?:/([0-9]+))?$', 'i');
                IF m IS NULL THEN
                    problem := format('cron field "%s": "%s" is not a value, a range or a step', field_names[f], part);
                    EXIT parse;
                ELSIF m[1] IS NOT NULL THEN
                    lo := lows[f];
                    hi := highs[f];
                ELSIF m[2] = '$' THEN
                    IF f <> 3 THEN
                        problem := format('cron field "%s": "$" (the last day of the month) belongs in the '
                                          'day-of-month field', field_names[f]);
                        EXIT parse;
                    ELSIF m[3] IS NOT NULL OR m[4] IS NOT NULL THEN
                        problem := format('cron field "day of month": "%s": "$" takes no range or step', part);
                        EXIT parse;
                    END IF;
                    mask := mask | 1;
                    CONTINUE;
                ELSE
                    FOREACH e IN ARRAY ARRAY[2, 3] LOOP  -- the range's two ends, m[2] and m[3]
                        CONTINUE WHEN m[e] IS NULL;
                        hi := pgtaskpy.cron_value(lower(m[e]), f);
                        IF hi IS NULL THEN
                            problem := format('cron field "%s": "%s" is not a number%s', field_names[f], m[e],
                                              CASE f WHEN 3 THEN ' or $ (the last day of the month)'
                                                     WHEN 4 THEN ' or a month name (jan-dec)'
                                                     WHEN 5 THEN ' or a day name (sun-sat)' ELSE '' END);
                            EXIT parse;
                        ELSIF hi NOT BETWEEN lows[f] AND highs[f] THEN
                            problem := format('cron field "%s": %s is out of range %s-%s',
                                              field_names[f], m[e], lows[f], highs[f]);
                            EXIT parse;
                        END IF;
                        IF e = 2 THEN
                            lo := hi;
                        ELSIF f = 5 AND lower(m[e]) = 'sun' AND lo > 0 THEN
                            hi := 7;  -- (sat-sun, mon-sun: the week's end, as 6-7 and 1-7 are)
                        END IF;
                    END LOOP;
                    IF m[3] IS NULL AND m[4] IS NOT NULL THEN
                        problem := format('cron field "%s": "%s": a step needs a range or "*" (%s-%s/%s)',
                                          field_names[f], part, m[2], highs[f], m[4]);
                        EXIT parse;
                    ELSIF hi < lo THEN
                        problem := format('cron field "%s": range %s-%s runs backwards', field_names[f], m[2], m[3]);
                        EXIT parse;
                    END IF;
                END IF;
                step := coalesce(pgtaskpy.cron_value(m[4], 0), 1);
                IF step NOT BETWEEN 1 AND highs[f] - lows[f] + 1 THEN
                    problem := format('cron field "%s": step %s is out of range 1-%s',
                                      field_names[f], m[4], highs[f] - lows[f] + 1);
                    EXIT parse;
                ELSIF step = 1 THEN
                    mask := mask | (((1::bigint << (hi + 1)) - 1) & ~((1::bigint << lo) - 1));
                ELSE
                    FOR v IN lo..hi BY step LOOP
                        mask := mask | (1::bigint << v);
                    END LOOP;
                END IF;
            END LOOP;
            IF f = 5 AND mask & 128 <> 0 THEN
                mask := (mask | 1) & 127;  -- 7 is Sunday too
            END IF;
            spec[f] := mask;
            IF f IN (3, 5) AND left(fields[f], 1) = '*' THEN
                spec[6] := spec[6] | CASE f WHEN 3 THEN 1 ELSE 2 END;
            END IF;
        END LOOP;
        -- A day matches when both day fields match if either starts with "*",
        -- else when either does (Vixie cron's rule, pg_cron's).  Then every
        -- weekday comes round on every date over the years: the expression can
        -- match unless the days of month it needs are missing from its months.
        IF spec[6] <> 0 AND spec[3] & 1 = 0
           AND NOT ((spec[4] & 5546 <> 0 AND spec[3] <> 0)                    -- months of 31 days
                    OR (spec[4] & 2640 <> 0 AND spec[3] & 2147483646 <> 0)    -- of 30 days
                    OR (spec[4] & 4 <> 0 AND spec[3] & 1073741822 <> 0)) THEN  -- February, 29 days
            problem := format('cron expression "%s" never matches: none of its months has that day', source);
        END IF;
    END;
    IF problem IS NULL THEN
        RETURN spec;
    END IF;
    IF at_field = 3 AND at_part ~* '(^|[-/])(lw?|[0-9]+w|\?)($|[-/])'
       OR at_field = 5 AND at_part ~* '#|(^|[-/])([0-7]?l|\?)($|[-/])' THEN
        -- (Quartz's and croniter's day forms, which pg_cron's syntax has not)
        problem := problem || '; L, W, # and ? are not read here: "$" is the last day of the month';
    END IF;
    IF raise_error THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value',
            HINT = 'A cron expression is five fields (minute hour day-of-month month day-of-week), a macro such '
                   'as @daily, or ''N seconds''; try one with task_next_runs(cron).';
    END IF;
    RETURN NULL;
END
$$;

-- Why an expression cannot be read (NULL: it can).
CREATE FUNCTION pgtaskpy.cron_problem(expr text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgtaskpy.cron_parse(expr);
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN SQLERRM;
END
$$;

-- Why PostgreSQL does not accept a time zone name (NULL: it does), or why
-- the scheduler would not read it as its author means.  AT TIME ZONE reads a
-- name that is an abbreviation too (pg_timezone_abbrevs) as that fixed offset:
-- CET, EET, MET and WET, zones with daylight saving, ran an hour off for seven
-- months of the year.  Such a name is refused unless the zone never leaves the
-- abbreviation's offset (UTC, GMT, EST): its offsets in January and July are
-- read through the TimeZone setting, which reads names as zones.  A summer
-- time's abbreviation (CEST, BST, EDT) is a summer's offset all year: an hour
-- off for the other months.  And `localtime` and `posixrules` are links the
-- server's zone files set, which the other server of a failover may not share.
CREATE FUNCTION pgtaskpy.tz_problem(tz text) RETURNS text
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fixed interval;
    summer_time boolean;
    session_zone text := current_setting('TimeZone');
    winter interval;
    summer interval;
BEGIN
    IF current_setting('timezone_abbreviations') <> 'Default' THEN
        RETURN pgtaskpy.tz_problem_by_default_abbreviations(tz);  -- (read as every plan is: cron_next)
    END IF;
    PERFORM timestamptz '2000-01-01 00:00+00' AT TIME ZONE tz;
    IF lower(tz) IN ('localtime', 'posixrules') THEN
        RETURN format('"%s" is a link that the server''s time zone files set (the host''s zone, the rules of '
                      'POSIX zone strings), which another server (a standby promoted, a restore) may not '
                      'share: name the zone', tz);
    END IF;
    SELECT a.utc_offset, a.is_dst INTO fixed, summer_time
    FROM pg_timezone_abbrevs AS a WHERE lower(a.abbrev) = lower(tz) LIMIT 1;
    IF fixed IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        -- TimeZone takes zone names alone: an abbreviation that names no zone is its offset
        -- only.  (Asked of pg_timezone_names, which reads every zone's file, an insert naming
        -- GMT or EST took 20-40 ms.)
        PERFORM set_config('TimeZone', tz, true);
    EXCEPTION WHEN invalid_parameter_value THEN
        IF summer_time THEN
            RETURN format('PostgreSQL reads "%s" as the summer time''s fixed offset %s all year, not as the '
                          'zone that keeps it in summer only', tz, fixed);
        END IF;
        RETURN NULL;
    END;
    winter := make_interval(secs => extract(timezone FROM timestamptz '2030-01-15 12:00+00'));
    summer := make_interval(secs => extract(timezone FROM timestamptz '2030-07-15 12:00+00'));
    PERFORM set_config('TimeZone', session_zone, true);
    IF winter = fixed AND summer = fixed THEN
        RETURN NULL;
    END IF;
    RETURN format('PostgreSQL reads "%s" as the abbreviation of the fixed offset %s, not as the zone %s, '
                  'which has daylight saving', tz, fixed, tz);
EXCEPTION WHEN invalid_parameter_value OR feature_not_supported THEN
    RETURN SQLERRM;
END
$$;

-- tz_problem in a session whose timezone_abbreviations is not the Default list.
CREATE FUNCTION pgtaskpy.tz_problem_by_default_abbreviations(tz text) RETURNS text
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp SET timezone_abbreviations = 'Default'
AS $$ SELECT pgtaskpy.tz_problem(tz) $$;

-- The offset the Default list of timezone_abbreviations gives the abbreviation `tz` (NULL: none).
CREATE FUNCTION pgtaskpy.default_abbreviation_offset(tz text) RETURNS interval
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp SET timezone_abbreviations = 'Default'
AS $$ SELECT a.utc_offset FROM pg_timezone_abbrevs AS a WHERE lower(a.abbrev) = lower(tz) LIMIT 1 $$;

-- Why a session may not name `tz` (NULL: it may).  A name of timezone_abbreviations' list is
-- read as that abbreviation's offset (before a zone of the same name), and every plan is made by
-- the Default list (the scheduler's sessions, dispatch.py's SCHEDULER_SETTINGS; cron_next and
-- next_plan in any session).  Where a session's list is another (SET, ALTER ROLE or ALTER
-- DATABASE ... SET) and reads the name otherwise, its author would check and mean it by one
-- offset and the scheduler plan it by another (IST: India's +05:30 there, Israel's +02:00 by
-- Default, a series planned by both, a probe; EST: Australia's +10:00, -05:00 by Default).
CREATE FUNCTION pgtaskpy.abbreviation_read_otherwise(tz text) RETURNS text
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    here interval;
    there interval;
BEGIN
    IF current_setting('timezone_abbreviations') = 'Default' THEN
        RETURN NULL;
    END IF;
    here := (SELECT a.utc_offset FROM pg_timezone_abbrevs AS a WHERE lower(a.abbrev) = lower(tz) LIMIT 1);
    there := pgtaskpy.default_abbreviation_offset(tz);
    IF here IS NOT DISTINCT FROM there THEN
        RETURN NULL;
    END IF;
    RETURN format('this session reads "%s" by its timezone_abbreviations %L as %s, and the scheduler by %L as %s',
                  tz, current_setting('timezone_abbreviations'),
                  COALESCE('the offset ' || here, 'the zone of that name'), 'Default',
                  COALESCE('the offset ' || there, 'the zone of that name'));
END
$$;

-- The first local wall-clock time at or after `start` (a whole minute) that
-- the parsed expression matches; NULL past the year 9999.  Field by field,
-- jumping over whole months, days and hours that cannot match.
CREATE FUNCTION pgtaskpy.cron_next_local(spec bigint[], start timestamp) RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    minutes bigint := spec[1];
    hours bigint := spec[2];
    doms bigint := spec[3];
    months bigint := spec[4];
    dows bigint := spec[5];
    both_days boolean := spec[6] <> 0;
    y integer := extract(year FROM start);
    mo integer := extract(month FROM start);
    d integer := extract(day FROM start);
    h integer := extract(hour FROM start);
    mi integer := extract(minute FROM start);
    n integer;
    last_day integer;
    w integer;
    week bigint;
    days bigint;
BEGIN
    LOOP
        IF y > 9999 THEN
            RETURN NULL;
        END IF;
        n := pgtaskpy.cron_next_bit(months, mo);
        IF n < 0 THEN
            y := y + 1; mo := 1; d := 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF n > mo THEN
            mo := n; d := 1; h := 0; mi := 0;
        END IF;
        -- The month's matching days as bits 1-31.
        last_day := CASE WHEN mo = 2 THEN CASE WHEN y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0) THEN 29 ELSE 28 END
                         WHEN mo IN (4, 6, 9, 11) THEN 30 ELSE 31 END;
        w := extract(dow FROM make_date(y, mo, 1));  -- weekday of the 1st
        week := ((dows >> w) | (dows << (7 - w))) & 127;  -- bit j: day j + 1 of a week from the 1st
        days := (week | (week << 7) | (week << 14) | (week << 21) | (week << 28)) << 1;
        days := CASE WHEN both_days THEN days & ((doms & ~1) | ((doms & 1) << last_day))
                     ELSE days | (doms & ~1) | ((doms & 1) << last_day) END
                & ((1::bigint << (last_day + 1)) - 2);
        n := pgtaskpy.cron_next_bit(days, d);
        IF n < 0 THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;
            IF mo > 12 THEN
                y := y + 1; mo := 1;
            END IF;
            CONTINUE;
        ELSIF n > d THEN
            d := n; h := 0; mi := 0;
        END IF;
        n := pgtaskpy.cron_next_bit(hours, h);
        IF n < 0 THEN
            d := d + 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF n > h THEN
            h := n; mi := 0;
        END IF;
        n := pgtaskpy.cron_next_bit(minutes, mi);
        IF n < 0 THEN
            h := h + 1; mi := 0;
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, n, 0);
    END LOOP;
END
$$;

-- The instant a local wall-clock time of zone tz stands for, by the
-- daylight-saving rule: a time that occurs twice (fall back) is its first
-- occurrence; a time that does not exist (spring forward) is the first
-- instant after the gap.  (PostgreSQL itself reads both as standard time.)
CREATE FUNCTION pgtaskpy.cron_instant(local_time timestamp, tz text) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    guess timestamptz;
    earlier interval;  -- the zone's UTC offsets two days before and after
    later interval;
    first timestamptz;
    second timestamptz;
    lo bigint;
    hi bigint;
    mid bigint;
BEGIN
    IF tz = 'UTC' THEN
        RETURN local_time AT TIME ZONE 'UTC';
    END IF;
    guess := local_time AT TIME ZONE tz;
    -- (hours, not days: a day of timestamptz arithmetic follows the session's zone)
    earlier := ((guess - interval '48 hours') AT TIME ZONE tz) - ((guess - interval '48 hours') AT TIME ZONE 'UTC');
    later := ((guess + interval '48 hours') AT TIME ZONE tz) - ((guess + interval '48 hours') AT TIME ZONE 'UTC');
    IF earlier = later THEN
        RETURN guess;  -- no change of offset near: the one reading
    END IF;
    first := (local_time - earlier) AT TIME ZONE 'UTC';
    second := (local_time - later) AT TIME ZONE 'UTC';
    IF (first AT TIME ZONE tz) = local_time THEN
        IF (second AT TIME ZONE tz) = local_time THEN
            RETURN least(first, second);  -- twice: the first occurrence
        END IF;
        RETURN first;
    ELSIF (second AT TIME ZONE tz) = local_time THEN
        RETURN second;
    END IF;
    -- In the gap: the first instant whose local time is past it.  Between
    -- `second` (still before the change) and `first` (after it); offsets
    -- change at whole seconds.
    lo := extract(epoch FROM least(first, second));
    hi := extract(epoch FROM greatest(first, second));
    WHILE hi - lo > 1 LOOP
        mid := (lo + hi) / 2;
        IF (to_timestamp(mid) AT TIME ZONE tz) >= local_time THEN
            hi := mid;
        ELSE
            lo := mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(hi);
END
$$;

-- The first match of a parsed expression strictly after `after`, in zone tz.
CREATE FUNCTION pgtaskpy.cron_next_spec(spec bigint[], tz text, after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    local_time timestamp;
    candidate timestamptz;
BEGIN
    local_time := date_trunc('minute', after AT TIME ZONE tz) + interval '1 minute';
    LOOP
        IF spec[7] > 0 THEN  -- 'N seconds': every N seconds of the clock, whatever the zone
            candidate := to_timestamp((floor(extract(epoch FROM after) / spec[7]) + 1) * spec[7]);
        ELSE
            local_time := pgtaskpy.cron_next_local(spec, local_time);
            candidate := pgtaskpy.cron_instant(local_time, tz);  -- (STRICT: NULL after the zone's 9999)
        END IF;
        -- (nor in the year 10000 in UTC, past a plan's bound)
        IF candidate IS NULL OR candidate >= timestamptz '10000-01-01 00:00+00' THEN
            RAISE EXCEPTION 'cron expression has no match after % before the year 10000', after
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- (a local time whose first occurrence has passed, while a fall-back
        -- hour repeats, is not run again)
        IF candidate > after THEN
            RETURN candidate;
        END IF;
        local_time := local_time + interval '1 minute';
    END LOOP;
END
$$;

-- cron_next(expr, tz, to_timestamp(after)) as an epoch, remembered by the
-- backend for the next calls between the same two matches
-- (sql/plpython/cron_matches.py).  For the ends of series, each of which
-- computes its next match (next_plan).  No SET clause: its one query names
-- its schema.
CREATE FUNCTION pgtaskpy.cron_next_kept(expr text, tz text, after float8) RETURNS float8
LANGUAGE plpython3u STABLE STRICT
AS $python$
{{ cron_matches.py }}
$python$;

-- cron_next in a session whose timezone_abbreviations is not the scheduler's Default
-- (abbreviation_read_otherwise): an abbreviation is read as the scheduler reads it.
CREATE FUNCTION pgtaskpy.cron_next_by_default_abbreviations(cron text, tz text, after timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE SET timezone_abbreviations = 'Default'
AS $$ SELECT pgtaskpy.cron_next_spec(pgtaskpy.cron_parse(cron), COALESCE(tz, 'UTC'), after) $$;

-- The first match of a cron expression strictly after `after`, in zone tz
-- (NULL: UTC).  What the scheduler plans a cron task's runs by.
CREATE FUNCTION pgtaskpy.cron_next(cron text, tz text, after timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN current_setting('timezone_abbreviations') = 'Default'
                THEN pgtaskpy.cron_next_spec(pgtaskpy.cron_parse(cron), COALESCE(tz, 'UTC'), after)
                ELSE pgtaskpy.cron_next_by_default_abbreviations(cron, tz, after) END
$$;

-- For users: the next n runs of a cron expression, to check one before
-- scheduling it.  tz NULL: the default a task would get (pg_task.tz, else UTC).
CREATE FUNCTION @extschema@.task_next_runs(
    cron text, tz text DEFAULT NULL, n integer DEFAULT 5, after timestamptz DEFAULT now())
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    spec bigint[] := pgtaskpy.cron_parse(cron);
    zone text := COALESCE(tz, pgtaskpy.setting_default('tz', 'UTC'::text));
    problem text := COALESCE(pgtaskpy.tz_problem(zone), pgtaskpy.abbreviation_read_otherwise(zone));
    t timestamptz := after;
BEGIN
    IF cron IS NULL OR after IS NULL THEN
        RAISE EXCEPTION 'task_next_runs needs a cron expression and a time to start after'
            USING ERRCODE = 'null_value_not_allowed';
    ELSIF problem IS NOT NULL THEN
        RAISE EXCEPTION 'tz "%": %', zone, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = concat_ws(' ', 'Use a region''s name of pg_timezone_names, such as ''Europe/Berlin'', or ''UTC''.',
                                   CASE WHEN tz IS NULL THEN format('No tz was given: it is the setting pg_task.tz = %L '
                                       '(SET, ALTER ROLE ... SET, ALTER DATABASE ... SET or postgresql.conf).', zone) END);
    ELSIF NOT isfinite(after) THEN
        RAISE EXCEPTION 'task_next_runs: after must be a finite time, not %', after
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF n IS NULL OR n NOT BETWEEN 0 AND 100000 THEN
        RAISE EXCEPTION 'task_next_runs: n must be from 0 to 100000, not %', COALESCE(n::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF after >= timestamptz '10000-01-01 00:00+00' THEN
        RETURN;  -- (no match after the year 9999, as below; reading a zone's time there overflowed)
    END IF;
    BEGIN
        FOR i IN 1..n LOOP
            t := pgtaskpy.cron_next_spec(spec, zone, t);
            RETURN NEXT t;
        END LOOP;
    EXCEPTION WHEN invalid_parameter_value THEN
        RETURN;  -- (cron_next_spec: no match before the year 10000) the matches there are, fewer than n
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.task_next_runs IS 'the next n times a cron expression matches, in a time zone';

GRANT EXECUTE ON FUNCTION @extschema@.task_next_runs(text, text, integer, timestamptz) TO pgtaskpy_user;
