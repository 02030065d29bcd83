-- 1.0 -> 1.1: what CREATE OR REPLACE cannot do.  sql/build.py appends every
-- function and procedure of 1.1 after this, as CREATE OR REPLACE.

-- Signatures that changed: run_task reports back, finish_task may not wake.
DROP PROCEDURE pgtaskpy.run_task(bigint, integer);
DROP FUNCTION pgtaskpy.finish_task(bigint, @extschema@.state, text, text, @extschema@.state[], text);
