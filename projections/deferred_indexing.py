"""Indexing a long content after the projector's commit.

A content longer than `INLINE_INDEX_BYTES` (64 KiB) costs the projector ~0.8-1 s a megabyte to cut
into chunks and write with their postings; done in the projector's transaction, that held up the
acknowledgement of every event batched with it or behind it, whoever wrote them. So the projector
writes the source (session_events / memory_versions) and an `indexing_requests` row, and asks for
an indexing job; the worker's chunk indexer then, per source:

1. reads the content and cuts its chunks, on a background thread below the projector's
   priority, without holding any lock;
2. in one transaction: takes the request row (FOR UPDATE) and the source row (FOR SHARE, so a
   rollback or a new PII scan of that source waits for this commit, or has committed before and
   is seen), checks that the request is still the one it read (a rescan replaces a memory's
   request), writes the chunks with the source's current `active` flag and PII status, 256 to
   a statement (so that the event loop the projector shares is never held long), and deletes
   the request;
3. after the commit, asks for the embeddings of the new chunks.

The chunks are those `ChunkProjection.add` writes in place (ids, contents, postings, statistics),
and a bulk replay indexes every content in place, so replay reproduces them. Until step 2 commits,
Search and AssembleContext do not see the content's chunks (docs/retrieval.md). A request whose
job was lost (a crash) is found by the worker's sweep (`backlog`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor

import asyncpg
import orjson

from context_engine.projections.chunk_projection import ChunkProjection, analysed_chunks

_SOURCES = {
    "event": ("session_events", "event_id", "e.occurred_at", "'clear'"),
    "memory": ("memory_versions", "event_id", "e.created_at", "e.pii_status"),
}


def _read(kind: str, lock: bool) -> str:
    table, key, created, pii = _SOURCES[kind]
    return (f"SELECT r.source_event_id, r.added_by, e.scope_path, e.session_id, e.metadata::text AS metadata, "
            f"{created} AS created_at, e.active, {pii} AS pii_status"
            + ("" if lock else ", e.content")
            + f" FROM indexing_requests r JOIN {table} e ON e.org_id = r.org_id AND e.{key} = r.source_event_id "
              "WHERE r.org_id = $1 AND r.source_event_id = $2 AND r.source_kind = $3"
            + (" FOR UPDATE OF r FOR SHARE OF e" if lock else ""))


async def _set_org(conn: asyncpg.Connection, org_id: str) -> None:
    await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)


# Chunks written per statement: a megabyte is ~3,000 chunks and ~20,000 postings, and encoding
# them all at once held the worker's event loop (which the projector shares) for ~0.2 s.
SLICE_CHUNKS = 256


async def index_requested(conn: asyncpg.Connection, org_id: str, source_event_id: str, *,
                          executor: Executor | None = None) -> dict[str, list[str]]:
    """Index one requested source of `org_id` if it is still requested. Returns the chunks still
    without a vector, by the event that asked (for EmbeddingJobs); {} when there was nothing to do.
    The Python work (cutting, analysing, building the rows) runs on `executor`, a background
    thread below the projector's priority; the event loop only sends the slices' statements."""
    source, loop = uuid.UUID(source_event_id), asyncio.get_running_loop()
    async with conn.transaction():
        await _set_org(conn, org_id)
        kind = await conn.fetchval("SELECT source_kind FROM indexing_requests WHERE org_id = $1 AND source_event_id = $2",
                                   org_id, source)
        read = await conn.fetchrow(_read(kind, lock=False), org_id, source, kind) if kind else None
    if read is None:
        return {}
    metadata = orjson.loads(read["metadata"])
    analysed = await loop.run_in_executor(executor, analysed_chunks, str(source), bytes(read["content"]), metadata)
    async with conn.transaction():
        await _set_org(conn, org_id)
        now = await conn.fetchrow(_read(kind, lock=True), org_id, source, kind)
        if now is None or now["added_by"] != read["added_by"]:
            return {}  # done meanwhile, or replaced by a newer request (its own job follows)
        chunks = ChunkProjection(conn, org_id, defer_long=False)
        for start in range(0, len(analysed), SLICE_CHUNKS):
            await loop.run_in_executor(executor, functools.partial(
                chunks.add_analysed, analysed[start:start + SLICE_CHUNKS], event_id=str(source), source_kind=kind,
                session_id=now["session_id"], scope_path=now["scope_path"], metadata=metadata,
                created_at=now["created_at"], pii_status=now["pii_status"], active=now["active"],
                added_by=str(now["added_by"])))
            await chunks.flush()
        await conn.execute("DELETE FROM indexing_requests WHERE org_id = $1 AND source_event_id = $2", org_id, source)
        return chunks.unembedded()


async def backlog(conn: asyncpg.Connection, *, older_than: dt.timedelta) -> dict[str, list[str]]:
    """Requests of every org asked for at least `older_than` ago, by org (read under '_system')."""
    async with conn.transaction():
        await _set_org(conn, "_system")
        rows = await conn.fetch(
            "SELECT org_id, source_event_id FROM indexing_requests WHERE requested_at <= now() - $1::interval "
            "ORDER BY requested_at", older_than)
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["org_id"], []).append(str(r["source_event_id"]))
    return out


async def pending_count(conn: asyncpg.Connection, org_ids: Sequence[str] | None = None) -> int:
    """Requests not yet done (of these orgs), for tests and operators."""
    async with conn.transaction():
        await _set_org(conn, "_system")
        if org_ids is None:
            return await conn.fetchval("SELECT count(*) FROM indexing_requests")
        return await conn.fetchval("SELECT count(*) FROM indexing_requests WHERE org_id = ANY($1::text[])",
                                   list(org_ids))
