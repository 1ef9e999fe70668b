"""Totals of the caller's visible corpus, from `corpus_stats` (kept by the projector per scope
and domain, so their cost does not grow with the corpus): AssembleContext's retrieval depth and
its baseline (the naive prompt's corpus tokens). SQL only, on the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from context_engine.visibility import Visibility


@dataclass(frozen=True)
class CorpusTotals:
    tokens: int
    chunks: int


async def visible_totals(conn: asyncpg.Connection, org: str, visible: Visibility) -> CorpusTotals:
    """The stored (cl100k) tokens and the searchable chunks of the corpus the caller sees."""
    row = await conn.fetchrow(
        "SELECT coalesce(sum(token_total), 0)::bigint AS tokens, coalesce(sum(n_docs), 0)::bigint AS chunks "
        "FROM corpus_stats WHERE org_id = $1 AND scope_path = ANY($2::text[])",
        org, visible.sql_paths)
    return CorpusTotals(row["tokens"], row["chunks"])


async def tokens_outside_session(conn: asyncpg.Connection, org: str, visible: Visibility, session_id: str) -> int:
    """The visible corpus's tokens less those of the session's own searchable chunks (the
    baseline counts the session's history already)."""
    return int(await conn.fetchval(
        "SELECT (SELECT coalesce(sum(token_total), 0) FROM corpus_stats "
        "        WHERE org_id = $1 AND scope_path = ANY($2::text[])) "
        "     - (SELECT coalesce(sum(token_count), 0) FROM chunks "
        "        WHERE org_id = $1 AND session_id = $3 AND searchable AND scope_path = ANY($2::text[]))",
        org, visible.sql_paths, session_id))
