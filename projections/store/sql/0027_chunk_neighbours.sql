-- Search scores the turns beside its best candidates even when neither leg's pool held them
-- (projections/reads/search.py, `_fused`: the adjacent-turn lift then reaches them at any depth),
-- each read by its session and position. The session index gains the position: with a second
-- index on (org_id, session_id) the planner read a session's every chunk per lookup.
DROP INDEX chunks_session;
CREATE INDEX chunks_session ON chunks (org_id, session_id, seq) WHERE session_id IS NOT NULL;
