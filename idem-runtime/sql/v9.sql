-- idem schema, version 9: an index of the open claims. Idempotent.
--
-- The reconciler's listing, `idem claims list --state`, the claim gauges
-- and the console's lists of one state each ask for the claims that are
-- not settled: pending, in doubt, or kept failed. They are few in a table
-- of millions of successes, and without an index every one of those
-- statements read the whole table. This index holds only the open claims,
-- so those statements read only them, on any account or on one.
--
-- Its predicate is `state IS DISTINCT FROM 'success'`, never `state <>
-- 'success'`: PostgreSQL proves the latter from `state = 'pending'`, which
-- every settle's WHERE says, and may then plan a settle on this index.
-- The statements that want it spell the predicate out (`open_claims!`).
--
-- Its price: a settle changes `state`, a column this index reads, so it is
-- no longer a heap-only (HOT) update, and writes an entry into each index.
-- docs/design-decisions.md weighs it. On a large table, create it first
-- with CREATE INDEX CONCURRENTLY (docs/operations.md): this migration then
-- finds it and only records its version. IF NOT EXISTS goes by the name
-- alone, so an index of that name that is not this one is dropped and built
-- again: one a failed concurrent build left invalid, or one written by hand
-- with another predicate (`<> 'success'` would draw settles onto it),
-- other columns, or UNIQUE.
--
-- Created through EXECUTE, as version 7's index is, so that Citus can send
-- it on to every shard of a table it already distributes.
DO $$
DECLARE
    defined constant text := 'USING btree (account, state, created_at, address) '
        'WHERE ((kind = ''claim''::text) AND (state IS DISTINCT FROM ''success''::text))';
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_index
        WHERE indexrelid = to_regclass('idem_records_open_claims')
          AND (NOT indisvalid OR indisunique
               OR right(pg_get_indexdef(indexrelid), length(defined)) <> defined)
    ) THEN
        EXECUTE 'DROP INDEX idem_records_open_claims';
    END IF;
    EXECUTE 'CREATE INDEX IF NOT EXISTS idem_records_open_claims '
            'ON idem_records (account, state, created_at, address) '
            'WHERE kind = ''claim'' AND state IS DISTINCT FROM ''success''';
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (9, 'idem_records_open_claims: an index of the claims not settled')
ON CONFLICT (version) DO NOTHING;
