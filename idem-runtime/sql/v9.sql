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
-- docs/design-decisions.md weighs it, and allows dropping it: once
-- version 9 is recorded, this script builds nothing (applied again as part
-- of idem::schema::SCHEMA_SQL, it must not bring back a dropped index).
--
-- On a large table, create it first with CREATE INDEX CONCURRENTLY
-- (docs/operations.md): this script then finds it on idem_records, as
-- defined here, and takes no lock at all (a CREATE INDEX IF NOT EXISTS
-- would take a SHARE lock before it looked at the name, and queue every
-- claim behind any open transaction). An index of that name on
-- idem_records that is not this one is dropped and built again: one a
-- failed concurrent build left invalid, or one written by hand with
-- another predicate (`<> 'success'` would draw settles onto it), other
-- columns, or UNIQUE. The name taken in idem_records' schema by anything
-- else (an index of another table, say) stops the migration, saying so:
-- CREATE INDEX IF NOT EXISTS would skip, and leave no index at all.
-- Everything is looked up in idem_records' own schema, whatever else the
-- search_path holds.
--
-- Created through EXECUTE, as version 7's index is, so that Citus can send
-- it on to every shard of a table it already distributes.
DO $$
DECLARE
    defined constant text := 'USING btree (account, state, created_at, address) '
        'WHERE ((kind = ''claim''::text) AND (state IS DISTINCT FROM ''success''::text))';
    records constant regclass := 'idem_records'::regclass;
    named record;
BEGIN
    IF EXISTS (SELECT 1 FROM idem_schema_version WHERE version >= 9) THEN
        RETURN;
    END IF;
    SELECT c.oid::regclass AS relation, i.indrelid AS on_table,
           coalesce(i.indisvalid AND NOT i.indisunique
                    AND right(pg_get_indexdef(c.oid), length(defined)) = defined, false)
               AS as_defined
    INTO named
    FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid
    WHERE c.relname = 'idem_records_open_claims'
      AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = records);
    IF FOUND THEN
        IF named.on_table IS DISTINCT FROM records::oid THEN
            RAISE EXCEPTION 'idem cannot create its index idem_records_open_claims on %: '
                'that schema already has % of that name', records,
                CASE WHEN named.on_table IS NULL THEN 'a relation that is not an index'
                     ELSE 'an index of ' || named.on_table::regclass::text END
                USING HINT = 'Rename it (ALTER INDEX ... RENAME TO ...) or drop it, then '
                             'migrate again. Nothing was changed.';
        END IF;
        IF named.as_defined THEN
            RETURN;
        END IF;
        EXECUTE format('DROP INDEX %s', named.relation);
    END IF;
    EXECUTE format('CREATE INDEX idem_records_open_claims ON %s '
                   '(account, state, created_at, address) '
                   'WHERE kind = ''claim'' AND state IS DISTINCT FROM ''success''', records);
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (9, 'idem_records_open_claims: an index of the claims not settled')
ON CONFLICT (version) DO NOTHING;
