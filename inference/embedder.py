"""What every text embedder promises (the configured one: inference/embedder_choice.py).

Every embedder returns float32 arrays of shape ``(n, dimension)``, rows L2-normalised and in
input order, and names the exact artifact that produced them in ``model_version`` (the cache
key and the value ``EmbedRequest.model_version`` is checked against). The backends: a local
MiniLM (inference/minilm_embedder.py, ONNX int8) and an OpenAI-compatible HTTP client
(inference/openai_embedder.py).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from context_engine.errors import DomainError, Unavailable

__all__ = [
    "Embedder",
    "EmbeddingError",
    "EmbeddingUnavailable",
    "check_texts",
    "l2_normalise",
]


@runtime_checkable
class Embedder(Protocol):
    """What the service needs from an embedding backend."""

    #: Identifies the artifact precisely; vectors with different versions are not comparable.
    model_version: str
    #: Length of every vector.
    dimension: int

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(len(texts), dimension)``, unit rows, input order. Never blocks the loop."""
        ...

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Same as :meth:`embed`, blocking; for scripts, benchmarks and worker threads."""
        ...

    async def aclose(self) -> None:
        """Release connections / sessions. Idempotent."""
        ...


class EmbeddingError(DomainError):
    """The embedding backend refused the request (not worth retrying)."""

    reason = "EMBEDDING_FAILED"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        meta = {"status": str(status)} if status is not None else None
        super().__init__(message, metadata=meta)
        self.status = status


class EmbeddingUnavailable(EmbeddingError, Unavailable):
    """The embedding backend stayed unreachable / overloaded through every retry."""

    reason = "EMBEDDING_UNAVAILABLE"


def check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    return out


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    # A zero vector stays zero rather than becoming NaN.
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors
