"""An embedder over any OpenAI-compatible ``/embeddings`` API, with retries and backoff."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Sequence

import numpy as np

from inference.embedder import (
    EmbeddingError,
    EmbeddingUnavailable,
    check_texts,
    l2_normalise,
)
from inference.openai_http import Retryable, RetryPolicy, json_session, post_json

__all__ = ["OpenAIEmbedder"]

log = logging.getLogger(__name__)


_NATIVE_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` with ``{"model", "input": [...]}`` and a bearer key.

    Retries 429, 5xx, connection errors and timeouts up to ``max_attempts`` times in all, with
    jittered exponential backoff (a numeric ``Retry-After`` is honoured, capped at
    ``backoff_max_s``); then raises :class:`EmbeddingUnavailable`. Any other non-200 status
    raises :class:`EmbeddingError` at once. Responses are put back in input order by ``index``
    and L2-normalised (OpenAI's already are; other compatible servers may not be).

    ``model_version`` is the model name the server reports (the configured name until the first
    response); with ``dimensions=`` (shortened text-embedding-3 vectors) it gains ``@<n>d``.
    Empty strings are sent as a single space, since the API rejects empty input.
    """

    def __init__(
        self,
        *,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        dimension: int | None = None,
        timeout_s: float = 30.0,
        max_attempts: int = 4,
        max_batch_size: int = 128,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        self.retry = RetryPolicy(max_attempts, backoff_initial_s, backoff_max_s)
        if not 1 <= max_batch_size <= 2048:
            raise ValueError("max_batch_size must be in [1, 2048] (the API's input limit)")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL")
                         or "https://api.openai.com/v1").rstrip("/")
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.dimensions = dimensions
        # 0 = unknown until the first response (an unlisted model without dimension=).
        self.dimension: int = int(dimensions or dimension or _NATIVE_DIMENSIONS.get(model, 0))
        self._suffix = f"@{dimensions}d" if dimensions else ""
        self.model_version: str = model + self._suffix
        self._reported_model: str | None = None
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.max_batch_size = max_batch_size
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._session: Any = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return (f"OpenAIEmbedder(model_version={self.model_version!r}, "
                f"base_url={self.base_url!r}, dimension={self.dimension})")

    # -- public --------------------------------------------------------------------------

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await self._embed(self._loop_session(), texts)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        texts = check_texts(texts)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("embed_sync() called inside a running event loop; await embed()")
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return asyncio.run(self._embed_with_own_session(texts))

    async def aclose(self) -> None:
        session, self._session, self._session_loop = self._session, None, None
        if session is not None and not session.closed:
            await session.close()

    # -- internals -----------------------------------------------------------------------

    def _new_session(self) -> Any:
        return json_session(self._api_key, self.timeout_s)

    def _loop_session(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = self._new_session()
            self._session_loop = loop
        return self._session

    async def _embed_with_own_session(self, texts: list[str]) -> np.ndarray:
        async with self._new_session() as session:
            return await self._embed(session, texts)

    async def _embed(self, session: Any, texts: list[str]) -> np.ndarray:
        parts = [
            await self._embed_batch(session, texts[i : i + self.max_batch_size])
            for i in range(0, len(texts), self.max_batch_size)
        ]
        return l2_normalise(np.concatenate(parts, axis=0))

    async def _embed_batch(self, session: Any, batch: list[str]) -> np.ndarray:
        payload: dict[str, Any] = {
            "model": self.model,
            "input": [t if t else " " for t in batch],
            "encoding_format": "float",
        }
        if self.dimensions:
            payload["dimensions"] = self.dimensions
        url = f"{self.base_url}/embeddings"

        def exhausted(exc: Retryable) -> Exception:
            return EmbeddingUnavailable(f"embedding service {self.base_url} still failing after "
                                        f"{self.max_attempts} attempts: {exc}", status=exc.status)

        def rejected(status: int, detail: str) -> Exception:
            return EmbeddingError(f"embedding request rejected by {url} (model {self.model!r}): "
                                  f"HTTP {status}: {detail}", status=status)

        body = await post_json(session, url, payload, self.retry, exhausted=exhausted, rejected=rejected)
        return self._parse(body, len(batch))

    def _parse(self, body: bytes, n: int) -> np.ndarray:
        import orjson

        try:
            doc = orjson.loads(body)
            items = sorted(doc["data"], key=lambda item: int(item["index"]))
            indices = [int(item["index"]) for item in items]
            vectors = np.asarray([item["embedding"] for item in items], dtype=np.float32)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(f"malformed embeddings response: {exc}") from exc
        if indices != list(range(n)):
            raise EmbeddingError(f"embeddings response covers indices {indices[:8]}..., "
                                 f"expected 0..{n - 1}")
        if vectors.ndim != 2:
            raise EmbeddingError("embeddings response has vectors of differing lengths")
        dim = int(vectors.shape[1])
        if self.dimension == 0:
            self.dimension = dim
        elif dim != self.dimension:
            raise EmbeddingError(
                f"embedding service returned {dim}-d vectors, expected {self.dimension}"
            )
        reported = doc.get("model") if isinstance(doc, dict) else None
        if isinstance(reported, str) and reported:
            if self._reported_model is None:
                self._reported_model = reported
                self.model_version = reported + self._suffix
            elif reported != self._reported_model:
                log.warning("embedding service now reports model %r (was %r); "
                            "keeping model_version %r", reported, self._reported_model,
                            self.model_version)
        return vectors
