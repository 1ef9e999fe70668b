-- Compaction (issue #22, docs/compaction.md): a session.compacted event is a chain item (kind
-- 'event', its summary a session_events row) that replaces the older turns it names. The state of
-- a version is the items on its chain back to genesis minus those a compaction on that chain
-- replaced, so a rollback to a version before the compaction brings them back.
ALTER TABLE session_items ADD COLUMN replaces bigint[] NOT NULL DEFAULT '{}';  -- seqs this item replaced
-- The summary's session_events row has the seq of the first turn it replaced (its place in the
-- conversation; history is read in seq order), its chain item the next seq: session_events.seq is
-- the turn's position, no longer unique per session.
COMMENT ON COLUMN session_events.seq IS 'position in the conversation: the chain item seq, or for a compaction summary the first replaced turn''s';
