-- The scheduling lock (pgtaskpy.lock_scheduling) is a lock on this view, which no role but its
-- owner (the extension's) may lock: LOCK needs rights on it, granted to nobody.  It was an
-- advisory lock keyed by the task table's oid, which PostgreSQL lets every role take: a role of
-- the database with no right on the extension held up every claim with one pg_advisory_lock.  A
-- view, not a table: a database's owner may ANALYZE any table of the database in a transaction
-- block, whose lock it then holds until the transaction ends; a view's it lets go at once.  It
-- reads nothing, and is in no publication.  Created once.
CREATE VIEW pgtaskpy.scheduling_lock AS SELECT;
COMMENT ON VIEW pgtaskpy.scheduling_lock IS 'locked, never read: serializes the launchers'' claims';
REVOKE ALL ON pgtaskpy.scheduling_lock FROM PUBLIC;
