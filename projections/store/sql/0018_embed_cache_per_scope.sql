-- The Embed RPC's cache per caller scope: per org only, its `cached` flag told a sibling team
-- whether anyone in the org had embedded an exact text (docs/security.md). Rows from before
-- belong to no scope: emptied (it is a cache; each caller's next Embed refills its own).
TRUNCATE embedding_cache;  -- not DELETE: row-level security would hide rows from an admin without BYPASSRLS
ALTER TABLE embedding_cache ADD COLUMN scope_path text NOT NULL;
ALTER TABLE embedding_cache DROP CONSTRAINT embedding_cache_pkey;
ALTER TABLE embedding_cache ADD PRIMARY KEY (org_id, scope_path, content_hash, model_version);
