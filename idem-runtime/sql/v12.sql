-- idem schema, version 12: ordered events. Idempotent.
--
-- An event guarded with an entity and an order (Guard::ordered, the
-- attribute's entity = "..." and order = "...") runs at most once by its
-- own key, as every claim does, and is refused without running when an
-- event of its entity with a newer order was applied before it. Its claim
-- row says which entity it belongs to (entity: the entity row's address)
-- and its order (event_order).
--
-- The entity is a row of its own, kind 'entity', at its own address in the
-- event's account and namespace, so that the same two partial unique
-- indexes serialise the events of one entity: a claim upserts it, and
-- PostgreSQL's ON CONFLICT DO UPDATE locks it and reads its latest version,
-- which no snapshot read can do under READ COMMITTED. It holds:
--   held_by         the address of the event that holds it (runs, or may
--                   have run: pending or in doubt), NULL when none does;
--   event_order     that event's order;
--   applied_order   the newest order applied: of an event that succeeded.
-- What each outcome does to it is in idem-runtime/src/store/ordered.rs.
--
-- The holder is a column of its own, not claim_address (a step's claim),
-- which an index reads: an update of the entity then changes no indexed
-- column, and can stay on its page (a heap-only tuple) with no index entry.
--
-- Four nullable columns without defaults: adding them changes the catalog
-- only (no rewrite, no scan), but takes an ACCESS EXCLUSIVE lock; looked up
-- first, as version 10 does, so that applying this script again takes no
-- lock at all. No constraint is added: validating one would read the whole
-- table, which after years of keys is the bill this schema avoids.
DO $$
DECLARE
    records constant regclass := 'idem_records'::regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'entity' AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN entity text NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'event_order' AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN event_order bigint NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'applied_order' AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN applied_order bigint NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'held_by' AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN held_by text NULL;
    END IF;
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (12, 'ordered events: entity, event_order, applied_order, held_by')
ON CONFLICT (version) DO NOTHING;
