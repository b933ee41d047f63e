-- idem schema, version 7: steps inside one claim. Idempotent.
--
-- A step (idem::step) is a row of kind 'step' at an address of its own,
-- arbitrated by the same two partial unique indexes as a claim. It names
-- the claim it belongs to (claim_address, in the same account and
-- namespace), so that `idem claims show` lists a claim's steps and prune
-- removes them with it. A step is 'pending' while its holder runs it (or
-- after its holder was cut off inside it) and 'success' once recorded.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS claim_address text NULL;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'idem_records_step_complete'
          AND conrelid = 'idem_records'::regclass
    ) THEN
        ALTER TABLE idem_records ADD CONSTRAINT idem_records_step_complete CHECK (
            kind <> 'step'
            OR (state IN ('pending', 'success') AND claim_address IS NOT NULL)
        );
    END IF;
END
$$;

-- A claim's steps, for `idem claims show` and prune: only step rows are in it.
-- Created through EXECUTE: when Citus already distributes the table, it
-- sends a CREATE INDEX on to every shard as the text of the statement that
-- holds it, and a script of several statements is refused there ("cannot
-- insert multiple commands into a prepared statement").
DO $$
BEGIN
    EXECUTE 'CREATE INDEX IF NOT EXISTS idem_records_steps_of_claim '
            'ON idem_records (account, claim_address) WHERE kind = ''step''';
END
$$;

INSERT INTO idem_schema_version (version, description)
VALUES (7, 'steps inside one claim: kind step, claim_address')
ON CONFLICT (version) DO NOTHING;
