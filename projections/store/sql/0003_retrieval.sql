-- Retrieval read models (ARCHITECTURE.md section 7; docs/retrieval.md).
--
-- chunks        what Search ranks: one row per chunk of an ingested event or pushed semantic
--               memory (projections/retrieval/chunking.py), with its vector once embedded.
-- chunk_terms   BM25 postings: one row per (chunk, analysed term) with the term frequency,
--               carrying the chunk's visibility columns so the lexical leg never joins.
-- corpus_stats  BM25's N and total document length per (scope, domain), over searchable
--               chunks; the visible corpus of a caller is the sum over its own and ancestor scopes.
-- content_vectors  every vector the embedding pipeline recorded on the log (event
--               embedding.recorded), by content hash and model: replay restores vectors from it
--               instead of recomputing them.
-- embedding_cache  the Embed RPC's cache (30-day TTL), written by the API.
--
-- A chunk is searchable when active (no rollback removed its source) and pii_status = 'clear'.

CREATE TABLE chunks (
    chunk_id        uuid PRIMARY KEY,
    org_id          text NOT NULL CHECK (org_id <> ''),
    scope_path      text NOT NULL,
    source_event_id uuid NOT NULL,
    source_kind     text NOT NULL CHECK (source_kind IN ('event', 'memory')),
    session_id      text,
    chunk_index     integer NOT NULL,
    domain          text NOT NULL DEFAULT '',
    content         text NOT NULL,
    content_hash    text NOT NULL,
    token_count     integer NOT NULL,
    term_count      integer NOT NULL,       -- |D| for BM25: analysed terms after stop words
    metadata        jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL,
    active          boolean NOT NULL DEFAULT true,
    pii_status      text NOT NULL DEFAULT 'clear' CHECK (pii_status IN ('clear', 'quarantined')),
    searchable      boolean GENERATED ALWAYS AS (active AND pii_status = 'clear') STORED,
    embedding       vector,
    embedding_model text,
    embedding_dims  integer GENERATED ALWAYS AS (vector_dims(embedding)) STORED
);
CREATE INDEX chunks_source ON chunks (org_id, source_event_id);
CREATE INDEX chunks_content_hash ON chunks (org_id, content_hash);
CREATE INDEX chunks_unembedded ON chunks (org_id, created_at) WHERE embedding IS NULL;
-- One HNSW index per embedding dimension (pgvector indexes need a fixed dimension); the
-- default embedder's is here, others are created by ensure_vector_index() at worker start.
CREATE INDEX chunks_embedding_384 ON chunks
    USING hnsw ((embedding::vector(384)) vector_cosine_ops) WHERE embedding_dims = 384;

CREATE TABLE chunk_terms (
    org_id     text NOT NULL CHECK (org_id <> ''),
    term       text NOT NULL,
    chunk_id   uuid NOT NULL,
    tf         integer NOT NULL,
    doc_length integer NOT NULL,
    scope_path text NOT NULL,
    domain     text NOT NULL,
    searchable boolean NOT NULL,
    PRIMARY KEY (org_id, term, chunk_id)
);
CREATE INDEX chunk_terms_chunk ON chunk_terms (org_id, chunk_id);

CREATE TABLE corpus_stats (
    org_id       text NOT NULL CHECK (org_id <> ''),
    scope_path   text NOT NULL,
    domain       text NOT NULL,
    n_docs       bigint NOT NULL,
    total_length bigint NOT NULL,
    PRIMARY KEY (org_id, scope_path, domain)
);

CREATE TABLE content_vectors (
    org_id        text NOT NULL CHECK (org_id <> ''),
    content_hash  text NOT NULL,
    model_version text NOT NULL,
    embedding     vector NOT NULL,
    recorded_at   timestamptz NOT NULL,
    event_id      uuid NOT NULL,
    PRIMARY KEY (org_id, content_hash, model_version)
);

CREATE TABLE embedding_cache (
    org_id        text NOT NULL CHECK (org_id <> ''),
    content_hash  text NOT NULL,
    model_version text NOT NULL,
    embedding     real[] NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, content_hash, model_version)
);

SELECT enable_org_isolation(t::regclass)
FROM unnest(ARRAY['chunks', 'chunk_terms', 'corpus_stats', 'content_vectors',
                  'embedding_cache']) AS t;

-- The worker's embedding backlog sweep reads chunks of every org, read-only, under the
-- transaction-local app.org_id '_system' (no org id can start with '_': scope.ID_PATTERN).
CREATE POLICY system_sweep ON chunks FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');

GRANT SELECT ON chunks, chunk_terms, corpus_stats, content_vectors TO context_engine_api;
-- The one table the API writes: a cache, not a read model (nothing replays from it).
GRANT SELECT, INSERT, UPDATE, DELETE ON embedding_cache TO context_engine_api;

-- An HNSW index for another embedding dimension (a configured OpenAI-compatible model).
CREATE FUNCTION ensure_vector_index(dims integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE INDEX IF NOT EXISTS chunks_embedding_%s ON chunks '
                   'USING hnsw ((embedding::vector(%s)) vector_cosine_ops) WHERE embedding_dims = %s',
                   dims, dims, dims);
END
$$;
REVOKE ALL ON FUNCTION ensure_vector_index(integer) FROM PUBLIC;
