"""Merges concurrent embedding calls into shared model runs.

The API embeds one short query per Search or AssembleContext. Under load many arrive together,
so calls that arrive while a run is in flight wait for it and then go together as the next run:
one hand-off to the model's thread instead of eight, and with float32 products one batched model
run, far cheaper than eight runs of one (with int8 products each text is its own session run,
inference/int8_matmul.py). An idle service sees no difference: a lone call starts at once.
Vectors do not depend on how texts are batched (tests/unit/test_embedder.py), so merging
changes no result.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import numpy as np

from inference.embedder import Embedder


class CoalescingEmbedder:
    """An :class:`Embedder` that runs `inner` one call at a time, each run carrying every call
    waiting when it starts (up to `max_texts` texts; a larger call runs alone)."""

    def __init__(self, inner: Embedder, *, max_texts: int = 64) -> None:
        if max_texts < 1:
            raise ValueError("max_texts must be >= 1")
        self.inner = inner
        self.model_version = inner.model_version
        self.dimension = inner.dimension
        self.max_texts = max_texts
        self._waiting: deque[tuple[list[str], asyncio.Future[np.ndarray]]] = deque()
        self._runner: asyncio.Task[None] | None = None
        self.runs = 0  # model runs so far (calls merged = calls - runs)

    def __repr__(self) -> str:
        return f"CoalescingEmbedder({self.inner!r}, max_texts={self.max_texts})"

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return await self.inner.embed(texts)
        result: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._waiting.append((texts, result))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run_waiting())
        return await result

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_sync(texts)

    async def aclose(self) -> None:
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
        await self.inner.aclose()

    async def _run_waiting(self) -> None:
        while self._waiting:
            batch = self._next_batch()
            if not batch:
                continue
            try:
                vectors = await self.inner.embed([t for texts, _ in batch for t in texts])
            except Exception as exc:  # every caller in the run gets the run's error
                for _, result in batch:
                    if not result.done():
                        result.set_exception(exc)
                continue
            finally:
                self.runs += 1
            start = 0
            for texts, result in batch:
                if not result.done():  # a caller that gave up is skipped
                    result.set_result(vectors[start:start + len(texts)])
                start += len(texts)

    def _next_batch(self) -> list[tuple[list[str], asyncio.Future[np.ndarray]]]:
        batch: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []
        total = 0
        while self._waiting:
            texts, result = self._waiting[0]
            if result.done():  # cancelled while waiting: nothing to compute
                self._waiting.popleft()
                continue
            if batch and total + len(texts) > self.max_texts:
                break
            self._waiting.popleft()
            batch.append((texts, result))
            total += len(texts)
        return batch
