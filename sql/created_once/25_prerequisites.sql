-- The prerequisites that have not ended yet, one row an edge (prerequisite ->
-- dependent): how the end of a task finds the tasks waiting for it at once
-- (one index probe, whatever the fan-in), and how each of them counts down
-- its waiting_for.  A row is written when the dependent is inserted and
-- deleted when the prerequisite ends (pgtaskpy.resolve_dependents), so the
-- table holds only edges still waited on.  Internal: only the scheduler's
-- functions read or write it (no grants), so no task author can release or
-- stop somebody else's task.  Created once.

CREATE TABLE pgtaskpy.pending_prerequisite (
    prerequisite bigint NOT NULL,
    dependent    bigint NOT NULL,
    PRIMARY KEY (prerequisite, dependent)
);
COMMENT ON TABLE pgtaskpy.pending_prerequisite IS 'edges prerequisite -> dependent of tasks that wait for prerequisites';
REVOKE ALL ON pgtaskpy.pending_prerequisite FROM PUBLIC;
-- A dependent's edges, by dependent: its insert, stop or deletion looks them up (each a scan of
-- every edge without it: 2,000 dependents inserted beside 300,000 waiting edges took 20 s).
CREATE INDEX pending_prerequisite_dependent ON pgtaskpy.pending_prerequisite (dependent);

-- pg_dump keeps the edges with the tasks they belong to.
SELECT pg_catalog.pg_extension_config_dump('pgtaskpy.pending_prerequisite', '');
