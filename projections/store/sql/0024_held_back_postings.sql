-- The postings of chunks that are not searchable (quarantined by the PII scan, or rolled back),
-- for Search's count of the matches it holds back (projections/reads/quarantined_matches.py): a few
-- index probes per query term, whatever the size of the searchable corpus.
CREATE INDEX chunk_terms_held_back ON chunk_terms (org_id, term) WHERE NOT searchable;
