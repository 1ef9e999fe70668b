-- A snapshot name is its creator scope's: per session only, an agent could take the name its
-- team meant to use, and the team's PullContext(snapshot_name) then read the agent's choice of
-- state (docs/security.md). The creator's scope comes from the snapshot's archived event.
ALTER TABLE snapshots ADD COLUMN scope_path text;
UPDATE snapshots s
SET scope_path = concat_ws('/', e.scope ->> 'org_id', nullif(e.scope ->> 'pillar_id', ''),
                           nullif(e.scope ->> 'team_id', ''), nullif(e.scope ->> 'agent_id', ''))
FROM (SELECT event_id, convert_from(raw, 'UTF8')::jsonb -> 'scope' AS scope FROM event_archive) AS e
WHERE e.event_id = s.event_id;
UPDATE snapshots SET scope_path = org_id WHERE scope_path IS NULL;  -- no archived event: the org's
ALTER TABLE snapshots ALTER COLUMN scope_path SET NOT NULL;
ALTER TABLE snapshots DROP CONSTRAINT snapshots_org_id_session_id_name_key;
ALTER TABLE snapshots ADD CONSTRAINT snapshots_name_per_creator UNIQUE (org_id, session_id, scope_path, name);
