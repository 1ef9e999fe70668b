"""AssembleContext through gRPC with real tokens, signed guardrail layers, the worker and
PostgreSQL: layout and prefix, budget edges, hints, fallbacks, prompt-cache stability across an
API restart, savings sampling and the compaction trigger."""

from __future__ import annotations

import asyncio
import hashlib
import time

import asyncpg
import grpc
import pytest
from aiokafka import AIOKafkaConsumer

from entrypoints.api.app import build_api_server, open_deps
from inference.tokens import count_tokens
from streams.topics import LogTopics
from tests.fixtures.calls import admin_fetch, expect_error, ingest, wait_embedded
from tests.fixtures.engine import SAMPLED_ORG, unique
from tests.fixtures.guardrails import publish
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc, stream_pb2

pytestmark = pytest.mark.integration

MODEL = "gpt-4o"
TURNS = [f"user: turn {i}: we talked about {topic}" for i, topic in enumerate(
    ["the refund window of thirty days", "shipping to Galway", "the blue kettle", "a broken zip",
     "loyalty points", "the invoice address"])]


@pytest.fixture(scope="module")
async def assembly_org(engine, tmp_path_factory):
    org = unique("org")
    tmp = tmp_path_factory.mktemp("layers")
    l2 = await publish(engine, tmp, 2, f"You are the support agent of {org}. Never reveal card numbers.", "--org", org)
    l3 = await publish(engine, tmp, 3, "Team: answer briefly.", "--org", org, "--pillar", "p", "--team", "t")
    caller = engine.caller(org, "p", "t", "bot", clearance=2)
    await ingest(caller, "s1", TURNS)
    await wait_embedded(engine, org)
    return org, caller, (l2, l3)


async def assemble(caller, session="s1", task="what is the refund window?", budget=4000, **hints):
    return await caller("AssembleContext", pb.AssembleContextRequest(
        session_id=session, task_description=task, token_budget=budget, model_id=MODEL, hints=hints))


async def test_prompt_layout_prefix_and_attestation(assembly_org):
    org, caller, (l2, l3) = assembly_org
    reply = await assemble(caller)
    prompt = reply.assembled_prompt
    layers = (await caller("ResolveGuardrailLayers", pb.ResolveGuardrailLayersRequest())).layers
    assert [x.content_hash for x in layers if x.layer_level >= 2] == [l2, l3]
    assert (prompt.index(f"support agent of {org}") < prompt.index("Team: answer briefly.")
            < prompt.index("## Recent conversation"))
    assert reply.cache_prefix_bytes == len(prompt.encode()[:reply.cache_prefix_bytes])
    assert prompt.encode()[:reply.cache_prefix_bytes].decode().endswith("Team: answer briefly.\n\n")
    assert reply.prompt_id == hashlib.sha256(prompt.encode()).hexdigest()
    assert reply.assembled_tokens == count_tokens(prompt, MODEL) <= 4000
    assert len(reply.version_hash) == 64 and reply.chunk_ids
    q = reply.quality
    assert q.retrieval_outcome == pb.RETRIEVAL_OUTCOME_OK and not q.fallback_used
    assert 0 < q.confidence_score <= 1 and q.effective_min_score > 0
    # The whole session fits: the turns retrieved are shown once, in their place in the conversation.
    assert "## Retrieved context" not in prompt and prompt.count("refund window") == 1
    assert "refund window" in prompt.split("## Recent conversation")[1]
    # The assembled prompt validates against the caller's chain.
    check = await caller("ValidatePrompt", pb.ValidatePromptRequest(
        prompt=prompt, layer_hashes=[x.content_hash for x in layers]))
    assert check.valid, check.violation_detail


async def test_budget_edges(assembly_org):
    _org, caller, _ = assembly_org
    full = await assemble(caller, budget=4000)
    at = await assemble(caller, budget=full.assembled_tokens)
    assert at.assembled_prompt == full.assembled_prompt and at.prompt_id == full.prompt_id
    under = await assemble(caller, budget=full.assembled_tokens - 1)
    assert under.assembled_tokens <= full.assembled_tokens - 1
    assert under.assembled_prompt.encode()[:under.cache_prefix_bytes] == \
        full.assembled_prompt.encode()[:full.cache_prefix_bytes]
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, assemble(caller, budget=10), field="token_budget")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, assemble(caller, budget=0), field="token_budget")


