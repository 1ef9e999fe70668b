-- Read models of the assembly hot path (docs/assembly.md).

-- Compaction trigger: one open request per session while its history stays above 80 % of the
-- budget AssembleContext was called with. Opened by `session.compaction_threshold` (crossed) —
-- the worker then publishes the CompactionJob — and closed by the same event (not crossed), so a
-- session gets one job per crossing whatever the number of API replicas calling.
CREATE TABLE compaction_requests (
    org_id        text NOT NULL CHECK (org_id <> ''),
    session_id    text NOT NULL,
    opened_by     uuid NOT NULL,
    token_count   bigint NOT NULL,
    token_budget  bigint NOT NULL,
    opened_at     timestamptz NOT NULL,
    closed_by     uuid,
    closed_at     timestamptz
);
CREATE UNIQUE INDEX compaction_requests_open ON compaction_requests (org_id, session_id) WHERE closed_by IS NULL;

-- Savings samples (BaselineMetricEvent) and their aggregate per org and model: the
-- baseline-calculator projection, idempotent on the stream message id.
CREATE TABLE savings_samples (
    message_id       uuid PRIMARY KEY,
    org_id           text NOT NULL CHECK (org_id <> ''),
    prompt_id        text NOT NULL,
    session_id       text NOT NULL,
    model_id         text NOT NULL,
    assembled_tokens bigint NOT NULL,
    naive_tokens     bigint NOT NULL,
    sampled_at       timestamptz NOT NULL
);
CREATE TABLE savings_by_model (
    org_id           text NOT NULL CHECK (org_id <> ''),
    model_id         text NOT NULL,
    samples          bigint NOT NULL,
    assembled_tokens bigint NOT NULL,
    naive_tokens     bigint NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (org_id, model_id)
);

SELECT enable_org_isolation(t::regclass)
FROM unnest(ARRAY['compaction_requests', 'savings_samples', 'savings_by_model']) AS t;
CREATE POLICY system_report ON savings_by_model FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');
GRANT SELECT ON compaction_requests, savings_samples, savings_by_model TO context_engine_api;
