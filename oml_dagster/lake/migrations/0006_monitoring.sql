-- What the metrics exporter serves beyond the contract's tables (ADR 0066, ADR 0067).
--
-- oml.lake_writer_counters: the writers' own counters (commits by table action, retries by
-- fault class, the batches' wall time), each row a running total that every writer process adds
-- its increments to. A row never decreases, so Prometheus reads each as a counter however many
-- writers add to it and however often they restart. `tenant_id` is NULL for what belongs to no
-- tenant (a retry, the writers' heartbeat).
CREATE TABLE IF NOT EXISTS oml.lake_writer_counters (
    tenant_id  uuid,
    name       text             NOT NULL,
    label      text             NOT NULL DEFAULT '',
    value      double precision NOT NULL,
    updated_at timestamptz      NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS lake_writer_counters_key ON oml.lake_writer_counters
    (COALESCE(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid), name, label);

-- oml.lake_check_results: each reconciler check's findings at its tenant's last recorded run
-- (0: it passed). A run replaces its tenant's rows.
CREATE TABLE IF NOT EXISTS oml.lake_check_results (
    tenant_id  uuid        NOT NULL,
    check_name text        NOT NULL,
    findings   integer     NOT NULL CHECK (findings >= 0),
    checked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, check_name)
);

-- The writers add to the counters in the cross-tenant scope; a reconciler run records its
-- tenant's results in that tenant's scope; the exporter reads both in the cross scope.
GRANT SELECT, INSERT, UPDATE ON oml.lake_writer_counters TO oml_lake_cross;
GRANT SELECT, INSERT, UPDATE, DELETE ON oml.lake_check_results TO oml_lake_tenant;
GRANT SELECT ON oml.lake_check_results TO oml_lake_cross;
ALTER TABLE oml.lake_check_results ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_rows ON oml.lake_check_results;
CREATE POLICY tenant_rows ON oml.lake_check_results TO oml_lake_tenant
    USING (tenant_id = NULLIF(current_setting('oml.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('oml.tenant_id', true), '')::uuid);
DROP POLICY IF EXISTS every_tenant ON oml.lake_check_results;
CREATE POLICY every_tenant ON oml.lake_check_results TO oml_lake_cross USING (true);
