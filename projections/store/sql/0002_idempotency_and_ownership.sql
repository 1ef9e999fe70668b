-- IngestEvent's idempotency-key, per session: the first event of a session carrying a key is
-- projected; a later one with the same key (a retry that raced the first) is archived but not
-- projected, and the handler answers with the first one's result. Per session, not per org:
-- a session's events share one partition, so "first" is a pure function of log order and
-- replay decides the same way; across partitions there is no order to replay.
ALTER TABLE session_events ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX session_events_idempotency_key
    ON session_events (org_id, session_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
