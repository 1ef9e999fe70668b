-- The audit trail (issue #21): one row per AuditAccessEvent of the audit:access stream, written by
-- the worker's audit-writer (projections/projector/audit_rows.py), idempotent on the stream's message_id. A
-- row is never updated or deleted by the engine; consuming the stream again gives the same rows
-- (recorded_at aside). The actor is the caller's scope; its org owns the row.
CREATE TABLE audit_access (
    org_id         text NOT NULL CHECK (org_id <> ''),
    message_id     uuid NOT NULL,
    actor_pillar   text NOT NULL DEFAULT '',
    actor_team     text NOT NULL DEFAULT '',
    actor_agent    text NOT NULL DEFAULT '',
    resource_type  text NOT NULL,
    resource_id    text NOT NULL,           -- text: a denied attempt may name what is no resource id
    operation      text NOT NULL,
    share_id       text NOT NULL DEFAULT '', -- '' unless the access went through a grant
    outcome        text NOT NULL CHECK (outcome IN ('allowed', 'denied')),
    denial_reason  text NOT NULL DEFAULT '',
    occurred_at    timestamptz NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, message_id)
);
-- `context-engine audit`: newest first, by time range, and by actor subtree, resource or denials.
CREATE INDEX audit_access_by_time ON audit_access (org_id, occurred_at DESC);
CREATE INDEX audit_access_by_actor ON audit_access (org_id, actor_pillar, actor_team, actor_agent, occurred_at DESC);
CREATE INDEX audit_access_by_resource ON audit_access (org_id, resource_id, occurred_at DESC);
CREATE INDEX audit_access_denied ON audit_access (org_id, occurred_at DESC) WHERE outcome = 'denied';
SELECT enable_org_isolation('audit_access');
-- Readable by the API within its own org; written only by the worker.
GRANT SELECT ON audit_access TO context_engine_api;
