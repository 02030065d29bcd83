-- 1.2 -> 1.3, once 1.3's functions are made: the rows that break 1.3's rules for a task's values
-- (pgtaskpy.violated_rule: a timeout over 24 days, a plan of infinity, a max of -2147483648, a null
-- over 1000 characters, ...).  Let through, such a row could not be changed after the update (the
-- trigger checks the whole row: its series could not be ended), nor a dump of the table restored
-- (a review).  Refused, naming the rows and the rule the first breaks, before anything has changed.
DO $$
DECLARE
    broken bigint[] := ARRAY(SELECT t.id FROM @extschema@.task AS t
                             WHERE pgtaskpy.violated_rule(t) IS NOT NULL ORDER BY t.id LIMIT 11);
BEGIN
    IF cardinality(broken) > 0 THEN
        RAISE EXCEPTION 'cannot update pg_task_py to 1.3: task% % % values that 1.3 refuses',
                        CASE WHEN cardinality(broken) > 1 THEN 's' ELSE '' END,
                        CASE WHEN cardinality(broken) > 10 THEN array_to_string(broken[1:10], ', ') || ' and more'
                             ELSE array_to_string(broken, ', ') END,
                        CASE WHEN cardinality(broken) > 1 THEN 'have' ELSE 'has' END
            USING ERRCODE = 'check_violation',
                  DETAIL = format('Task %s: %s.', broken[1],
                                  (SELECT pgtaskpy.violated_rule(t) FROM @extschema@.task AS t WHERE t.id = broken[1])),
                  HINT = 'Change those values (or delete the rows of tasks that have ended), once any of them '
                         'running has ended; then update again.';
    END IF;
END
$$;
