-- A turn's chunks carry its position in the session (issue #38): Search lifts a candidate toward
-- the candidates beside it in its session (projections/retrieval/fusion.py, WeightedFusion.lift),
-- and reading each candidate's seq from session_events cost a lookup per candidate (+22% CPU
-- per Search, +38% per AssembleContext at LoCoMo's pools). Set by the projector with the chunk;
-- NULL for memory and summary chunks.
ALTER TABLE chunks ADD COLUMN seq bigint;

-- The owner runs this; when it is not a superuser or BYPASSRLS, the tables' forced row-level
-- security would hide every row from it here (app.org_id is not set).
ALTER TABLE chunks NO FORCE ROW LEVEL SECURITY;
ALTER TABLE session_events NO FORCE ROW LEVEL SECURITY;
UPDATE chunks c SET seq = e.seq
FROM session_events e
WHERE c.source_kind = 'event' AND e.org_id = c.org_id AND e.event_id = c.source_event_id;
ALTER TABLE chunks FORCE ROW LEVEL SECURITY;
ALTER TABLE session_events FORCE ROW LEVEL SECURITY;
