-- idem schema, version 14: a claim's lease keeps its own on_expiry.
-- Idempotent.
--
-- What a pending claim whose lease ran out becomes was the policy of the
-- retry that found it: a claim made with on_expiry = "in_doubt" (its
-- holder may have charged the card, and no retry may run it again) was
-- taken over by a retry that said "take_over", or nothing, as a deploy
-- that changes the option, or another call site of the same action, does.
-- The claim now records its own policy (expires_in_doubt = true; NULL
-- for take_over, the default, so most rows pay nothing for it), and a
-- retry holds the slot in doubt when either the claim or the retry says
-- so: fail closed. A takeover needs both to say take_over, so the row it
-- takes over already says NULL, as its taker would.
--
-- A nullable column without a default: adding it changes the catalog only
-- (no rewrite, no scan), but takes an ACCESS EXCLUSIVE lock; looked up
-- first, so that applying this script again takes no lock at all. No index
-- reads it. Rows written before it say NULL: take_over, as they were
-- judged before.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'idem_records'::regclass AND attname = 'expires_in_doubt'
                     AND NOT attisdropped) THEN
        ALTER TABLE idem_records ADD COLUMN expires_in_doubt boolean NULL;
    END IF;
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (14, 'a claim keeps its own on_expiry: expires_in_doubt')
ON CONFLICT (version) DO NOTHING;
