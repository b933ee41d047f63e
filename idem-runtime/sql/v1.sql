-- idem schema, version 1. Idempotent: running it again changes nothing.
--
-- Apply it with your own migration tool if you prefer, then use
-- Gate::connect_without_setup (or Gate::connect, which then only verifies).

CREATE TABLE IF NOT EXISTS idem_schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- One table of addressed records. The address is the constraint: a unique
-- index, enforced by PostgreSQL, lets exactly one concurrent insert win.
CREATE TABLE IF NOT EXISTS idem_records (
    account    text        NOT NULL,
    kind       text        NOT NULL,
    address    text        NOT NULL
               CONSTRAINT idem_records_address_format CHECK (address ~ '^[a-z0-9_]+$'),
    namespace  text        NULL,
    state      text        NOT NULL,
    -- The full canonical identity: the address is a digest of it, so a hit is
    -- re-checked against these bytes. bytea, because keys may hold NUL.
    identity   bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz NULL,
    -- A claim is pending or settled; a failure deletes it, so there is no
    -- error state to get stuck in.
    CONSTRAINT idem_records_claim_state CHECK (kind <> 'claim' OR state IN ('pending', 'success'))
);

-- Uniqueness lives in exactly these two partial indexes. A unique index over
-- the nullable namespace column would enforce nothing for rows without a
-- namespace (NULLs are distinct), and NULLS NOT DISTINCT needs PostgreSQL 15
-- and is unknown to CockroachDB and YugabyteDB. account leads both, so the
-- table can be distributed by account.
CREATE UNIQUE INDEX IF NOT EXISTS idem_records_unique_without_namespace
    ON idem_records (account, kind, address) WHERE namespace IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS idem_records_unique_within_namespace
    ON idem_records (account, kind, address, namespace) WHERE namespace IS NOT NULL;

INSERT INTO idem_schema_version (version, description)
VALUES (1, 'idem_records with two partial unique indexes split on namespace IS NULL')
ON CONFLICT (version) DO NOTHING;
