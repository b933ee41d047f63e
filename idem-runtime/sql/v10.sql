-- idem schema, version 10: how long a claim keeps what. Idempotent.
--
-- An action may keep its replayed value (and its payload's fingerprint)
-- for a window after its outcome, and may hold its slot for a window
-- instead of for ever (Guard::keep_value_for, Guard::keep_slot_for). Each
-- claim carries its own windows, written with it, so that what a duplicate
-- is told and what prune deletes follow what the action said when it ran,
-- judged against settled_at by the database's clock. NULL: for ever, as
-- every claim before this version.
--
-- Looked up before it is altered: `ADD COLUMN IF NOT EXISTS` takes its
-- ACCESS EXCLUSIVE lock before it looks, so a migration run again (or one
-- whose columns an operator added by hand) would queue behind any open
-- transaction that touched idem_records, and every claim behind it.
DO $$
DECLARE
    records constant regclass := 'idem_records'::regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'value_kept_for'
                     AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN value_kept_for interval NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = records AND attname = 'slot_kept_for'
                     AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN slot_kept_for interval NULL;
    END IF;
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (10, 'retention windows: value_kept_for, slot_kept_for')
ON CONFLICT (version) DO NOTHING;