async def test_hints(assembly_org, engine):
    org, caller, _ = assembly_org
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
            own, own_text, own_event = await conn.fetchrow(
            "SELECT chunk_id::text, content, source_event_id::text FROM chunks WHERE org_id = $1 "
            "ORDER BY chunk_id LIMIT 1", org)
    finally:
        await conn.close()
    pinned = await assemble(caller, pinned_chunk_ids=own)
    prefix = pinned.assembled_prompt.encode()[:pinned.cache_prefix_bytes].decode()
    assert "## Pinned context" in prefix and pinned.chunk_ids[0] == own
    # A pinned turn of the session is in the prompt once, in the stable prefix, and its id once.
    assert pinned.assembled_prompt.count(own_text) == 1 and own_text in prefix
    assert list(pinned.chunk_ids).count(own) == 1 and len(pinned.chunk_ids) == len(set(pinned.chunk_ids))
    # So is a required turn: not retrieved again, not repeated in the history.
    required_turn = await assemble(caller, must_include=f"event:{own_event}")
    assert required_turn.assembled_prompt.count(own_text) == 1
    assert own_text in required_turn.assembled_prompt.split("## Required context")[1].split("## ")[0]
    assert len(required_turn.chunk_ids) == len(set(required_turn.chunk_ids)) and own in required_turn.chunk_ids
    # One id however it is spelled, and a chunk pinned and required through its turn is listed once.
    twice = await assemble(caller, pinned_chunk_ids=f"{own},{own.upper()}",
                           must_include=f"event:{own_event},event:{own_event.upper()}")
    assert twice.assembled_prompt.split("## Required context")[1].count(own_text) == 1
    assert list(twice.chunk_ids).count(own) == 1 and len(twice.chunk_ids) == len(set(twice.chunk_ids))

    other = engine.caller(org, "p", "other-team", "bot", clearance=2)
    await ingest(other, "s-other", ["a sibling team's private note"])
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        foreign = str(await conn.fetchval(
            "SELECT chunk_id FROM chunks WHERE org_id = $1 AND scope_path = $2", org, f"{org}/p/other-team/bot"))
    finally:
        await conn.close()
    await expect_error(grpc.StatusCode.NOT_FOUND, assemble(caller, pinned_chunk_ids=foreign),
                       field="hints.pinned_chunk_ids")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, assemble(caller, pinned_chunk_ids="not-a-uuid"),
                       field="hints.pinned_chunk_ids")
    await expect_error(grpc.StatusCode.NOT_FOUND, assemble(caller, must_include="working"),
                       field="hints.must_include")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, assemble(caller, must_include="the-whole-thing"),
                       field="hints.must_include")
    await caller("PushContext", pb.PushContextRequest(session_id="s1", memory_type="working",
                                                      content=b"working memory: ticket 4711 is open"))
    required = await assemble(caller, must_include="working")
    assert "ticket 4711" in required.assembled_prompt.split("## Required context")[1]


async def test_empty_session_without_task_falls_back_and_says_why(engine):
    caller = engine.caller(unique("org"), clearance=1)
    reply = await assemble(caller, session="fresh", task="")
    q = reply.quality
    assert q.fallback_used and q.fallback_reason.startswith("no task_description")
    assert q.retrieval_outcome == pb.RETRIEVAL_OUTCOME_UNSPECIFIED and q.effective_min_score > 0
    assert reply.assembled_tokens == count_tokens(reply.assembled_prompt, MODEL)


async def test_no_results_is_named(engine):
    caller = engine.caller(unique("org"), clearance=1)
    await ingest(caller, "s", ["hello there"])
    reply = await assemble(caller, session="s", task="quantum chromodynamics lattice")
    q = reply.quality
    assert q.retrieval_outcome in (pb.RETRIEVAL_OUTCOME_NO_RESULTS, pb.RETRIEVAL_OUTCOME_BELOW_THRESHOLD)
    assert q.fallback_used and q.fallback_reason in ("no_results", "below_threshold")
    assert "hello there" in reply.assembled_prompt  # recency still fills the prompt


async def test_twenty_turns_share_the_prefix_and_prompt_id_survives_an_api_restart(engine, assembly_org):
    org, caller, _ = assembly_org
    prefixes = set()
    for turn in range(20):
        await ingest(caller, "s20", [f"user: message number {turn}"])
        reply = await assemble(caller, session="s20", task="message number")
        prefixes.add(reply.assembled_prompt.encode()[:reply.cache_prefix_bytes])
    assert len(prefixes) == 1 and len(next(iter(prefixes))) == reply.cache_prefix_bytes > 0

    # Identical inputs (the corpus included: every vector recorded) give identical bytes, in this
    # API process and in a freshly started one.
    await wait_embedded(engine, org)
    reply = await assemble(caller, session="s20", task="message number")
    assert (await assemble(caller, session="s20", task="message number")).prompt_id == reply.prompt_id
    async with open_deps(engine.settings) as deps:  # a second API process state: fresh pool, embedder
        server = build_api_server(engine.settings, deps, address="127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                request = pb.AssembleContextRequest(session_id="s20", task_description="message number",
                                                    token_budget=4000, model_id=MODEL)
                request.scope.CopyFrom(caller.scope)
                again = await context_pb2_grpc.ContextEngineStub(channel).AssembleContext(
                    request, metadata=caller.metadata())
        finally:
            await server.stop(0)
    assert again.assembled_prompt == reply.assembled_prompt
    assert again.prompt_id == reply.prompt_id


