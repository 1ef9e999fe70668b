-- The worker's sweeps and reports read every org's rows under app.org_id '_system' (0003, 0004,
-- 0006, 0011, 0013, 0014). Those policies applied to every role, so the API's login role opened
-- every org at once with `SET app.org_id = '_system'`. From here they apply only to members of
-- context_engine_system: a NOLOGIN role that migrate creates before this file runs and grants
-- to the admin role (the worker's), never to the app role or context_engine_api (migrate refuses).
ALTER POLICY system_sweep  ON chunks             TO context_engine_system;
ALTER POLICY system_sweep  ON memory_versions    TO context_engine_system;
ALTER POLICY system_report ON savings_by_model   TO context_engine_system;
ALTER POLICY system_sweep  ON vector_assignments TO context_engine_system;
ALTER POLICY system_reads  ON rejected_events    TO context_engine_system;
ALTER POLICY system_sweep  ON indexing_requests  TO context_engine_system;

-- And the API reads and writes only under a name that can be an org's: no org id starts with
-- '_' (scope.ID_PATTERN), while '_system' owns the worker's offsets and the rejected records
-- that name no org, and '_platform' the platform's layer rejections. A RESTRICTIVE policy is
-- ANDed with the permissive ones, so under such a name the API's roles see no row of any table
-- (the platform's L1 layers stay readable under the caller's own org: 0005). The sub-select
-- makes it one evaluation per query, not one per row.
CREATE OR REPLACE FUNCTION api_names_one_org(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'CREATE POLICY api_names_one_org ON %s AS RESTRICTIVE TO context_engine_api '
        'USING ((SELECT left(current_setting(''app.org_id'', true), 1) <> ''_'')) '
        'WITH CHECK ((SELECT left(current_setting(''app.org_id'', true), 1) <> ''_''))', tbl);
END
$$;
REVOKE ALL ON FUNCTION api_names_one_org(regclass) FROM PUBLIC;

SELECT api_names_one_org(c.oid::regclass)
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relrowsecurity
ORDER BY c.relname;

-- Tables that later migrations isolate get the same policy.
CREATE OR REPLACE FUNCTION enable_org_isolation(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format(
        'CREATE POLICY org_isolation ON %s '
        'USING (org_id = current_setting(''app.org_id'', true)) '
        'WITH CHECK (org_id = current_setting(''app.org_id'', true))', tbl);
    PERFORM api_names_one_org(tbl);
END
$$;
REVOKE ALL ON FUNCTION enable_org_isolation(regclass) FROM PUBLIC;
