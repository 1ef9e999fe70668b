-- Share grants (issue #21): one row per share.created event, revoked in place by share.revoked.
-- A live grant (revoked_at IS NULL) widens what its grantee scope and the scopes below it see
-- (context_engine/visibility.py); the grantor is the creating event's scope, the creator its actor.
CREATE TABLE share_grants (
    org_id           text NOT NULL CHECK (org_id <> ''),
    share_id         uuid NOT NULL,
    resource_type    text NOT NULL CHECK (resource_type IN ('chunk', 'snapshot', 'layer')),
    resource_id      uuid NOT NULL,
    grantor_path     text NOT NULL,
    created_by       text NOT NULL,
    grantee_scope    text NOT NULL CHECK (grantee_scope IN ('org', 'pillar', 'team', 'agent')),
    grantee_path     text NOT NULL,
    permissions      text[] NOT NULL CHECK (permissions <@ ARRAY['read', 'use_in_assembly']
                                            AND cardinality(permissions) > 0),
    reason           text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL,
    event_id         uuid NOT NULL,
    revoked_at       timestamptz,
    revoked_by       text,
    revoke_reason    text,
    revoked_event_id uuid,
    PRIMARY KEY (org_id, share_id)
);
-- The grants a caller holds: grantee = its own scope or an ancestor's, live.
CREATE INDEX share_grants_live ON share_grants (org_id, grantee_path, resource_type) WHERE revoked_at IS NULL;
-- ListShares: the grants a scope created, in creation order.
CREATE INDEX share_grants_by_grantor ON share_grants (org_id, grantor_path, created_at, share_id);
CREATE INDEX share_grants_by_resource ON share_grants (org_id, resource_id);
SELECT enable_org_isolation('share_grants');
GRANT SELECT ON share_grants TO context_engine_api;
