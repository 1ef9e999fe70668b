-- Sources whose content is longer than chunk_projection.INLINE_INDEX_BYTES: the projector writes
-- the source and this request in its transaction, and the worker's chunk indexer cuts the chunks
-- after the commit (projections/projector/deferred_indexing.py), so one long content does not hold up the
-- acknowledgement of every event batched with it. Done requests are deleted with the chunks'
-- commit; a request left by a crash is found by the worker's sweep; one that failed 5 times stays,
-- with its last error, and is tried no more (the source's content stays unretrievable).
CREATE TABLE indexing_requests (
    org_id          text NOT NULL CHECK (org_id <> ''),
    source_event_id uuid NOT NULL,
    source_kind     text NOT NULL CHECK (source_kind IN ('event', 'memory')),
    added_by        uuid NOT NULL,          -- the event that asked (a memory's: its memory.scrubbed)
    requested_at    timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,   -- failed tries; the indexer gives up at 5
    last_error      text,
    PRIMARY KEY (org_id, source_event_id)
);
SELECT enable_org_isolation('indexing_requests');
-- The sweep reads every org's requests under app.org_id '_system'.
CREATE POLICY system_sweep ON indexing_requests FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');
GRANT SELECT ON indexing_requests TO context_engine_api;
