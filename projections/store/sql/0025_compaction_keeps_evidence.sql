-- Compaction that keeps evidence reachable (issue #36, docs/compaction.md).
--
-- A compaction's summary is one session_events row per line (event_type 'compaction'), placed
-- at the position of the turn it stands for (`stands_for`, seq = that turn's seq) and dated by
-- it, all of one compaction sharing `summary_of` (the session.compacted event, whose chain item
-- they follow on a rollback).
ALTER TABLE session_events ADD COLUMN summary_of uuid, ADD COLUMN stands_for uuid;
CREATE INDEX session_events_summary_of ON session_events (org_id, summary_of) WHERE summary_of IS NOT NULL;

-- A summary line's chunk ('summary') is in the prompt as history, pinned or required, never
-- retrieved: the turns it stands for stay searchable (recall storage) and are what Search finds.
ALTER TABLE chunks DROP CONSTRAINT chunks_source_kind_check,
    ADD CONSTRAINT chunks_source_kind_check CHECK (source_kind IN ('event', 'memory', 'summary'));
ALTER TABLE chunks ALTER COLUMN searchable
    SET EXPRESSION AS (active AND pii_status = 'clear' AND source_kind <> 'summary');

-- A request the worker refuses closes, saying why and at which session version (AssembleContext
-- opens no new one until the session changes).
ALTER TABLE compaction_requests DROP CONSTRAINT compaction_requests_closed_reason_check,
    ADD CONSTRAINT compaction_requests_closed_reason_check
        CHECK (closed_reason IN ('below_threshold', 'compacted', 'rolled_back', 'refused')),
    ADD COLUMN refusal text,
    ADD COLUMN closed_version text;

-- Read models projected before: the turns a compaction on the current chain replaced become
-- retrievable again, and the chunks of a summary written as one row stop being retrieved. (Such
-- a summary stays one history row, dated by its compaction; `context-engine replay` rebuilds it
-- as lines: docs/compaction.md, "Upgrading".) The migrating role owns these tables; without
-- BYPASSRLS their forced row-level security would hide every row from it (app.org_id is not set).
DO $$
DECLARE
    tbl text;
    tables text[] := ARRAY['chunks', 'chunk_terms', 'session_items', 'session_events', 'corpus_stats', 'term_stats'];
BEGIN
    FOREACH tbl IN ARRAY tables LOOP
        EXECUTE format('ALTER TABLE %I NO FORCE ROW LEVEL SECURITY', tbl);
    END LOOP;
    IF EXISTS (SELECT 1 FROM session_items WHERE cardinality(replaces) > 0) THEN
        UPDATE chunks c SET active = true
        FROM session_items i
        WHERE c.org_id = i.org_id AND c.source_event_id = i.event_id AND NOT c.active AND i.kind = 'event'
          AND EXISTS (SELECT 1 FROM session_items k WHERE k.org_id = i.org_id AND k.session_id = i.session_id
                      AND k.active AND i.seq = ANY(k.replaces));
        UPDATE chunks c SET source_kind = 'summary'
        FROM session_events e
        WHERE c.org_id = e.org_id AND c.source_event_id = e.event_id AND e.event_type = 'compaction';
        UPDATE chunk_terms t SET searchable = c.searchable
        FROM chunks c
        WHERE c.org_id = t.org_id AND c.chunk_id = t.chunk_id AND t.searchable <> c.searchable;
        DELETE FROM corpus_stats;
        INSERT INTO corpus_stats (org_id, scope_path, domain, n_docs, total_length, token_total)
        SELECT org_id, scope_path, domain, count(*), sum(term_count), sum(token_count) FROM chunks
        WHERE searchable GROUP BY org_id, scope_path, domain;
        DELETE FROM term_stats;
        INSERT INTO term_stats (org_id, scope_path, domain, term, df)
        SELECT org_id, scope_path, domain, term, count(*) FROM chunk_terms
        WHERE searchable GROUP BY org_id, scope_path, domain, term;
    END IF;
    FOREACH tbl IN ARRAY tables LOOP
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', tbl);
    END LOOP;
END
$$;
