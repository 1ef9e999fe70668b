-- The Embed RPC's cache per caller scope: per org only, its `cached` flag told a sibling team
-- whether anyone in the org had embedded an exact text (docs/security.md). Rows from before
-- belong to no scope (''), are never hit, and expire with the TTL.
ALTER TABLE embedding_cache ADD COLUMN scope_path text NOT NULL DEFAULT '';
ALTER TABLE embedding_cache DROP CONSTRAINT embedding_cache_pkey;
ALTER TABLE embedding_cache ADD PRIMARY KEY (org_id, scope_path, content_hash, model_version);
