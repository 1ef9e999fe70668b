-- The savings baseline of AssembleContext counts every chunk the caller could retrieve. Summing
-- token_count over the org's chunks on each sampled call cost ~117 ms at 100,000 chunks; the
-- total is now maintained by deltas beside N and the total length, and the caller's own session
-- (counted with its history instead) is subtracted through an index on the session's chunks.
ALTER TABLE corpus_stats ADD COLUMN token_total bigint NOT NULL DEFAULT 0;

UPDATE corpus_stats s
SET token_total = t.tokens
FROM (SELECT org_id, scope_path, domain, sum(token_count)::bigint AS tokens
      FROM chunks WHERE searchable GROUP BY 1, 2, 3) t
WHERE s.org_id = t.org_id AND s.scope_path = t.scope_path AND s.domain = t.domain;

CREATE INDEX chunks_session ON chunks (org_id, session_id) WHERE session_id IS NOT NULL;
