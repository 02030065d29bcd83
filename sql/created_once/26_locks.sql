-- The scheduler's locks are locks on these two tables, which no role but their owner (the
-- extension's) may lock: LOCK TABLE and SELECT ... FOR SHARE need rights on them, granted to
-- nobody.  They were advisory locks keyed by the task table's oid, which PostgreSQL lets every
-- role take: a role of the database with no right on the extension held up every claim with one
-- pg_advisory_lock, and every task's end with 1,024.  UNLOGGED: no lock taken on them writes
-- WAL, and no publication (FOR ALL TABLES) copies them.  Created once.

-- The scheduling lock (pgtaskpy.lock_scheduling): a lock on this table, which holds no row,
-- EXCLUSIVE for a launcher's turn, ROW SHARE for a worker going on with its group.
CREATE UNLOGGED TABLE pgtaskpy.scheduling_lock ();
COMMENT ON TABLE pgtaskpy.scheduling_lock IS 'locked, never written: serializes the launchers'' claims';
REVOKE ALL ON pgtaskpy.scheduling_lock FROM PUBLIC;

-- The prerequisite locks (pgtaskpy.lock_prerequisites): a row of one of 1,024 keys of task ids,
-- locked FOR UPDATE by an end that looks for the task's dependents, FOR SHARE by the commit of an
-- INSERT of a task `after` it (sql/replayed/47_workflows.sql).  A crash's recovery, or a
-- standby's promotion, empties an unlogged table: the first lock after that fills it again.
CREATE UNLOGGED TABLE pgtaskpy.prerequisite_lock (key integer PRIMARY KEY);
COMMENT ON TABLE pgtaskpy.prerequisite_lock IS 'locked, never changed: one row of each key of the prerequisite locks';
REVOKE ALL ON pgtaskpy.prerequisite_lock FROM PUBLIC;
INSERT INTO pgtaskpy.prerequisite_lock SELECT k FROM pg_catalog.generate_series(0, 1023) AS k;
