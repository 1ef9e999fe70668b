"""What the embedding pipeline reads: the chunks still without a vector from the running model,
and the vectors already recorded for a content (`content_vectors`, the dedup by content hash).

Each function takes a connection on which the caller has set `app.org_id` for this transaction
(`projections.store.pool.org_transaction`); the backlog is read under '_system'.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import asyncpg
import numpy as np

from context_engine.scope import Scope

_IN_SCOPE = "org_id = $1 AND (scope_path = $2 OR starts_with(scope_path, $2 || '/'))"


async def contents_of_chunks_without_model_vector(conn: asyncpg.Connection, org_id: str, chunk_ids: Sequence[str],
                                                  model_version: str) -> dict[str, str]:
    """content hash -> content, for those of these chunks whose vector is not from `model_version`."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (content_hash) content_hash, content FROM chunks "
        "WHERE org_id = $1 AND chunk_id = ANY($2::uuid[]) "
        "  AND embedding_model IS DISTINCT FROM $3",
        org_id, list(chunk_ids), model_version)
    return {r["content_hash"]: r["content"] for r in rows}


async def contents_in_scope_without_model_vector(conn: asyncpg.Connection, scope: Scope, model_version: str,
                                                 limit: int) -> dict[str, str]:
    """content hash -> content, the first `limit` by hash, of the chunks owned at `scope` or below
    whose vector is not from `model_version` (a reindex's page)."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (content_hash) content_hash, content FROM chunks "
        "WHERE org_id = $1 AND (scope_path = $2 OR starts_with(scope_path, $2 || '/')) "
        "  AND embedding_model IS DISTINCT FROM $3 "
        "ORDER BY content_hash LIMIT $4",
        scope.org_id, scope.path, model_version, limit)
    return {r["content_hash"]: r["content"] for r in rows}


async def chunks_without_vector(conn: asyncpg.Connection, *, older_than: dt.timedelta, limit: int,
                                after: tuple[dt.datetime, str] | None) -> list[tuple[str, str, dt.datetime]]:
    """(org, chunk id, created_at) of searchable chunks without a vector created before
    `older_than` ago, in (created_at, chunk_id) order after `after`, at most `limit` of them."""
    rows = await conn.fetch(
        "SELECT org_id, chunk_id, created_at FROM chunks WHERE embedding IS NULL AND searchable "
        "  AND created_at < now() - $1::interval"
        "  AND ($3::timestamptz IS NULL OR (created_at, chunk_id) > ($3, $4::uuid))"
        " ORDER BY created_at, chunk_id LIMIT $2",
        older_than, limit, after[0] if after else None, after[1] if after else None)
    return [(r["org_id"], str(r["chunk_id"]), r["created_at"]) for r in rows]


async def recorded_vectors(conn: asyncpg.Connection, org_id: str, model_version: str,
                           content_hashes: Sequence[str]) -> dict[str, np.ndarray]:
    """The vectors `model_version` already recorded for these contents, by content hash."""
    return {r["content_hash"]: np.asarray(r["embedding"], dtype=np.float32) for r in await conn.fetch(
        "SELECT content_hash, embedding::real[] AS embedding FROM content_vectors "
        "WHERE org_id = $1 AND model_version = $2 AND content_hash = ANY($3::text[])",
        org_id, model_version, list(content_hashes))}


async def count_chunks_without_model_vector(conn: asyncpg.Connection, org_id: str, content_hashes: list[str],
                                            model_version: str) -> int:
    """How many chunks of these contents still have no vector from `model_version`."""
    return await conn.fetchval(
        "SELECT count(*) FROM chunks WHERE org_id = $1 AND content_hash = ANY($2::text[]) "
        "  AND embedding_model IS DISTINCT FROM $3", org_id, content_hashes, model_version)


async def model_coverage_in_scope(conn: asyncpg.Connection, scope: Scope,
                                  model_version: str) -> tuple[int, int, str | None]:
    """Of the chunks owned at `scope` or below: how many, how many have a vector from
    `model_version`, and the most common other model (None: none). Two statements on `conn`."""
    row = await conn.fetchrow(
        f"SELECT count(*) AS total, count(*) FILTER (WHERE embedding_model = $3) AS current "
        f"FROM chunks WHERE {_IN_SCOPE}", scope.org_id, scope.path, model_version)
    previous = await conn.fetchval(
        f"SELECT embedding_model FROM chunks WHERE {_IN_SCOPE} AND embedding_model <> $3 "
        f"GROUP BY embedding_model ORDER BY count(*) DESC LIMIT 1", scope.org_id, scope.path, model_version)
    return row["total"], row["current"], previous
