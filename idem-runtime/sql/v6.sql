-- idem schema, version 6: when a claim went in doubt. Idempotent; the
-- column is added without rewriting the table (no default), and a process
-- of the previous release, which does not write it, leaves it NULL.
--
-- in_doubt_since: when the claim turned in_doubt: when its body said so
--                 (body_in_doubt), or when its lease ran out (lease_expired).
--                 What "in doubt for longer than ..." is measured from
--                 (`idem claims list --state in_doubt --older-than`); NULL
--                 for rows that turned before this version (or were turned
--                 by a process of the previous release), which are measured
--                 from created_at, the best that is known of them.

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS in_doubt_since timestamptz NULL;

INSERT INTO idem_schema_version (version, description)
VALUES (6, 'when a claim went in doubt: in_doubt_since')
ON CONFLICT (version) DO NOTHING;
