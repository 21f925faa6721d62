-- A tenant's departure (DESIGN "A tenant's departure"; ADR 0075, 0076).
--
-- The OML service sets tenant_policy.departed_at in the same transaction as the tenant's last
-- journalled act; a schema deployed before the column existed gets it here.
ALTER TABLE oml.tenant_policy ADD COLUMN IF NOT EXISTS departed_at timestamptz;

-- The lake-writer's record of a tenant's purge, one row per tenant: written as the purge starts
-- (state purging, with the inventory of what it is about to remove), completed with the receipt
-- when nothing of the tenant is left under its prefix (state purged). A row in either state takes
-- the tenant out of the drain and out of the tenants the writer covers, so a purged prefix is
-- never filled again from the retained outbox.
CREATE TABLE IF NOT EXISTS oml.lake_tenant_purge (
    tenant_id    uuid        PRIMARY KEY,
    state        text        NOT NULL CHECK (state IN ('purging', 'purged')),
    requested_by text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    removed      jsonb       NOT NULL,
    receipt      jsonb,
    CHECK ((state = 'purged') = (finished_at IS NOT NULL AND receipt IS NOT NULL))
);

-- Row-level security as on the writer's other tables (migration 0004, ADR 0049): one tenant's
-- purge sees and writes that tenant's row only; the cross-tenant parts (the drain's pending list,
-- the tenant list, doctor) read every row and write none.
GRANT SELECT, INSERT, UPDATE ON oml.lake_tenant_purge TO oml_lake_tenant;
GRANT SELECT ON oml.lake_tenant_purge TO oml_lake_cross;
-- The purge removes the writer's own records of the tenant.
GRANT DELETE ON oml.lake_frontier, oml.lake_verdicts, oml.lake_dead_letter TO oml_lake_tenant;

ALTER TABLE oml.lake_tenant_purge ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_rows ON oml.lake_tenant_purge;
CREATE POLICY tenant_rows ON oml.lake_tenant_purge TO oml_lake_tenant
    USING (tenant_id = NULLIF(current_setting('oml.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('oml.tenant_id', true), '')::uuid);
DROP POLICY IF EXISTS every_tenant ON oml.lake_tenant_purge;
CREATE POLICY every_tenant ON oml.lake_tenant_purge TO oml_lake_cross USING (true);
