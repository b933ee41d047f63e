-- idem schema, version 3: the opt-in modes. Idempotent.
--
-- output:           the settled Ok value (JSON), for `replay`
-- fingerprint:      a digest of the invocation's payload, for `fingerprint`
-- fence:            the fencing token, from a sequence: every claim and every
--                   lease takeover gets a higher one, so a late settle or
--                   release by an earlier holder matches nothing (even after
--                   the row was deleted and claimed anew)
-- lease_expires_at: when a pending claim may be taken over, for `lease`
--                   (NULL: it holds until resolved)

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS output           jsonb       NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS fingerprint      bytea       NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS fence            bigint      NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS lease_expires_at timestamptz NULL;

-- Existing rows keep fence 0 (a constant default adds the column without
-- rewriting the table); new rows draw from the sequence.
CREATE SEQUENCE IF NOT EXISTS idem_records_fence_seq;
ALTER TABLE idem_records ALTER COLUMN fence SET DEFAULT nextval('idem_records_fence_seq');

INSERT INTO idem_schema_version (version, description)
VALUES (3, 'modes: output, fingerprint, fence, lease_expires_at')
ON CONFLICT (version) DO NOTHING;
