-- Guardrail layers L1-L4 (ARCHITECTURE.md section 8; docs/guardrails.md).
--
-- Written only by the projection of `guardrail.published` (projections/projector/guardrail_layers.py),
-- read by ResolveGuardrailLayers, ValidatePrompt and AssembleContext
-- (projections/reads/guardrail_layers.py).
--
-- guardrail_layers      every accepted version of every layer, never updated or deleted. Per
--                       (org_id, scope_path, level) the versions are 1, 2, 3 ... in log order
--                       (one partition per (scope, level)); "current" is the highest version.
-- guardrail_rejections  published events the projection refused (bad signature, wrong scope for
--                       the level, stale signing time, malformed payload): never served, kept
--                       so the operator command and audits can say why.
--
-- Owners: L1 rows belong to the reserved org '_platform' (no token can carry an org id that
-- starts with '_'), L2 to an org (scope_path = org_id), L3 to a team (org/pillar/team), L4 to an
-- agent (org/pillar/team/agent).

CREATE TABLE guardrail_layers (
    org_id          text NOT NULL CHECK (org_id <> ''),
    scope_path      text NOT NULL,
    level           smallint NOT NULL CHECK (level BETWEEN 1 AND 4),
    version         bigint NOT NULL CHECK (version >= 1),
    event_id        uuid NOT NULL UNIQUE,    -- the guardrail.published event: idempotence key
    content         text NOT NULL,
    content_hash    text NOT NULL,           -- SHA-256 of content's UTF-8 bytes, lowercase hex
    effective_at_ms bigint NOT NULL,         -- = the signed signed_at_ms (unix ms)
    signature       bytea NOT NULL,          -- Ed25519, 64 bytes
    public_key      bytea NOT NULL,          -- raw Ed25519 public key, 32 bytes
    key_fingerprint text NOT NULL,           -- SHA-256 of public_key, lowercase hex
    published_by    text NOT NULL,           -- the event's actor
    published_at    timestamptz NOT NULL,    -- the event's occurred_at
    PRIMARY KEY (org_id, scope_path, level, version),
    CHECK ((level = 1) = (org_id = '_platform'))
);
CREATE INDEX guardrail_layers_hash ON guardrail_layers (org_id, content_hash);

CREATE TABLE guardrail_rejections (
    event_id        uuid PRIMARY KEY,
    org_id          text NOT NULL CHECK (org_id <> ''),
    scope_path      text NOT NULL,           -- the event's owner scope
    level           smallint,                -- as the payload said, when it said one
    outcome         text NOT NULL,           -- REJECTED_* (guardrail_projection.py)
    detail          text NOT NULL,
    content_hash    text,
    key_fingerprint text,
    published_by    text NOT NULL,
    published_at    timestamptz NOT NULL
);
CREATE INDEX guardrail_rejections_scope ON guardrail_rejections (org_id, scope_path, level);

SELECT enable_org_isolation(t::regclass)
FROM unnest(ARRAY['guardrail_layers', 'guardrail_rejections']) AS t;

-- L1 is platform-wide: every org reads the platform's rows, and only them, and only L1 (the
-- CHECK above makes every '_platform' row an L1 row). Policies are permissive, so a caller
-- sees its own org's rows (org_isolation) OR these. The policy is FOR SELECT: it grants no
-- write, and WITH CHECK of org_isolation still confines writes to the org in app.org_id, so
-- only a transaction that set app.org_id = '_platform' (the projector applying an L1 event)
-- writes L1 rows. A connection that set no app.org_id (NULL, or '' after a transaction-local
-- setting ended) sees nothing, L1 included.
CREATE POLICY platform_layers_readable ON guardrail_layers FOR SELECT
    USING (org_id = '_platform' AND level = 1
           AND coalesce(current_setting('app.org_id', true), '') <> '');

-- The API only reads.
GRANT SELECT ON guardrail_layers, guardrail_rejections TO context_engine_api;
