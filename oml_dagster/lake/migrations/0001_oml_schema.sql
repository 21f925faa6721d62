-- The Postgres contract of the lake-writer (DESIGN §2), schema oml.
CREATE SCHEMA IF NOT EXISTS oml;

-- Producers insert here in the same transaction as the act and its journal event.
-- seq is NULL until the sequencer assigns it (gap-free, increasing, global).
CREATE TABLE oml.outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    uuid        NOT NULL,
    journal_seq  bigint      NOT NULL CHECK (journal_seq >= 1),
    op           text        NOT NULL,
    payload      jsonb       NOT NULL,
    seq          bigint      UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    sequenced_at timestamptz
);
CREATE INDEX outbox_unsequenced ON oml.outbox (tenant_id, journal_seq, id) WHERE seq IS NULL;
CREATE INDEX outbox_tenant_seq ON oml.outbox (tenant_id, seq) WHERE seq IS NOT NULL;

-- Per-tenant position of the stable-prefix cut: the last journal_seq and seq sequenced.
CREATE TABLE oml.sequencer_tenant (
    tenant_id        uuid PRIMARY KEY,
    last_journal_seq bigint      NOT NULL,
    last_seq         bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE oml.claim_bodies (
    tenant_id       uuid   NOT NULL,
    artifact_id     uuid   NOT NULL,
    version         bigint NOT NULL,
    body_ciphertext bytea  NOT NULL,
    PRIMARY KEY (tenant_id, artifact_id, version)
);

CREATE TABLE oml.api_keys (
    api_key_id  text        PRIMARY KEY,
    tenant_id   uuid        NOT NULL,
    public_key  bytea       NOT NULL CHECK (length(public_key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_tenant ON oml.api_keys (tenant_id);

CREATE TABLE oml.tenant_policy (
    tenant_id          uuid     PRIMARY KEY,
    lake_erasure_bound interval NOT NULL DEFAULT interval '7 days'
                                CHECK (lake_erasure_bound > interval '0')
);

-- A cache of how far each table is drained; the Delta log is the authority.
CREATE TABLE oml.lake_frontier (
    tenant_id     uuid        NOT NULL,
    table_name    text        NOT NULL,
    batch_end     bigint      NOT NULL,
    txn_version   bigint      NOT NULL,
    table_version bigint,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, table_name)
);

-- How far each tenant's op verdicts (applied or refused) are decided. Verdicts are recorded
-- before any table commits, so every table's txn version stays at or below this.
CREATE TABLE oml.lake_verdicts (
    tenant_id       uuid PRIMARY KEY,
    decided_through bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Ops the writer refused, keyed by the op's seq so a replay records it once.
CREATE TABLE oml.lake_dead_letter (
    seq          bigint      PRIMARY KEY,
    tenant_id    uuid        NOT NULL,
    journal_seq  bigint      NOT NULL,
    op           text        NOT NULL,
    payload      jsonb       NOT NULL,
    reason       text        NOT NULL,
    refused_at   timestamptz NOT NULL DEFAULT now(),
    requeued_at  timestamptz,
    requeued_by  text,
    requeued_id  bigint
);
CREATE INDEX lake_dead_letter_tenant ON oml.lake_dead_letter (tenant_id, seq);
