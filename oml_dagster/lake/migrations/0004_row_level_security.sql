-- Row-level security on every tenant-scoped table of schema oml (ADR 0049).
--
-- Two group roles, neither able to log in nor to bypass RLS:
--   oml_lake_tenant  one tenant's work: the batch fetch, verdicts, frontier, dead letters,
--                    bodies, keys, policies. Sees and writes only the rows of the tenant named
--                    by the transaction's setting oml.tenant_id (no setting: no rows).
--   oml_lake_cross   the cross-tenant parts: the sequencer's cut, the pending list, the lag
--                    report, the tenant list, doctor and dead letters over every tenant. Sees
--                    every tenant's rows, and may write only what the sequencer writes.
-- The lake-writer takes one of them per transaction (SET LOCAL ROLE, db.tenant_scope /
-- db.cross_scope), so a connection returned to a pool carries neither role nor tenant. A
-- deployment's login role for the writer is a member of both and holds nothing of its own
-- (README, "PostgreSQL roles"); the tables' owner (whoever runs the migrations) is not subject
-- to the policies, which is how producers and migrations keep working.
--
-- Roles belong to the cluster, not the database: created once, found by every later database.
DO $$
BEGIN
    CREATE ROLE oml_lake_tenant NOLOGIN NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;
DO $$
BEGIN
    CREATE ROLE oml_lake_cross NOLOGIN NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;

GRANT USAGE ON SCHEMA oml TO oml_lake_tenant, oml_lake_cross;
GRANT SELECT ON oml.schema_migrations TO oml_lake_tenant, oml_lake_cross;

-- What one tenant's work reads and writes.
GRANT SELECT, INSERT ON oml.outbox TO oml_lake_tenant;
GRANT SELECT ON oml.sequencer_tenant, oml.claim_bodies, oml.api_keys, oml.tenant_policy
    TO oml_lake_tenant;
GRANT SELECT, INSERT, UPDATE ON oml.lake_frontier, oml.lake_verdicts, oml.lake_dead_letter
    TO oml_lake_tenant;

-- What the cross-tenant parts read, and the sequencer's writes.
GRANT SELECT ON oml.outbox, oml.sequencer_tenant, oml.tenant_policy, oml.lake_frontier,
    oml.lake_verdicts, oml.lake_dead_letter, oml.api_keys TO oml_lake_cross;
GRANT UPDATE (seq, sequenced_at) ON oml.outbox TO oml_lake_cross;
GRANT INSERT, UPDATE ON oml.sequencer_tenant TO oml_lake_cross;

-- The policies: the tenant role meets its own rows only; the cross role meets every row.
DO $$
DECLARE
    scoped text;
BEGIN
    FOREACH scoped IN ARRAY ARRAY['outbox', 'sequencer_tenant', 'claim_bodies', 'api_keys',
                                  'tenant_policy', 'lake_frontier', 'lake_verdicts',
                                  'lake_dead_letter']
    LOOP
        EXECUTE format('ALTER TABLE oml.%I ENABLE ROW LEVEL SECURITY', scoped);
        EXECUTE format('DROP POLICY IF EXISTS tenant_rows ON oml.%I', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_rows ON oml.%I TO oml_lake_tenant'
            ' USING (tenant_id = NULLIF(current_setting(''oml.tenant_id'', true), '''')::uuid)'
            ' WITH CHECK (tenant_id = NULLIF(current_setting(''oml.tenant_id'', true), '''')::uuid)',
            scoped);
        EXECUTE format('DROP POLICY IF EXISTS every_tenant ON oml.%I', scoped);
        EXECUTE format(
            'CREATE POLICY every_tenant ON oml.%I TO oml_lake_cross USING (true) WITH CHECK (true)',
            scoped);
    END LOOP;
END
$$;

-- The one cross-tenant read a tenant's batch needs: which tenant owns each api key an event
-- names (an event signed with another tenant's key is refused as such, not as an unknown key).
-- Owner and key id only, never the public key; runs with its owner's rights.
CREATE OR REPLACE FUNCTION oml.api_key_owners(key_ids text[])
RETURNS TABLE (api_key_id text, tenant_id text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.api_key_id, k.tenant_id::text FROM oml.api_keys k WHERE k.api_key_id = ANY(key_ids)
$$;
REVOKE ALL ON FUNCTION oml.api_key_owners(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION oml.api_key_owners(text[]) TO oml_lake_tenant, oml_lake_cross;
