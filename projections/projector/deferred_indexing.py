"""Indexing a long content after the projector's commit.

A content longer than `INLINE_INDEX_BYTES` (8 KiB) costs the projector ~0.8-1 s a megabyte to cut
into chunks and write with their postings; done in the projector's transaction, that held up the
acknowledgement of every event batched with it or behind it, whoever wrote them. So the projector
writes the source (session_events / memory_versions) and an `indexing_requests` row, and asks for
an indexing job; the worker's chunk indexer then, per source:

1. reads the content and cuts its chunks, without holding any lock;
2. builds every row, with the source's state as read;
3. in one transaction: takes the source row (FOR SHARE, so a rollback or a new PII scan of that
   source waits for this commit, or has committed before and is seen) and then the request row
   (FOR UPDATE), checks that neither changed since step 1 (else builds again), writes the chunks
   256 to a statement and the statistics deltas last (their row locks are held for the commit
   only), and deletes the request;
4. after the commit, asks for the embeddings of the new chunks.

The worker runs steps 1-3 in a background process below the projector's priority, on its own
connection (projections/projector/indexer_process.py): in the worker, cutting a megabyte's
chunks would hold the GIL, which the projector's event loop needs, for most of a second.

A try that fails is counted on the request (`attempts`, `last_error`); after 5 the request stays,
tried no more, and the content is not retrievable (a deadlock with the projector, which
PostgreSQL breaks, is retried at once and not counted).

The chunks are those `ChunkProjection.add` writes in place (ids, contents, postings, statistics),
and a bulk replay indexes every content in place, so replay reproduces them. Until step 2 commits,
Search and AssembleContext do not see the content's chunks (docs/retrieval.md). A request whose
job was lost (a crash) is found by the worker's sweep (`backlog`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import asyncpg
import orjson

from projections.projector.chunks import ChunkProjection, ChunkRows, PendingChunks, analysed_chunks

# Per source kind: its table, key, creation time and PII state.
_SOURCES = {  # table, key, created_at, pii_status, the chunks' seq (a turn's position; none for a memory)
    "event": ("session_events", "event_id", "e.occurred_at", "'clear'", "e.seq"),
    "memory": ("memory_versions", "event_id", "e.created_at", "e.pii_status", "NULL::bigint"),
}


def _read(kind: str, lock: bool) -> str:
    table, key, created, pii, seq = _SOURCES[kind]
    return (f"SELECT r.source_event_id, r.added_by, e.scope_path, e.session_id, e.metadata::text AS metadata, "
            f"{created} AS created_at, e.active, {pii} AS pii_status, {seq} AS seq"
            + ("" if lock else ", e.content")
            + f" FROM indexing_requests r JOIN {table} e ON e.org_id = r.org_id AND e.{key} = r.source_event_id "
              "WHERE r.org_id = $1 AND r.source_event_id = $2 AND r.source_kind = $3"
            + (" FOR UPDATE OF r" if lock else ""))


def _lock_source(kind: str) -> str:
    """The source row first, then (in `_read`) the request: the order of the projector's
    rollbacks (session_events) and rescans (memory_versions, then the request)."""
    table, key, _created, _pii, _seq = _SOURCES[kind]
    return f"SELECT 1 FROM {table} WHERE org_id = $1 AND {key} = $2 FOR SHARE"


async def _set_org(conn: asyncpg.Connection, org_id: str) -> None:
    await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)


# Chunks written per statement: a megabyte is ~3,000 chunks and ~20,000 postings; one statement
# of them all took ~0.2 s to encode, holding its event loop.
SLICE_CHUNKS = 256
MAX_ATTEMPTS = 5


class StaleRequest(Exception):
    """The source changed between reading it and locking it: build its rows again."""


async def index_requested(conn: asyncpg.Connection, org_id: str, source_event_id: str, *,
                          builder: Executor | None = None) -> dict[str, list[str]]:
    """Index one requested source of `org_id` if it is still requested. Returns the chunks still
    without a vector, by the event that asked (for EmbeddingJobs); {} when there was nothing to do.

    Every row is built (on `builder`, else the loop's default executor) before the writing
    transaction begins, with the source's state as read then; the transaction locks the source,
    then the request (the order in which the projector's rollbacks and rescans take them), checks
    that nothing changed, and sends the slices and, last, the statistics (their row locks, which
    the projector takes too, are held for the commit only)."""
    source = uuid.UUID(source_event_id)
    for _ in range(3):  # the source changed under us: build again from what it is now
        async with conn.transaction():
            await _set_org(conn, org_id)
            kind = await conn.fetchval(
                "SELECT source_kind FROM indexing_requests WHERE org_id = $1 AND source_event_id = $2 "
                "AND attempts < $3", org_id, source, MAX_ATTEMPTS)
            read = await conn.fetchrow(_read(kind, lock=False), org_id, source, kind) if kind else None
        if read is None:
            return {}
        chunks = ChunkProjection(conn, org_id, defer_long=False)
        slices, statistics, chunks.added_by = await asyncio.get_running_loop().run_in_executor(
            builder, build_rows, org_id, dict(read), kind)
        try:
            async with conn.transaction():
                await _set_org(conn, org_id)
                await conn.execute(_lock_source(kind), org_id, source)
                now = await conn.fetchrow(_read(kind, lock=True), org_id, source, kind)
                if now is None:
                    return {}  # done meanwhile
                if (now["added_by"], now["active"], now["pii_status"]) != \
                        (read["added_by"], read["active"], read["pii_status"]):
                    raise StaleRequest
                for part in (*slices, statistics):
                    chunks.pending = part
                    await chunks.flush()
                await conn.execute("DELETE FROM indexing_requests WHERE org_id = $1 AND source_event_id = $2",
                                   org_id, source)
                return chunks.unembedded()
        except StaleRequest:
            continue
    return {}


Rows = tuple[list[PendingChunks], PendingChunks, dict[str, str]]


def build_rows(org_id: str, read: dict[str, Any], kind: str) -> Rows:
    """Cut, analyse and build the source's rows: the slices, the statistics and, per chunk, the
    event that added it."""
    source = str(read["source_event_id"])
    metadata = orjson.loads(read["metadata"])
    chunks = ChunkRows(org_id)
    chunks.add_analysed(analysed_chunks(source, bytes(read["content"]), metadata),
                        event_id=source,
                        source_kind=kind, session_id=read["session_id"], scope_path=read["scope_path"],
                        metadata=metadata, created_at=read["created_at"], pii_status=read["pii_status"],
                        active=read["active"], added_by=str(read["added_by"]), seq=read["seq"])
    return (*chunks.take_slices(SLICE_CHUNKS), chunks.added_by)


async def record_failure(conn: asyncpg.Connection, org_id: str, source_event_id: str, error: str) -> int:
    """Count a failed try of a request (`error` describes it, and is kept); returns the tries so
    far. At MAX_ATTEMPTS the request stays, with its last error, and is tried no more."""
    async with conn.transaction():
        await _set_org(conn, org_id)
        return await conn.fetchval(
            "UPDATE indexing_requests SET attempts = attempts + 1, last_error = left($3, 500) "
            "WHERE org_id = $1 AND source_event_id = $2 RETURNING attempts",
            org_id, uuid.UUID(source_event_id), error.replace("\x00", "\\0")) or 0


async def requested_sources(conn: asyncpg.Connection) -> set[str]:
    """The sources whose indexing is still asked for (not given up), of every org: read on an admin
    connection (verify's)."""
    return {str(r["source_event_id"]) for r in await conn.fetch(
        "SELECT source_event_id FROM indexing_requests WHERE attempts < $1", MAX_ATTEMPTS)}


async def backlog(conn: asyncpg.Connection, *, older_than: dt.timedelta) -> dict[str, list[str]]:
    """Requests of every org asked for at least `older_than` ago, by org (read under '_system')."""
    async with conn.transaction():
        await _set_org(conn, "_system")
        rows = await conn.fetch(
            "SELECT org_id, source_event_id FROM indexing_requests WHERE requested_at <= now() - $1::interval "
            "AND attempts < $2 ORDER BY requested_at", older_than, MAX_ATTEMPTS)
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
