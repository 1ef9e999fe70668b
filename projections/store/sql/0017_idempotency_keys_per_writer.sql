-- An idempotency-key names one request of one writer. Per session alone, a sibling team's key in
-- a session both write to answered the other's retry with the sibling's event (its id, and that
-- the key was used), and a sibling's first use of the same key was dropped as a retry of it.
-- Unique per (session, writer scope) instead; every existing row stays unique under it.
DROP INDEX session_events_idempotency_key;
CREATE UNIQUE INDEX session_events_idempotency_key_per_writer
    ON session_events (org_id, session_id, scope_path, idempotency_key) WHERE idempotency_key IS NOT NULL;
