"""The query embedding of Search and AssembleContext, remembered per org.

An agent calls AssembleContext before every model call, often with the same task description,
and a search box sees the same questions again; the query's vector is the one MiniLM run on the
hot path (~6 ms of CPU, and under load the thing calls queue for). A vector depends only on the
text and the running model, so a remembered one is exactly what a new run would give.

Entries are per org, like the Embed RPC's cache: one shared across tenants would let a tenant
learn from a faster answer that another tenant had asked the same text (within an org, teams
and agents share them, as they share the Embed cache). Least recently used out first;
`capacity` 0 remembers nothing. One process's memory only, never persisted. A text is kept as
its SHA-256, so an entry is ~2 KB at 384-d (measured) whatever the query's length (up to 16 KB).
Calls asking for a text that is being computed wait for that run instead of starting another.
"""

from __future__ import annotations

import asyncio
import hashlib

import cachetools
import numpy as np

from context_engine.metrics import QUERY_VECTORS
from inference.embedder import Embedder

Key = tuple[str, bytes]


class QueryVectors:
    def __init__(self, embedder: Embedder, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.embedder = embedder
        self.model_version = embedder.model_version
        self._remembered: cachetools.LRUCache[Key, np.ndarray] | None = (
            cachetools.LRUCache(maxsize=capacity) if capacity else None)
        self._running: dict[Key, asyncio.Future[np.ndarray]] = {}

    async def vector(self, org_id: str, text: str) -> np.ndarray:
        """The text's float32 vector (the pooled connections' pgvector codec takes float32)."""
        key = (org_id, hashlib.sha256(text.encode("utf-8")).digest())
        if self._remembered is not None and (found := self._remembered.get(key)) is not None:
            QUERY_VECTORS.labels("remembered").inc()
            return found
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = asyncio.ensure_future(self._compute(text))
            running.add_done_callback(lambda done: self._finished(key, done))
            QUERY_VECTORS.labels("computed").inc()
        else:
            QUERY_VECTORS.labels("shared").inc()
        # shielded: a caller that gives up does not cancel the run the others wait for
        return await asyncio.shield(running)

    async def _compute(self, text: str) -> np.ndarray:
        # a copy: the row is a view of the whole model run's array, which would stay alive with it
        vector = np.array((await self.embedder.embed([text]))[0], dtype=np.float32)
        vector.setflags(write=False)  # shared by every later call with the same text
        return vector

    def _finished(self, key: Key, done: asyncio.Future[np.ndarray]) -> None:
        del self._running[key]
        if not done.cancelled() and done.exception() is None and self._remembered is not None:
            self._remembered[key] = done.result()
