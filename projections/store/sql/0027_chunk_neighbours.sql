-- Search scores the turns beside its best candidates even when neither leg's pool held them
-- (projections/reads/search.py, `_fused`: the adjacent-turn lift then reaches them at any depth),
-- each read by its session, position and chunk index (the first or last chunks of a long
-- message, not all of them). The session index gains them: beside a second index on
-- (org_id, session_id) the planner read a session's every chunk per lookup. The new index is
-- built before the old one is dropped, so reads go on during the build.
CREATE INDEX chunks_session_position ON chunks (org_id, session_id, seq, chunk_index) WHERE session_id IS NOT NULL;
DROP INDEX chunks_session;
ALTER INDEX chunks_session_position RENAME TO chunks_session;
