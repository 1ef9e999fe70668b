-- Compaction outcomes (docs/compaction.md): why each compaction request closed, and one row per
-- applied session.compacted event. Both are projections of the log, so replay rebuilds them and
-- `context-engine stats compaction` reads them.
ALTER TABLE compaction_requests ADD COLUMN closed_reason text
    CHECK (closed_reason IN ('below_threshold', 'compacted', 'rolled_back'));
UPDATE compaction_requests SET closed_reason = 'below_threshold' WHERE closed_by IS NOT NULL;

CREATE TABLE compactions (
    org_id               text NOT NULL CHECK (org_id <> ''),
    event_id             uuid NOT NULL,
    session_id           text NOT NULL,
    actor                text NOT NULL,
    strategy             text NOT NULL,
    summarizer           text NOT NULL,
    replaced_turns       integer NOT NULL,
    original_tokens      bigint NOT NULL,
    compacted_tokens     bigint NOT NULL,
    fact_retention_score double precision NOT NULL,
    occurred_at          timestamptz NOT NULL,
    PRIMARY KEY (org_id, event_id)
);
CREATE INDEX compactions_session ON compactions (org_id, session_id);

SELECT enable_org_isolation('compactions'::regclass);
GRANT SELECT ON compactions TO context_engine_api;

-- The worker finds the requests still open at its start (a job lost with the job stream) across
-- orgs, and `stats compaction` reports every org's, read-only under app.org_id '_system' and only
-- as a member of context_engine_system (0016).
CREATE POLICY system_sweep ON compaction_requests FOR SELECT TO context_engine_system
    USING (current_setting('app.org_id', true) = '_system');
CREATE POLICY system_report ON compactions FOR SELECT TO context_engine_system
    USING (current_setting('app.org_id', true) = '_system');
