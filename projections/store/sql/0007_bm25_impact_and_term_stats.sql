-- Make the lexical leg independent of how common a query term is (docs/retrieval.md, "Scale").
--
-- term_stats: document frequency per (scope, domain, term) over searchable chunks, maintained by
-- deltas like corpus_stats, so df of the caller's visible corpus is a handful of index lookups
-- instead of a count over every posting of the term.
--
-- chunk_terms.impact: the posting's BM25 term weight without idf, with a reference average length:
--   tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_length / 16))
-- The lexical leg reads the top postings of each query term by impact (index below), scores
-- those candidates, and computes exact BM25 for the ones it keeps.
CREATE TABLE term_stats (
    org_id     text NOT NULL CHECK (org_id <> ''),
    scope_path text NOT NULL,
    domain     text NOT NULL,
    term       text NOT NULL,
    df         bigint NOT NULL,
    PRIMARY KEY (org_id, term, scope_path, domain)
);
SELECT enable_org_isolation('term_stats'::regclass);
GRANT SELECT ON term_stats TO context_engine_api;

INSERT INTO term_stats (org_id, scope_path, domain, term, df)
SELECT org_id, scope_path, domain, term, count(*) FROM chunk_terms WHERE searchable
GROUP BY org_id, scope_path, domain, term;

ALTER TABLE chunk_terms ADD COLUMN impact real NOT NULL DEFAULT 0;
UPDATE chunk_terms SET impact = tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * doc_length / 16.0));
CREATE INDEX chunk_terms_impact ON chunk_terms (org_id, term, impact DESC) WHERE searchable;
