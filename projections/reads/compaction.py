"""Reads of compaction's read models: the open requests the worker acts on (`compaction_requests`,
opened by session.compaction_threshold, closed by the threshold event, a compaction, a rollback or
the worker's refusal)
and the applied compactions `context-engine stats compaction` reports (`compactions`).

Each function takes a connection on which the caller has set `app.org_id` for this transaction
(`projections.store.pool.org_transaction`), or a pool for reports; reads across orgs run under '_system'.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg

from projections.store.pool import SYSTEM_ORG, org_transaction

# The actor of the compactions the worker writes (the RPC's are the caller's subject).
WORKER_ACTOR = "compaction-worker"


async def open_request(conn: asyncpg.Connection, org_id: str, session_id: str) -> str | None:
    """The event that opened the session's compaction request, if one is open (no threshold event,
    compaction or rollback has closed it)."""
    opened = await conn.fetchval(
        "SELECT opened_by FROM compaction_requests WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL",
        org_id, session_id)
    return None if opened is None else str(opened)


async def open_requests(conn: asyncpg.Connection, *, older_than: dt.timedelta,
                        after: tuple[dt.datetime, str] | None, limit: int) -> list[tuple[str, str, str, dt.datetime]]:
    """(org, session, opening event, opened at) of every org's open requests opened more than
    `older_than` ago, oldest first, the page after `after` (opened at, opening event of the last
    row of the previous page) (run under '_system')."""
    rows = await conn.fetch(
        "SELECT org_id, session_id, opened_by, opened_at FROM compaction_requests "
        "WHERE closed_by IS NULL AND opened_at < now() - $1::interval "
        "  AND ($2::timestamptz IS NULL OR (opened_at, opened_by) > ($2, $3::uuid)) "
        "ORDER BY opened_at, opened_by LIMIT $4",
        older_than, after[0] if after else None, after[1] if after else None, limit)
    return [(r["org_id"], r["session_id"], str(r["opened_by"]), r["opened_at"]) for r in rows]


async def compaction_applied(conn: asyncpg.Connection, org_id: str, event_id: str) -> bool | None:
    """Whether the projector applied this session.compacted event: None while it is not archived
    yet, then True, or False (archived and refused: STALE, UNKNOWN_TARGET, OUT_OF_SCOPE)."""
    row = await conn.fetchrow(
        "SELECT EXISTS (SELECT 1 FROM compactions WHERE org_id = $1 AND event_id = $2) AS applied "
        "FROM event_archive WHERE org_id = $1 AND event_id = $2", org_id, event_id)
    return None if row is None else bool(row["applied"])


@dataclass(frozen=True)
class CompactionStats:
    org_id: str
    requests_opened: int
    requests_open: int
    closed_compacted: int
    closed_rolled_back: int
    closed_below_threshold: int
    closed_refused: int
    compactions: int
    by_worker: int
    original_tokens: int
    compacted_tokens: int
    min_score: float | None
    mean_score: float | None


async def compaction_stats(pool: asyncpg.Pool, org_id: str | None = None) -> list[CompactionStats]:
    """Per org (every org when `org_id` is None): the requests and how they closed, and the
    compactions applied, by whom, their tokens and scores."""
    async with org_transaction(pool, org_id or SYSTEM_ORG, readonly=True) as conn:
        rows = await conn.fetch(_STATS, org_id, WORKER_ACTOR)
    return [CompactionStats(r["org_id"], r["opened"], r["open"], r["compacted"], r["rolled_back"], r["below"],
                            r["refused"], r["compactions"], r["by_worker"], r["original_tokens"], r["compacted_tokens"],
                            r["min_score"], r["mean_score"]) for r in rows]


_STATS = """
WITH requests AS (
    SELECT org_id, count(*) AS opened, count(*) FILTER (WHERE closed_by IS NULL) AS open,
           count(*) FILTER (WHERE closed_reason = 'compacted') AS compacted,
           count(*) FILTER (WHERE closed_reason = 'rolled_back') AS rolled_back,
           count(*) FILTER (WHERE closed_reason = 'below_threshold') AS below,
           count(*) FILTER (WHERE closed_reason = 'refused') AS refused
    FROM compaction_requests WHERE $1::text IS NULL OR org_id = $1 GROUP BY org_id
), applied AS (
    SELECT org_id, count(*) AS compactions, count(*) FILTER (WHERE actor = $2) AS by_worker,
           sum(original_tokens)::bigint AS original_tokens, sum(compacted_tokens)::bigint AS compacted_tokens,
           min(fact_retention_score) AS min_score, avg(fact_retention_score) AS mean_score
    FROM compactions WHERE $1::text IS NULL OR org_id = $1 GROUP BY org_id
)
SELECT coalesce(r.org_id, a.org_id) AS org_id,
       coalesce(r.opened, 0) AS opened, coalesce(r.open, 0) AS open, coalesce(r.compacted, 0) AS compacted,
       coalesce(r.rolled_back, 0) AS rolled_back, coalesce(r.below, 0) AS below, coalesce(r.refused, 0) AS refused,
       coalesce(a.compactions, 0) AS compactions, coalesce(a.by_worker, 0) AS by_worker,
       coalesce(a.original_tokens, 0) AS original_tokens, coalesce(a.compacted_tokens, 0) AS compacted_tokens,
       a.min_score, a.mean_score
FROM requests r FULL JOIN applied a ON a.org_id = r.org_id
ORDER BY 1
"""
