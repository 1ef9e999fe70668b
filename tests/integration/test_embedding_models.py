"""The embedder is configuration: an OpenAI-compatible endpoint (a local HTTP server the test
starts, speaking the /embeddings protocol) drives the whole engine at 1536 dimensions; a model
change is repaired by `context-engine reindex`."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading

import asyncpg
import numpy as np
import pytest

from inference.text_analysis import analyze
from tests.fixtures.calls import ingest, wait_embedded
from tests.fixtures.engine import running_engine, unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

DIMS = 1536
API_KEY = "sk-test-local"


def bag_of_words_vector(text: str) -> list[float]:
    """A deterministic stand-in model: hashed bag of words, so texts sharing words are close."""
    v = np.zeros(DIMS, dtype=np.float64)
    for term in analyze(text) or ["<empty>"]:
        v[int.from_bytes(hashlib.sha256(term.encode()).digest()[:4], "little") % DIMS] += 1.0
    return (v / np.linalg.norm(v)).tolist()


class EmbeddingsHandler(http.server.BaseHTTPRequestHandler):
    requests_seen: list[dict] = []
    rejecting = False  # answer 400: the embedder fails without retrying

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/embeddings" or self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self.send_error(401 if self.path == "/v1/embeddings" else 404)
            return
        type(self).requests_seen.append(body)
        if type(self).rejecting:
            self.send_error(400, "model overloaded for this test")
            return
        data = [{"object": "embedding", "index": i, "embedding": bag_of_words_vector(t)}
                for i, t in enumerate(body["input"])]
        payload = json.dumps({"object": "list", "model": body["model"], "data": data,
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def embeddings_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EmbeddingsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def test_an_openai_compatible_embedder_drives_embed_and_search(
        postgres_url, kafka_bootstrap, tmp_path, embeddings_server):
    env = {"CONTEXT_ENGINE_EMBEDDER": "openai", "CONTEXT_ENGINE_EMBEDDER_URL": embeddings_server,
           "CONTEXT_ENGINE_EMBEDDER_API_KEY": API_KEY}
    async with running_engine(postgres_url, kafka_bootstrap, tmp_path, extra_env=env) as engine:
        org = unique("org")
        caller = engine.caller(org, clearance=1)
        reply = await caller("Embed", pb.EmbedRequest(texts=["hello there"]))
        assert reply.model_version == "text-embedding-3-small"
        assert len(reply.embeddings[0].values) == DIMS
        assert np.allclose(reply.embeddings[0].values, bag_of_words_vector("hello there"), atol=1e-6)

        await ingest(caller, "s", ["The orchard harvest festival is in October.",
                                   "Quarterly tax filings are due in April."])
        await wait_embedded(engine, org)
        conn = await asyncpg.connect(engine.settings.database_url)
        try:
            assert {tuple(r) for r in await conn.fetch(
                "SELECT DISTINCT embedding_dims, embedding_model FROM chunks WHERE org_id = $1", org)} \
                == {(DIMS, "text-embedding-3-small")}
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_indexes WHERE indexname = 'chunks_embedding_1536'") == 1
        finally:
            await conn.close()
        found = await caller("Search", pb.SearchRequest(query="orchard festival", min_score=1e-6))
        assert "orchard" in found.results[0].content
        assert float(dict(found.results[0].metadata)["engine.score.vector"]) > 0.3

        # The query embedder failing: AssembleContext degrades to recency and says so. (A text
        # asked before, like the Search's above, would not need the embedder: its vector is remembered.)
        EmbeddingsHandler.rejecting = True
        try:
            reply = await caller("AssembleContext", pb.AssembleContextRequest(
                session_id="s", task_description="when is the orchard festival", token_budget=1000,
                model_id="gpt-4"))
        finally:
            EmbeddingsHandler.rejecting = False
        q = reply.quality
        assert q.fallback_used and q.fallback_reason.startswith("retrieval failed")
        assert q.retrieval_outcome == pb.RETRIEVAL_OUTCOME_UNSPECIFIED and q.effective_min_score > 0
        assert "orchard harvest" in reply.assembled_prompt.split("## Recent conversation")[1]


async def test_reindex_re_embeds_a_scope_whose_vectors_came_from_another_model(engine):
    org = unique("org")
    team = engine.caller(org, "p", "t", clearance=1)
    other_team = engine.caller(org, "p", "u", clearance=1)
    await ingest(team, "s", ["Alpha turn one.", "Alpha turn two."])
    await ingest(other_team, "s2", ["Beta turn."])
    await wait_embedded(engine, org)
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        running = await conn.fetchval("SELECT DISTINCT embedding_model FROM chunks WHERE org_id = $1", org)
        # As if these vectors had been computed by an earlier model.
        await conn.execute("UPDATE chunks SET embedding_model = 'old-model' WHERE org_id = $1", org)
        code, out = await engine.cli("reindex", org, "--pillar", "p", "--team", "t", "--timeout", "60s")
        assert code == 0, out
        assert "2 of 2 chunks need a vector (previous model: old-model)" in out
        models = {(r["scope_path"], r["embedding_model"]) for r in await conn.fetch(
            "SELECT scope_path, embedding_model FROM chunks WHERE org_id = $1", org)}
        assert models == {(f"{org}/p/t", running), (f"{org}/p/u", "old-model")}  # only the scope asked for
    finally:
        await conn.close()
