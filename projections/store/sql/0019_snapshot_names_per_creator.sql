-- A snapshot name is its creator scope's: per session only, an agent could take the name its
-- team meant to use, and the team's PullContext(snapshot_name) then read the agent's choice of
-- state (docs/security.md). The creator's scope comes from the snapshot's archived event; a
-- snapshot whose event is missing or cannot be read as JSON (a \u0000 in it) is the org's.
ALTER TABLE snapshots ADD COLUMN scope_path text;
-- The migrating role owns both tables. Without BYPASSRLS (an external deployment's admin), their
-- forced row-level security would hide every row from it here (app.org_id is not set).
ALTER TABLE snapshots NO FORCE ROW LEVEL SECURITY;
ALTER TABLE event_archive NO FORCE ROW LEVEL SECURITY;
DO $$
DECLARE
    r record;
    scope jsonb;
BEGIN
    FOR r IN SELECT s.snapshot_id, s.org_id, a.raw FROM snapshots s
             LEFT JOIN event_archive a ON a.event_id = s.event_id AND a.org_id = s.org_id
                                      AND a.type = 'session.snapshot_created'
    LOOP
        scope := NULL;
        BEGIN
            scope := convert_from(r.raw, 'UTF8')::jsonb -> 'scope';
        EXCEPTION WHEN others THEN
            scope := NULL;
        END;
        UPDATE snapshots SET scope_path = CASE
            WHEN scope IS NULL OR scope ->> 'org_id' IS DISTINCT FROM r.org_id THEN r.org_id
            ELSE concat_ws('/', scope ->> 'org_id', nullif(scope ->> 'pillar_id', ''),
                           nullif(scope ->> 'team_id', ''), nullif(scope ->> 'agent_id', '')) END
        WHERE snapshot_id = r.snapshot_id;
    END LOOP;
END
$$;
ALTER TABLE snapshots FORCE ROW LEVEL SECURITY;
ALTER TABLE event_archive FORCE ROW LEVEL SECURITY;
ALTER TABLE snapshots ALTER COLUMN scope_path SET NOT NULL;
ALTER TABLE snapshots DROP CONSTRAINT snapshots_org_id_session_id_name_key;
ALTER TABLE snapshots ADD CONSTRAINT snapshots_name_per_creator UNIQUE (org_id, session_id, scope_path, name);
