-- idem schema, version 5: outcomes in doubt, and failures kept. Idempotent;
-- existing rows keep their state, and both columns are added without
-- rewriting the table.
--
-- Claim states, besides `pending` (in flight) and `success` (forever):
--   in_doubt: the body could not say whether its effect happened (it
--             returned an error it classed as in doubt, panicked, was
--             dropped, or its lease ran out with on_expiry = "in_doubt").
--             The slot is held: nobody runs it until it is resolved, by a
--             reconciler or an operator (`idem claims resolve`).
--   failed:   a definite failure the action chose to keep: duplicates are
--             refused, never run.
--
-- state_reason: how the claim got to its state: body_in_doubt,
--               lease_expired, kept_failure, operator, reconciled, ...
--               (free text, written by the runtime; NULL for rows written
--               before this version, and for pending and settled claims).
-- resolved_at:  when a reconciler or an operator resolved the claim.
--
-- The CHECK is replaced in two steps: added NOT VALID (no scan, and only a
-- brief lock), then validated (a scan that blocks no reader or writer). A
-- process of the previous release writes only pending and success, which
-- it still accepts.

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS state_reason text        NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS resolved_at  timestamptz NULL;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'idem_records_claim_state'
          AND conrelid = 'idem_records'::regclass
          AND pg_get_constraintdef(oid) LIKE '%in_doubt%'
    ) THEN
        ALTER TABLE idem_records DROP CONSTRAINT IF EXISTS idem_records_claim_state;
        ALTER TABLE idem_records ADD CONSTRAINT idem_records_claim_state CHECK (
            kind <> 'claim' OR state IN ('pending', 'success', 'in_doubt', 'failed')
        ) NOT VALID;
    END IF;
END
$$;

ALTER TABLE idem_records VALIDATE CONSTRAINT idem_records_claim_state;

INSERT INTO idem_schema_version (version, description)
VALUES (5, 'outcomes in doubt and kept failures: states in_doubt, failed; state_reason, resolved_at')
ON CONFLICT (version) DO NOTHING;
