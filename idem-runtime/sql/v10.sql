-- idem schema, version 10: how long a claim keeps what. Idempotent.
--
-- An action may keep its replayed value (and its payload's fingerprint)
-- for a window after its outcome, and may hold its slot for a window
-- instead of for ever (Guard::keep_value_for, Guard::keep_slot_for). Each
-- claim carries its own windows, written with it, so that what a duplicate
-- is told and what prune deletes follow what the action said when it ran,
-- judged against settled_at by the database's clock. NULL: for ever, as
-- every claim before this version.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS value_kept_for interval NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS slot_kept_for  interval NULL;

INSERT INTO idem_schema_version (version, description)
VALUES (10, 'retention windows: value_kept_for, slot_kept_for')
ON CONFLICT (version) DO NOTHING;
