"""The query embedding of Search and AssembleContext, remembered per org.

An agent calls AssembleContext before every model call, often with the same task description,
and a search box sees the same questions again; the query's vector is the one MiniLM run on the
hot path (~6 ms of CPU, and under load the thing calls queue for). A vector depends only on the
text and the running model, so a remembered one is exactly what a new run would give.

Entries are per org, like the Embed RPC's cache: one shared across tenants would let a tenant
learn from a faster answer that another tenant had asked the same text. Least recently used
out first; `capacity` 0 remembers nothing. One process's memory only, never persisted. A text is
kept as its SHA-256, so a full memo stays ~1.7 KB an entry at 384-d whatever the queries' length
(they may be 16 KB each).
"""

from __future__ import annotations

import hashlib

import cachetools
import numpy as np

from context_engine.inference.embedder import Embedder
from context_engine.metrics import QUERY_VECTORS


class QueryVectors:
    def __init__(self, embedder: Embedder, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.embedder = embedder
        self.model_version = embedder.model_version
        self._remembered: cachetools.LRUCache[tuple[str, bytes], np.ndarray] | None = (
            cachetools.LRUCache(maxsize=capacity) if capacity else None)

    async def vector(self, org_id: str, text: str) -> np.ndarray:
        """The text's float32 vector (the pooled connections' pgvector codec takes float32)."""
        key = (org_id, hashlib.sha256(text.encode("utf-8")).digest())
        if self._remembered is not None and (found := self._remembered.get(key)) is not None:
            QUERY_VECTORS.labels("remembered").inc()
            return found
        # a copy: the row is a view of the whole model run's array, which would stay alive with it
        vector = np.array((await self.embedder.embed([text]))[0], dtype=np.float32)
        vector.setflags(write=False)  # shared by every later call with the same text
        if self._remembered is not None:
            self._remembered[key] = vector
        QUERY_VECTORS.labels("computed").inc()
        return vector
