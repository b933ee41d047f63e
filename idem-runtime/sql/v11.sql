-- idem schema, version 11: a compacted claim keeps no creation time. Idempotent.
--
-- A prune compacts a success past its value's window (Guard::keep_value_for)
-- to what its slot needs to refuse a duplicate. When it began is not among
-- that: a duplicate, a slot window and a prune judge from settled_at, and
-- the listings that order by created_at are of the open claims, which are
-- never compacted. So a compacted row sets created_at to NULL, and saves
-- the 8 bytes that brought a settled key past its value's window under
-- twice the least any unique key costs (BENCHMARKS.md, "Bytes per settled
-- key"). Every other row still writes it: the column keeps its default.
-- What reads it of any claim reads coalesce(created_at, settled_at).
--
-- DROP NOT NULL changes the catalog only (no rewrite, no scan), but takes
-- an ACCESS EXCLUSIVE lock before it looks; looked up first, as version 10
-- does, so that applying this script again takes no lock at all.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'idem_records'::regclass AND attname = 'created_at'
                 AND attnotnull AND NOT attisdropped) THEN
        ALTER TABLE idem_records ALTER COLUMN created_at DROP NOT NULL;
    END IF;
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (11, 'created_at NULL in a compacted claim')
ON CONFLICT (version) DO NOTHING;
