"""The embedding pipeline: EmbeddingJob / ReindexJob in, `embedding.recorded` events out.

The worker's agents call this. For a set of chunks it:
1. reads the chunks still without a vector from the running model (a job delivered twice, or
   for chunks a newer job already covered, embeds nothing: idempotent);
2. takes vectors already recorded for the same content (content-hash dedup, `content_vectors`)
   and embeds only the content never seen, in batches;
3. appends one `embedding.recorded` event per batch to the domain log. The projector records it
   (`chunk_projection.record_vectors`) and the worker's VectorAssigner gives the vectors to the
   chunks after the commit, so vectors are facts in the log: replay restores them without
   recomputing, and only a reindex recomputes.

A job lost between the projector's commit and its publication costs nothing: `backlog()` finds
chunks without a vector (the worker sweeps at start and periodically) — the job stream is
derivable from the read models (ARCHITECTURE.md section 5).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import numpy as np
import structlog

from context_engine.events import EmbeddingRecorded, Event, embedding_aggregate
from context_engine.metrics import EMBEDDED_TEXTS, EMBEDDING_BATCH_SECONDS
from context_engine.scope import Scope
from inference.embedder import Embedder
from projections.projector.chunks import vector_to_b64
from projections.reads import embedding_backlog
from projections.store.pool import SYSTEM_ORG, org_transaction

log = structlog.get_logger("context_engine.embedding")

ACTOR = "embedding-pipeline"

SendEvent = Callable[[Event], Awaitable[None]]


class EmbeddingPipeline:
    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, send: SendEvent, *, batch_size: int = 64) -> None:
        self.pool = pool
        self.embedder = embedder
        self.send = send
        self.batch_size = batch_size

    @property
    def model_version(self) -> str:
        return self.embedder.model_version

    async def embed_chunks(self, org_id: str, chunk_ids: Sequence[str]) -> int:
        """Record vectors for these chunks' content; returns how many contents were embedded now."""
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            texts = await embedding_backlog.contents_of_chunks_without_model_vector(
                conn, org_id, chunk_ids, self.model_version)
        return await self._record(org_id, texts)

    async def reindex(self, scope: Scope, *, page: int = 512,
                      progress: Callable[[int], None] | None = None) -> int:
        """Re-embed every chunk owned at `scope` or below whose vector is not from the running
        model. Returns the number of contents embedded."""
        done = 0
        while True:
            async with org_transaction(self.pool, scope.org_id, readonly=True) as conn:
                texts = await embedding_backlog.contents_in_scope_without_model_vector(
                    conn, scope, self.model_version, page)
            if not texts:
                return done
            n = await self._record(scope.org_id, texts, reuse_recorded=False)
            done += n
            if progress:
                progress(n)
            await self._await_applied(scope.org_id, list(texts))

    async def backlog(self, *, older_than: dt.timedelta, limit: int = 512,
                      after: tuple[dt.datetime, str] | None = None) -> tuple[dict[str, list[str]], tuple | None]:
        """One page of the chunks without a vector from the running model, older than
        `older_than`, by org, in (created_at, chunk_id) order after `after`; and the key to pass
        as `after` for the next page (None when this page was the last). Pages go by key, not by
        "still without a vector": vectors are recorded through the log, so a chunk just embedded
        may still look unembedded when the next page is read."""
        async with org_transaction(self.pool, SYSTEM_ORG, readonly=True) as conn:
            rows = await embedding_backlog.chunks_without_vector(conn, older_than=older_than, limit=limit,
                                                                 after=after)
        out: dict[str, list[str]] = {}
        for org_id, chunk_id, _created_at in rows:
            out.setdefault(org_id, []).append(chunk_id)
        last = (rows[-1][2], rows[-1][1]) if len(rows) == limit else None
        return out, last

    async def _record(self, org_id: str, texts: dict[str, str], *, reuse_recorded: bool = True) -> int:
        if not texts:
            return 0
        known: dict[str, np.ndarray] = {}
        if reuse_recorded:
            async with org_transaction(self.pool, org_id, readonly=True) as conn:
                known = await embedding_backlog.recorded_vectors(conn, org_id, self.model_version, list(texts))
        todo = [h for h in texts if h not in known]
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start:start + self.batch_size]
            with EMBEDDING_BATCH_SECONDS.time():
                vectors = await self.embedder.embed([texts[h] for h in batch])
            EMBEDDED_TEXTS.inc(len(batch))
            known.update(zip(batch, vectors))
        hashes = list(texts)
        for start in range(0, len(hashes), self.batch_size):
            part = hashes[start:start + self.batch_size]
            await self.send(recorded_event(org_id, self.model_version,
                                           [(h, known[h]) for h in part]))
        return len(todo)

    async def _await_applied(self, org_id: str, hashes: list[str], timeout: float = 30.0) -> None:
        """Reindex pages by what is still to do, so wait until the projector applied this page."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            async with org_transaction(self.pool, org_id, readonly=True) as conn:
                left = await embedding_backlog.count_chunks_without_model_vector(
                    conn, org_id, hashes, self.model_version)
            if not left:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{left} chunks of org {org_id!r} not updated within {timeout}s")
            await asyncio.sleep(0.05)


def recorded_event(org_id: str, model_version: str, vectors: list[tuple[str, Any]]) -> Event:
    body = EmbeddingRecorded(model_version, [{"content_hash": h, "vector": vector_to_b64(v)} for h, v in vectors])
    return Event.of(body, scope=Scope(org_id), aggregate=embedding_aggregate(org_id), actor=ACTOR)
