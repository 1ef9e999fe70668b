"""The Embed cache (commands/embed_texts.py): vectors by content hash and model, per caller
scope, from `embedding_cache` (younger than the TTL) or from `content_vectors` (what the
embedding pipeline recorded) for content of a chunk the caller sees. SQL only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg
import numpy as np
from pgvector import Vector

from context_engine.scope import Scope
from context_engine.visibility import Visibility


async def lookup(conn: asyncpg.Connection, caller: Scope, visible: Visibility, model_version: str,
                 content_hashes: Sequence[str], ttl_days: int) -> dict[str, np.ndarray]:
    """The vectors known for `content_hashes`: the caller scope's cache entries of this model
    younger than `ttl_days`, and the pipeline's vectors of content the caller sees."""
    rows = await conn.fetch(
        "SELECT content_hash, embedding FROM embedding_cache "
        "WHERE org_id = $1 AND scope_path = $5 AND model_version = $2 AND content_hash = ANY($3::text[]) "
        "  AND created_at > now() - make_interval(days => $4) "
        "UNION ALL "
        "SELECT v.content_hash, v.embedding::real[] FROM content_vectors v "
        "WHERE v.org_id = $1 AND v.model_version = $2 AND v.content_hash = ANY($3::text[]) "
        "  AND EXISTS (SELECT FROM chunks c WHERE c.org_id = $1 AND c.content_hash = v.content_hash "
        "              AND c.searchable AND c.scope_path = ANY($6::text[]))",
        caller.org_id, model_version, list(content_hashes), ttl_days, caller.path, visible.sql_paths)
    return {r["content_hash"]: np.asarray(r["embedding"], dtype=np.float32) for r in rows}


async def store(conn: asyncpg.Connection, caller: Scope, model_version: str,
                vectors: Mapping[str, np.ndarray]) -> None:
    """File fresh vectors under the caller's scope, replacing an expired entry (computed now)."""
    hashes = list(vectors)
    await conn.execute(
        "INSERT INTO embedding_cache (org_id, scope_path, content_hash, model_version, embedding) "
        "SELECT $1, $5, u.h, $2, u.v::real[] FROM unnest($3::text[], $4::vector[]) AS u(h, v) "
        "ON CONFLICT (org_id, scope_path, content_hash, model_version) DO UPDATE "
        "SET embedding = EXCLUDED.embedding, created_at = now()",
        caller.org_id, model_version, hashes, [Vector(vectors[h]) for h in hashes], caller.path)
