-- idem: the privileges a run-time role needs, and no more.
--
-- The gate, at run time, only reads and writes rows: it claims (INSERT ...
-- RETURNING fence, whose default draws from the fence sequence), looks up
-- (SELECT), settles and extends (UPDATE), takes over an expired lease
-- (UPDATE, and nextval on the fence sequence), releases (DELETE), meters
-- (INSERT ... ON CONFLICT DO UPDATE ... RETURNING) and, in Gate::connect,
-- reads the schema version and the catalog to verify the two unique
-- indexes. It never runs DDL once the schema is current, so the role needs
-- no CREATE, no ownership and no TRUNCATE: it cannot drop, alter or empty
-- the table.
--
-- Set the schema up first with a role that may run DDL (the owner:
-- Gate::connect, `idem migrate`, or idem::schema::SCHEMA_SQL in your own
-- migrations), then, as that owner or a superuser:
--
--   psql -v ON_ERROR_STOP=1 -v idem_role=app_runtime -v idem_schema=public \
--        -f idem-runtime/sql/grants.sql
--
-- The run-time role then connects with Gate::connect (which only verifies
-- a current schema) or Gate::connect_without_setup. Rerunning this file is
-- harmless. tests/testsuite/schema/privileges.rs checks that these four grants suffice and
-- that each one is needed.

-- To find the tables at all.
GRANT USAGE ON SCHEMA :"idem_schema" TO :"idem_role";

-- Claim, look up, settle, extend, take over, release; meter events.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"idem_schema".idem_records TO :"idem_role";

-- Gate::connect reads the applied version to know that no set-up is due.
GRANT SELECT ON :"idem_schema".idem_schema_version TO :"idem_role";

-- Every claim's fence defaults to nextval of this sequence, and a lease
-- takeover draws a new one: USAGE allows nextval (and nothing else).
GRANT USAGE ON SEQUENCE :"idem_schema".idem_records_fence_seq TO :"idem_role";
