-- idem schema, version 13: waking a waiting duplicate in another process.
-- Idempotent.
--
-- A duplicate told to wait (Guard::wait, the HTTP layer's wait) whose slot
-- is held by a claim of another process listens on the channel
-- 'idem_landed', then marks the pending row it waits on (awaited = true).
-- The statements that record a holder's outcome return the mark, and the
-- holder sends pg_notify('idem_landed', address) only when it is set: a
-- settle that nobody waits on sends nothing more than before. The mark is
-- written after the waiter listens, and compared on the fence, so either
-- the holder's outcome statement sees it (and notifies), or the waiter's
-- mark finds the row no longer pending under that fence (and looks).
-- What is in idem-runtime/src/wakeup.rs.
--
-- Not a trigger: Citus refuses triggers on distributed tables, and the
-- schema stays portable; the client sends the notification.
--
-- A nullable column without a default: adding it changes the catalog only
-- (no rewrite, no scan), but takes an ACCESS EXCLUSIVE lock; looked up
-- first, so that applying this script again takes no lock at all. No index
-- reads it, so setting it is a heap-only update.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'idem_records'::regclass AND attname = 'awaited'
                     AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN awaited boolean NULL;
    END IF;
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (13, 'waiting duplicates woken across processes: awaited')
ON CONFLICT (version) DO NOTHING;
