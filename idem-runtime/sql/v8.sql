-- idem schema, version 8: when a step's claim was last released. Idempotent.
--
-- Releasing a claim (its body's failure that changed nothing, an operator's
-- release, a reconciler's "it did not happen") deletes the claim's row and
-- keeps its steps, for the retry to replay. Prune removes such orphaned
-- steps by age; measured from when each was recorded, a claim held (in
-- doubt, say) past the prune horizon and then released would lose its
-- finished steps to the next prune, and its retry would run them again.
-- Every release stamps its claim's steps with released_at, in the same
-- statement, and prune measures an orphaned step's age from the later of
-- the two times.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS released_at timestamptz NULL;

INSERT INTO idem_schema_version (version, description)
VALUES (8, 'released_at: when a step''s claim was last released')
ON CONFLICT (version) DO NOTHING;
