-- idem schema, version 4: outcomes that hold any value, and claim lineage.
-- Idempotent; both columns are added without rewriting the table.
--
-- output_json: the settled Ok value, as the text serde_json wrote. jsonb
--              (version 3's `output`, still read for rows settled before)
--              refuses some of what JSON can say (`\u0000`), and a settle
--              must never fail because of the value it carries.
-- first_fence: the fence the claim began with, once a lease takeover gave
--              the row a new one (NULL: never taken over, so it is `fence`).
--              A holder whose settle finds another fence can then tell
--              "taken over" (same lineage) from "released and claimed anew".

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS output_json text   NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS first_fence bigint NULL;

INSERT INTO idem_schema_version (version, description)
VALUES (4, 'outcomes as text (output_json), claim lineage (first_fence)')
ON CONFLICT (version) DO NOTHING;
