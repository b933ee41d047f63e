-- idem schema, version 2: usage metering by address. Idempotent.
--
-- A usage event is a row of kind 'meter_event' whose address is derived
-- from the event's own identifier, so the partial unique indexes of version 1
-- make a re-sent event land on the row it already has: no other unique index
-- is needed.

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS meter       text        NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS quantity    bigint      NULL;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS occurred_at timestamptz NULL;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'idem_records_meter_event_complete'
          AND conrelid = 'idem_records'::regclass
    ) THEN
        ALTER TABLE idem_records ADD CONSTRAINT idem_records_meter_event_complete CHECK (
            kind <> 'meter_event'
            OR (meter IS NOT NULL AND quantity IS NOT NULL AND occurred_at IS NOT NULL)
        );
    END IF;
END
$$;

-- Totals by meter and time range, within an account.
CREATE INDEX IF NOT EXISTS idem_records_meter_totals
    ON idem_records (account, meter, occurred_at) WHERE kind = 'meter_event';

INSERT INTO idem_schema_version (version, description)
VALUES (2, 'usage metering: meter, quantity, occurred_at')
ON CONFLICT (version) DO NOTHING;
