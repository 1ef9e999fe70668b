"""Compact through gRPC with real tokens, the real log, worker and PostgreSQL (issue #22)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from entrypoints.serving.status import error_info
from inference.facts import RETENTION_FLOOR
from inference.openai_http import RetryPolicy
from inference.summarizers.chat_completions import ChatCompletionsSummarizer
from tests.fixtures.calls import admin_fetch as fetch
from tests.fixtures.calls import archived_count, expect_error, session_version
from tests.fixtures.engine import unique
from tests.fixtures.json_server import FakeChatServer
from tests.fixtures.sessions import KEEP, OLDER, RECENT, active_turns, long_session
from tests.fixtures.settling import settled
from upsquad.context.v1 import context_pb2 as pb


def assemble(sid: str) -> pb.AssembleContextRequest:
    return pb.AssembleContextRequest(session_id=sid, task_description="where does order INV-2041 ship?",
                                     token_budget=8000, model_id="gpt-4")


async def test_compact_replaces_the_older_turns_in_history_and_keeps_them_retrievable(engine):
    org, sid, lead = await long_session(engine)
    history_only = pb.AssembleContextRequest(session_id=sid, token_budget=8000, model_id="gpt-4")
    before = await lead("AssembleContext", history_only)
    tokens = {bytes(r["content"]): r["token_count"] for r in await fetch(
        engine, "SELECT content, token_count FROM session_events WHERE org_id = $1 AND session_id = $2", org, sid)}
    reply = await lead("Compact", pb.CompactRequest(session_id=sid, strategy="sliding_window"))
    assert reply.version_hash == await session_version(engine, org, sid)
    assert reply.original_tokens == sum(tokens[c] for c in OLDER)
    assert 0 < reply.compacted_tokens < reply.original_tokens
    assert reply.fact_retention_score == 1.0
    turns = await active_turns(engine, org, sid)
    lines, recent = turns[:-KEEP], turns[-KEEP:]
    assert recent == RECENT and any(b"INV-2041" in line for line in lines)
    assert not any(b"hi there" in line for line in lines)  # a line per turn that kept a sentence
    after = await lead("AssembleContext", history_only)  # the history costs less
    assert after.assembled_tokens < before.assembled_tokens
    assert "Lisbon" in after.assembled_prompt and "hi there" not in after.assembled_prompt
    assert "summary of earlier turns" in after.assembled_prompt
    # The replaced turns stay retrievable (recall storage); the summary's lines are never retrieved.
    await settled(engine.settings.database_url, org)
    found = await lead("Search", pb.SearchRequest(query="INV-2041 lamps Lisbon", top_k=5))
    assert found.results and found.results[0].content in (OLDER[2].decode(), OLDER[3].decode())
    assert not {r.content for r in found.results} & {line.decode() for line in lines if line not in OLDER}
    # Rollback to the version before it brings the turns back.
    previous = (await fetch(engine, "SELECT version FROM session_versions WHERE org_id = $1 AND session_id = $2 "
                                    "AND seq = $3", org, sid, len(OLDER) + KEEP))[0]["version"]
    await lead("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=previous))
    assert await active_turns(engine, org, sid) == OLDER + RECENT


async def test_a_summary_missing_one_number_is_rejected_and_nothing_changes(engine):
    org, sid, lead = await long_session(engine)
    version, events = await session_version(engine, org, sid), await archived_count(engine, org)

    def lossy(llm):
        llm.answer = ("user: my order INV-2041 of 3 lamps ships to Lisbon on 7 May 2023\n"
                      "assistant: the invoice total is dollars")  # 40 is gone

    err = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, compact_with_llm(engine, lead, sid, lossy),
                             reason="QUALITY_GUARDRAIL_TRIGGERED")
    details = error_info(err).metadata
    assert float(details["fact_retention_score"]) < RETENTION_FLOOR and "'40'" in details["missing"]
    assert await session_version(engine, org, sid) == version and await archived_count(engine, org) == events
    assert await active_turns(engine, org, sid) == OLDER + RECENT


async def test_two_concurrent_compacts_one_wins_the_other_gets_a_definite_answer(engine):
    org, sid, lead = await long_session(engine)
    request = pb.CompactRequest(session_id=sid, strategy="sliding_window")
    results = await asyncio.gather(lead("Compact", request), lead("Compact", request), return_exceptions=True)
    won = [r for r in results if isinstance(r, pb.CompactResponse)]
    lost = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert (lost[0].code(), error_info(lost[0]).reason) in {
        (grpc.StatusCode.ABORTED, "SESSION_CHANGED"), (grpc.StatusCode.FAILED_PRECONDITION, "NOTHING_TO_COMPACT")}
    assert won[0].version_hash == await session_version(engine, org, sid)
    compactions = await fetch(engine, "SELECT count(*) AS n FROM session_items WHERE org_id = $1 AND session_id = $2 "
                                      "AND cardinality(replaces) > 0", org, sid)
    assert compactions[0]["n"] == 1


async def test_compact_refuses_whom_rollback_refuses_and_writes_nothing(engine):
    """The destructive-operation rule (docs/security.md): Compact answers each caller as
    RollbackContext does, and a refusal writes nothing."""
    org, sid, lead = await long_session(engine)
    version = await session_version(engine, org, sid)
    callers = [engine.caller(org, "sales", "emea", clearance=2),
               engine.caller(org, "sales", "emea", "bot", clearance=4),
               engine.caller(org, "sales", clearance=4), engine.caller(org, clearance=4),
               engine.caller(org, "sales", "apac", clearance=4),
               engine.caller(unique("org"), "sales", "emea", clearance=4)]
    for who in callers:
        events = await archived_count(engine, org)
        with pytest.raises(grpc.aio.AioRpcError) as rollback:
            await who("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=version))
        with pytest.raises(grpc.aio.AioRpcError) as compacted:
            await who("Compact", pb.CompactRequest(session_id=sid, strategy="sliding_window"))
        assert (compacted.value.code(), error_info(compacted.value).reason) == (
            rollback.value.code(), error_info(rollback.value).reason), who.scope
        assert await archived_count(engine, org) == events
    assert await active_turns(engine, org, sid) == OLDER + RECENT and await session_version(engine, org, sid) == version


async def test_compact_bad_input_and_nothing_to_compact_write_nothing(engine):
    org, sid, lead = await long_session(engine)
    events = await archived_count(engine, org)
    cases = [
        (pb.CompactRequest(session_id=sid, strategy="summary"), grpc.StatusCode.INVALID_ARGUMENT, "strategy"),
        (pb.CompactRequest(session_id=sid, strategy=""), grpc.StatusCode.INVALID_ARGUMENT, "strategy"),
        (pb.CompactRequest(session_id="", strategy="sliding_window"), grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
        (pb.CompactRequest(session_id="a\x00b", strategy="sliding_window"), grpc.StatusCode.INVALID_ARGUMENT,
         "session_id"),
        (pb.CompactRequest(session_id=unique("none"), strategy="sliding_window"), grpc.StatusCode.NOT_FOUND, None),
    ]
    for req, code, field in cases:
        err = await expect_error(code, lead("Compact", req))
        if field:
            assert error_info(err).metadata["field"] == field
    short = unique("s")
    await lead("IngestEvent", pb.IngestEventRequest(session_id=short, event_type="message", content=b"one turn"))
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, lead(
        "Compact", pb.CompactRequest(session_id=short, strategy="sliding_window")), reason="NOTHING_TO_COMPACT")
    assert await archived_count(engine, org) == events + 1  # the short session's turn only
    assert await active_turns(engine, org, sid) == OLDER + RECENT


@pytest.mark.parametrize("strategy", ["SLIDING_WINDOW", "sliding_window ", "\x00", "x" * 10_000])
async def test_a_strategy_other_than_sliding_window_is_invalid(engine, strategy):
    org, sid = unique("org"), unique("s")
    lead = engine.caller(org, "sales", "emea", clearance=3)
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, lead("Compact", pb.CompactRequest(
        session_id=sid, strategy=strategy)), reason="UNSUPPORTED_STRATEGY")


async def compact_with_llm(engine, lead, sid, configure):
    """Compact with an LLM summarizer served by a local fake (configure(server) sets its answer)."""
    with FakeChatServer() as llm:
        configure(llm)
        default, engine.deps.summarizer = engine.deps.summarizer, ChatCompletionsSummarizer(
            base_url=llm.base_url, model="gemini-2.5-flash-lite", retry=RetryPolicy(1))
        try:
            return await lead("Compact", pb.CompactRequest(session_id=sid, strategy="sliding_window"))
        finally:
            engine.deps.summarizer = default


async def test_a_summary_over_the_content_limit_or_a_failing_summarizer_writes_nothing(engine):
    org, sid, lead = await long_session(engine)
    version, events = await session_version(engine, org, sid), await archived_count(engine, org)
    huge = "user: " + "INV-2041 3 lamps Lisbon 7 May 2023 40 dollars " * (engine.settings.max_content_bytes // 40)

    def oversized(llm):
        llm.answer = huge

    def failing(llm):
        llm.script = [(500, {"error": {"message": "overloaded"}}, {})]

    err = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, compact_with_llm(engine, lead, sid, oversized),
                             reason="SUMMARY_TOO_LARGE")
    assert int(error_info(err).metadata["summary_bytes"]) > engine.settings.max_content_bytes
    await expect_error(grpc.StatusCode.UNAVAILABLE, compact_with_llm(engine, lead, sid, failing),
                       reason="SUMMARIZER_UNAVAILABLE")
    assert await session_version(engine, org, sid) == version and await archived_count(engine, org) == events
