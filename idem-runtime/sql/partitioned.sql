-- idem_records hash-partitioned on account, into {partitions} partitions.
--
-- Created in place of version 1's plain table, before the migrations run:
-- they then find the table (CREATE TABLE IF NOT EXISTS), its columns (ADD
-- COLUMN IF NOT EXISTS) and its constraints already there, and create the
-- two partial unique indexes on the partitioned table, which PostgreSQL
-- builds on every partition (and on every partition attached later). They
-- are allowed because account, the partition key, is in both.
--
-- The columns and constraints are those of the latest version; a test
-- compares them with a plain table's, so the two forms cannot drift apart.

CREATE SEQUENCE IF NOT EXISTS idem_records_fence_seq;

CREATE TABLE idem_records (
    account          text        NOT NULL,
    kind             text        NOT NULL,
    address          text        NOT NULL
                     CONSTRAINT idem_records_address_format CHECK (address ~ '^[a-z0-9_]+$'),
    namespace        text        NULL,
    state            text        NOT NULL,
    identity         bytea       NOT NULL,
    created_at       timestamptz NULL DEFAULT now(),
    settled_at       timestamptz NULL,
    meter            text        NULL,
    quantity         bigint      NULL,
    occurred_at      timestamptz NULL,
    output           jsonb       NULL,
    fingerprint      bytea       NULL,
    fence            bigint      NOT NULL DEFAULT nextval('idem_records_fence_seq'),
    lease_expires_at timestamptz NULL,
    output_json      text        NULL,
    first_fence      bigint      NULL,
    state_reason     text        NULL,
    resolved_at      timestamptz NULL,
    in_doubt_since   timestamptz NULL,
    CONSTRAINT idem_records_claim_state CHECK (
        kind <> 'claim' OR state IN ('pending', 'success', 'in_doubt', 'failed')
    ),
    CONSTRAINT idem_records_meter_event_complete CHECK (
        kind <> 'meter_event'
        OR (meter IS NOT NULL AND quantity IS NOT NULL AND occurred_at IS NOT NULL)
    )
) PARTITION BY HASH (account);

DO $$
BEGIN
    FOR remainder IN 0..{partitions} - 1 LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF idem_records FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
            'idem_records_p' || remainder, {partitions}, remainder
        );
    END LOOP;
END
$$;
