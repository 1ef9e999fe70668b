-- Core read models of the session write path (ARCHITECTURE.md sections 4-6).
--
-- Written only by the projection worker (projections/session_projector.py), read by the API
-- through the group role context_engine_api (migrate.py makes the login role a member of it).
-- Every table carries org_id, and row-level security is enabled AND forced on every table with
-- one policy comparing org_id with the GUC app.org_id: a connection that did not
-- `SELECT set_config('app.org_id', $org, true)` in its transaction sees zero rows.
-- No foreign keys: rows arrive in log order from one writer per partition, and bulk replay
-- inserts whole batches at once.

-- Enables and forces org isolation on a table; later migrations call it for their tables.
CREATE FUNCTION enable_org_isolation(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format(
        'CREATE POLICY org_isolation ON %s '
        'USING (org_id = current_setting(''app.org_id'', true)) '
        'WITH CHECK (org_id = current_setting(''app.org_id'', true))', tbl);
END
$$;
REVOKE ALL ON FUNCTION enable_org_isolation(regclass) FROM PUBLIC;

-- Every event verbatim, with its log position: the durability anchor of embedded mode (a
-- command is acknowledged once its event is here) and the source of restore and replay.
-- archive_seq is the order of first archival, which is log order within every partition: restore
-- and replay follow it. The position is where the event was first archived from; it is not
-- unique, because a broker restored after a crash may place records at other offsets (an
-- unacknowledged produce can land before the restore), and that must not stop the projector.
CREATE TABLE event_archive (
    event_id       uuid PRIMARY KEY,
    archive_seq    bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    org_id         text NOT NULL CHECK (org_id <> ''),
    topic          text NOT NULL,
    partition      integer NOT NULL,
    "offset"       bigint NOT NULL,
    aggregate      text NOT NULL,
    type           text NOT NULL,
    schema_version integer NOT NULL,
    occurred_at    timestamptz NOT NULL,
    actor          text NOT NULL,
    content_hash   text NOT NULL,
    raw            bytea NOT NULL,          -- Event.to_bytes(): the canonical form on the log
    archived_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_archive_position ON event_archive (topic, partition, "offset");
CREATE INDEX event_archive_aggregate ON event_archive (org_id, aggregate);

-- One row per session: its current state version and chain position.
CREATE TABLE sessions (
    org_id         text NOT NULL CHECK (org_id <> ''),
    session_id     text NOT NULL,
    scope_path     text NOT NULL,           -- owner: the scope of the session's first event
    pillar_id      text NOT NULL DEFAULT '',
    team_id        text NOT NULL DEFAULT '',
    scope_agent_id text NOT NULL DEFAULT '',
    genesis        text NOT NULL,           -- v0 = genesis_version('{org_id}/{session_id}')
    version        text NOT NULL,           -- current state version (lowercase hex)
    seq            bigint NOT NULL,         -- seq of the item that produced `version` (0 = genesis)
    max_seq        bigint NOT NULL,         -- highest seq ever allocated; the next item gets max_seq + 1
    item_count     bigint NOT NULL,         -- items ever appended (active or not)
    active_count   bigint NOT NULL,         -- items in the current state
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    last_event_id  uuid NOT NULL,           -- last event that changed this row
    PRIMARY KEY (org_id, session_id)
);

-- The chain: one item per ingested event or pushed memory, in log order.
CREATE TABLE session_items (
    org_id         text NOT NULL CHECK (org_id <> ''),
    session_id     text NOT NULL,
    seq            bigint NOT NULL,         -- monotonic per session, never reused
    event_id       uuid NOT NULL UNIQUE,
    kind           text NOT NULL CHECK (kind IN ('event', 'memory')),
    content_hash   text NOT NULL,           -- Event.content_hash: the chain input
    prev_seq       bigint NOT NULL,         -- item this one chained from (0 = genesis)
    version        text NOT NULL,           -- next_version(version of prev_seq, content_hash)
    active         boolean NOT NULL DEFAULT true,
    rolled_back_by uuid,                    -- the rollback event that deactivated it
    occurred_at    timestamptz NOT NULL,
    PRIMARY KEY (org_id, session_id, seq)
);

-- Every version a session has had, genesis included: rollback targets are checked here.
-- A version reached twice (same active content after a rollback) points at its latest item.
CREATE TABLE session_versions (
    org_id         text NOT NULL CHECK (org_id <> ''),
    session_id     text NOT NULL,
    version        text NOT NULL,
    seq            bigint NOT NULL,         -- item that produced it (0 = genesis)
    depth          bigint NOT NULL,         -- number of active items in that state
    introduced_by  uuid NOT NULL,
    at             timestamptz NOT NULL,
    PRIMARY KEY (org_id, session_id, version)
);

-- Ingested conversation events (IngestEvent).
CREATE TABLE session_events (
    event_id       uuid PRIMARY KEY,
    org_id         text NOT NULL CHECK (org_id <> ''),
    session_id     text NOT NULL,
    seq            bigint NOT NULL,
    scope_path     text NOT NULL,
    pillar_id      text NOT NULL DEFAULT '',
    team_id        text NOT NULL DEFAULT '',
    scope_agent_id text NOT NULL DEFAULT '',
    event_type     text NOT NULL,           -- message | tool_output | workflow_event
    content        bytea NOT NULL,
    metadata       jsonb NOT NULL DEFAULT '{}',
    content_sha256 text NOT NULL,           -- IngestEventResponse.version_hash
    token_count    integer NOT NULL,
    version        text NOT NULL,           -- session version after this item
    occurred_at    timestamptz NOT NULL,
    active         boolean NOT NULL DEFAULT true
);
CREATE INDEX session_events_session ON session_events (org_id, session_id, seq);

-- Pushed memory (PushContext); PullContext reads the newest active row.
CREATE TABLE memory_versions (
    event_id        uuid PRIMARY KEY,
    org_id          text NOT NULL CHECK (org_id <> ''),
    scope_path      text NOT NULL,
    pillar_id       text NOT NULL DEFAULT '',
    team_id         text NOT NULL DEFAULT '',
    scope_agent_id  text NOT NULL DEFAULT '',
    agent_id        text NOT NULL,          -- whose memory (payload), not necessarily the writer
    session_id      text,                   -- NULL: memory outside any session (no chain item)
    seq             bigint,                 -- chain item seq when in a session
    memory_type     text NOT NULL,          -- episodic | semantic | working
    content         bytea NOT NULL,
    metadata        jsonb NOT NULL DEFAULT '{}',
    content_sha256  text NOT NULL,          -- PushContextResponse.version_hash
    session_version text,                   -- session version after this item
    created_at      timestamptz NOT NULL,
    active          boolean NOT NULL DEFAULT true
);
CREATE INDEX memory_versions_agent_session
    ON memory_versions (org_id, agent_id, session_id, seq DESC) WHERE active;
CREATE INDEX memory_versions_agent_latest
    ON memory_versions (org_id, agent_id, created_at DESC) WHERE active;

-- Named, immutable snapshots: name -> version + materialised state.
CREATE TABLE snapshots (
    snapshot_id    uuid PRIMARY KEY,
    org_id         text NOT NULL CHECK (org_id <> ''),
    session_id     text NOT NULL,
    name           text NOT NULL,
    version        text NOT NULL,
    seq            bigint NOT NULL,
    state          jsonb NOT NULL,          -- {"version", "seq", "items": [{seq, event_id, kind, content_hash, version}]}
    event_id       uuid NOT NULL,
    created_at     timestamptz NOT NULL,
    created_by     text NOT NULL,
    UNIQUE (org_id, session_id, name)
);

-- Last applied log offset per projector and partition (seek-after-restart). The worker's
-- own rows live under org '_system'.
CREATE TABLE projector_offsets (
    org_id         text NOT NULL DEFAULT '_system' CHECK (org_id <> ''),
    projector      text NOT NULL,
    topic          text NOT NULL,
    partition      integer NOT NULL,
    "offset"       bigint NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, projector, topic, partition)
);

SELECT enable_org_isolation(t::regclass)
FROM unnest(ARRAY['event_archive', 'sessions', 'session_items', 'session_versions',
                  'session_events', 'memory_versions', 'snapshots', 'projector_offsets']) AS t;

-- The API only reads; it never writes read models (every write goes through the log).
GRANT SELECT ON event_archive, sessions, session_items, session_versions, session_events,
                memory_versions, snapshots, projector_offsets TO context_engine_api;
