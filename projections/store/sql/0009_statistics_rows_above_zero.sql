-- corpus_stats and term_stats are counts over the searchable chunks and postings, kept by deltas.
-- From now on a row exists only while its count is above zero (the projector deletes rows that
-- a rollback or a rescan brings to zero), so a recount, which is what a replay does, gives the
-- same rows as the deltas. Rows already at zero go now.
DELETE FROM term_stats WHERE df = 0;
DELETE FROM corpus_stats WHERE n_docs = 0;