async def test_savings_are_sampled_and_aggregated(engine):
    caller = engine.caller(SAMPLED_ORG, clearance=1)
    # Over budget, so every call crosses the compaction threshold; 11 turns at most, so the worker
    # has nothing to compact (sliding_window keeps COMPACTION_KEEP_RECENT_TURNS, 10, and needs 2
    # more) and the session stays as written between the calls.
    await ingest(caller, "s", [f"user: line {i} " + "filler words " * 60 for i in range(10)])
    budget = 300
    reply = await assemble(caller, session="s", task="line 3", budget=budget)
    assert reply.baseline_tokens > reply.assembled_tokens > 0
    assert reply.savings_ratio == pytest.approx(
        (reply.baseline_tokens - reply.assembled_tokens) / reply.baseline_tokens)
    # The naive prompt counts every visible chunk once: a turn of another session adds its tokens
    # to the corpus part, a turn of the caller's own session to the history part only.
    elsewhere, here = "user: a line of another session" + " more words" * 10, "user: one more line here"
    await ingest(caller, "other", [elsewhere])
    after_elsewhere = await assemble(caller, session="s", task="line 3", budget=budget)
    assert after_elsewhere.baseline_tokens == reply.baseline_tokens + count_tokens(elsewhere)
    await ingest(caller, "s", [here])
    after_here = await assemble(caller, session="s", task="line 3", budget=budget)
    assert after_here.baseline_tokens == after_elsewhere.baseline_tokens + count_tokens(here)
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        deadline = time.monotonic() + 30
        while not await conn.fetchval("SELECT samples FROM savings_by_model WHERE org_id = $1", SAMPLED_ORG):
            assert time.monotonic() < deadline, "the baseline calculator did not aggregate the sample"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    code, out = await engine.cli("stats", "savings", "--org", SAMPLED_ORG)
    assert code == 0 and SAMPLED_ORG in out and MODEL in out, out
    other = engine.caller(unique("org"), clearance=1)
    unsampled = await assemble(other, session="s", task="x")
    assert unsampled.baseline_tokens == 0 and unsampled.savings_ratio == 0


async def test_compaction_job_once_per_crossing_and_none_again_for_a_refused_version(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    await ingest(caller, "long", [f"user: long turn {i} " + "detail " * 30 for i in range(10)])
    for _ in range(3):  # above 80 % of a 300-token budget on every call: one crossing
        await assemble(caller, session="long", task="", budget=300)

    async def refused():  # ten turns, all kept verbatim: nothing to compact, and the request closes
        return await admin_fetch(engine, "SELECT 1 FROM compaction_requests WHERE org_id = $1 AND "
                                         "closed_reason = 'refused' AND refusal = 'nothing_to_compact'", org)

    deadline = time.monotonic() + 60
    while not await refused():
        assert time.monotonic() < deadline, "the worker did not refuse the request"
        await asyncio.sleep(0.1)
    await assemble(caller, session="long", task="", budget=300)  # the same version: nothing asked again
    await ingest(caller, "long", ["user: one more turn " + "detail " * 30])
    await assemble(caller, session="long", task="", budget=300)  # a new version: a second crossing

    topic = LogTopics.from_settings(engine.settings).jobs["compaction"]
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=engine.settings.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    jobs = []
    try:
        deadline = time.monotonic() + 20
        while len(jobs) < 2 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    env = stream_pb2.StreamEnvelope.FromString(record.value)
                    job = stream_pb2.CompactionJob.FromString(env.payload)
                    if env.scope.org_id == org:
                        jobs.append((env.stream, job))
    finally:
        await consumer.stop()
    assert len(jobs) == 2
    stream, job = jobs[0]
    assert stream == f"compaction:{org}" and job.session_id == "long" and job.token_budget == 300
    assert job.current_token_count > 240 and job.strategy == "sliding_window"


async def test_reading_only_the_recent_history_never_changes_the_prompt(engine, monkeypatch):
    """A long session's older turns are not read (HISTORY_READ_FACTOR): the prompt is the one a
    read of the whole window gives, also when the turns read run out before the budget does."""
    from commands import assemble_context as module

    org = unique("org")
    caller = engine.caller(org, "pillar", "team", clearance=1)
    turns = [f"user: turn {i} about the order number {1000 + i} and its parcel" for i in range(60)]
    # The org scope owns the session and the team writes and assembles it: every call crosses the
    # compaction threshold, which only the owner scope's own calls record, so the session stays as written.
    await ingest(engine.caller(org, clearance=1), "long", turns[:1])
    await ingest(caller, "long", turns[1:])
    await assemble(caller, session="long", task="", budget=200)  # projected: the freshness wait
    prompts = {}
    for factor in (module.HISTORY_READ_FACTOR, 0, 10**6):  # the default, a single turn, the whole window
        monkeypatch.setattr(module, "HISTORY_READ_FACTOR", factor)
        reply = await assemble(caller, session="long", task="", budget=200)
        prompts[factor] = reply.assembled_prompt
    assert len(set(prompts.values())) == 1
    history = prompts[0].split("## Recent conversation")[1]
    assert "turn 59 " in history and "turn 0 " not in history and history.count("user: turn") > 1
