-- The HNSW graphs hold half-precision copies of the vectors (pgvector's halfvec). Measured at
-- 100,000 MiniLM vectors (docs/benchmarks.md): the index is 112 MB instead of 196 MB, a search
-- for 294 neighbours ~7 % faster, and the neighbours found the same share of the exact ones.
-- Only the graph is approximate: the vectors stay float32, and a candidate's cosine is computed
-- on them. Every embedder L2-normalises its vectors (inference/embedder.py), so each component is
-- within half precision's range. Searches order by `embedding::halfvec(N) <=> query::halfvec(N)` (projections/reads/search.py).
CREATE OR REPLACE FUNCTION ensure_vector_index(dims integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE INDEX IF NOT EXISTS chunks_embedding_%s ON chunks '
                   'USING hnsw ((embedding::halfvec(%s)) halfvec_cosine_ops) WHERE embedding_dims = %s',
                   dims, dims, dims);
END
$$;

DO $$
DECLARE
    idx record;
BEGIN
    FOR idx IN
        SELECT indexname, substring(indexname FROM '^chunks_embedding_([0-9]+)$')::integer AS dims
        FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename = 'chunks'
          AND indexname ~ '^chunks_embedding_[0-9]+$' AND indexdef LIKE '%vector_cosine_ops%'
    LOOP
        EXECUTE format('DROP INDEX %I', idx.indexname);
        PERFORM ensure_vector_index(idx.dims);
    END LOOP;
END
$$;
