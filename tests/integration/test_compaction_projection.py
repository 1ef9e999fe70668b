"""session.compacted through the real log, worker and PostgreSQL (issues #22, #36): the summary
replaces the older turns in the session's state and history, and they stay retrievable;
rollback across it brings them back; a stale, foreign or malformed compaction changes nothing;
replay reproduces it. The events here are appended by a trusted writer, as the Compact RPC and
the worker do; a v1 event (no line stands for a turn) reads as the v2 the engine writes now."""

from __future__ import annotations

import base64
import uuid

import pytest

from context_engine import hashing
from context_engine.events import Event, SessionCompacted, SessionRef
from context_engine.scope import Scope
from projections.projector.outcome import ProjectionOutcome
from streams.replay import compare, replay
from streams.topics import LogTopics
from tests.fixtures.calls import admin_fetch as fetch
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import unique
from tests.fixtures.replay import log_of
from tests.fixtures.settling import settled
from upsquad.context.v1 import context_pb2 as pb

TURNS = [b"user: my order INV-2041 ships to Lisbon on 7 May 2023", b"assistant: noted, Lisbon on 7 May",
         b"user: thanks!", b"assistant: you are welcome", b"user: what about the invoice?",
         b"assistant: the invoice total is 40 dollars"]
SUMMARY = b"user: order INV-2041 ships to Lisbon on 7 May 2023 (summary of 4 turns)"


async def session_with_turns(engine):
    org, sid = unique("org"), unique("s")
    lead = engine.caller(org, "sales", "emea", clearance=3)
    ids = [(await lead("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message", content=c))).event_id
           for c in TURNS]
    return org, sid, lead, ids


async def state(engine, org, sid):
    """The session's version and its active turns' contents in history order."""
    version = (await fetch(engine, "SELECT version FROM sessions WHERE org_id = $1 AND session_id = $2", org, sid))
    rows = await fetch(engine, "SELECT content FROM session_events WHERE org_id = $1 AND session_id = $2 AND active "
                               "ORDER BY seq, occurred_at", org, sid)
    return version[0]["version"], [bytes(r["content"]) for r in rows]


async def compact(engine, org, sid, base: str, replaced, *, scope: Scope | None = None, summary: bytes = SUMMARY):
    body = SessionCompacted(sid, base, tuple(replaced), base64.b64encode(summary).decode(), "sliding_window",
                            "extractive", 1.0, 60, 15)
    ev = Event.of(body, scope=scope or Scope(org, "sales", "emea"), actor="lead",
                  aggregate=SessionRef(org, sid).aggregate)
    return ev, await engine.deps.append(ev, SessionRef(org, sid))


async def test_a_compaction_replaces_the_older_turns_with_its_summary(engine):
    org, sid, lead, ids = await session_with_turns(engine)
    base, _ = await state(engine, org, sid)
    ev, outcome = await compact(engine, org, sid, base, ids[:4])
    assert outcome == ProjectionOutcome.APPLIED
    version, history = await state(engine, org, sid)
    assert version == hashing.next_version(base, ev.content_hash)
    assert history == [SUMMARY, *TURNS[4:]]  # the summary where the first replaced turn was
    items = await fetch(engine, "SELECT seq, active, replaces FROM session_items WHERE org_id = $1 AND session_id = $2 "
                                "ORDER BY seq", org, sid)
    assert [(r["seq"], r["active"], list(r["replaces"])) for r in items] == [
        (1, False, []), (2, False, []), (3, False, []), (4, False, []), (5, True, []), (6, True, []),
        (7, True, [1, 2, 3, 4])]
    depth = await fetch(engine, "SELECT depth FROM session_versions WHERE org_id = $1 AND session_id = $2 "
                                "AND version = $3", org, sid, version)
    assert depth[0]["depth"] == 3
    # Retrieval finds the turns it replaced (recall storage), not the summary.
    await settled(engine.settings.database_url, org)
    found = await lead("Search", pb.SearchRequest(query="INV-2041 Lisbon", top_k=10))
    assert SUMMARY.decode() not in [r.content for r in found.results]
    assert TURNS[0].decode() in [r.content for r in found.results]
    prompt = (await lead("AssembleContext", pb.AssembleContextRequest(
        session_id=sid, task_description="where does the order ship?", token_budget=4000,
        model_id="gpt-4"))).assembled_prompt
    # The line stands for the first turn, which retrieval found: the turn is shown in its place, once.
    assert SUMMARY.decode() not in prompt and prompt.count(TURNS[0].decode()) == 1
    assert prompt.index(TURNS[0].decode()) > prompt.index("## Recent conversation")


async def test_rollback_across_a_compaction_brings_the_turns_back_forward_removes_them_replay_agrees(engine):
    org, sid, lead, ids = await session_with_turns(engine)
    base, _ = await state(engine, org, sid)
    await compact(engine, org, sid, base, ids[:4])
    compacted, _ = await state(engine, org, sid)
    await lead("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=base))
    assert await state(engine, org, sid) == (base, TURNS)
    await lead("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=compacted))
    assert await state(engine, org, sid) == (compacted, [SUMMARY, *TURNS[4:]])
    # Replay rebuilds the same read models from the log.
    await settled(engine.settings.database_url, org)
    topic = LogTopics.from_settings(engine.settings).events
    async with fresh_database(engine.settings.database_url, "ce_test_replay") as target:
        await replay(log_of(engine.settings, topic), target)
        assert await compare(engine.settings.database_url, target) == []


async def test_a_stale_foreign_or_malformed_compaction_changes_nothing(engine):
    org, sid, lead, ids = await session_with_turns(engine)
    base, history = await state(engine, org, sid)
    bot = engine.caller(org, "sales", "emea", "bot", clearance=3)
    below = (await bot("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message",
                                                            content=b"the bot's own turn"))).event_id
    now, history = await state(engine, org, sid)
    cases = [
        (base, ids[:2], None, ProjectionOutcome.STALE),  # the bot's turn came after `base`
        (now, [*ids[:2], below], None, ProjectionOutcome.UNKNOWN_TARGET),  # not the owner's turn to summarise
        (now, [*ids[:2], str(uuid.uuid4())], None, ProjectionOutcome.UNKNOWN_TARGET),
        (now, [], None, ProjectionOutcome.UNKNOWN_TARGET),
        (now, ["not-a-uuid"], None, ProjectionOutcome.UNKNOWN_TARGET),
        (now, ids[:2], Scope(org, "sales", "emea", "bot"), ProjectionOutcome.OUT_OF_SCOPE),  # below the owner
        (now, ids[:2], Scope(org, "sales", "apac"), ProjectionOutcome.OUT_OF_SCOPE),  # a sibling team
    ]
    for at, replaced, scope, expected in cases:
        _, outcome = await compact(engine, org, sid, at, replaced, scope=scope)
        assert outcome == expected, (replaced, scope)
        assert await state(engine, org, sid) == (now, history)
    # A turn already replaced is not replaced again.
    await compact(engine, org, sid, now, ids[:2])
    after, _ = await state(engine, org, sid)
    _, outcome = await compact(engine, org, sid, after, ids[1:3])
    assert outcome == ProjectionOutcome.UNKNOWN_TARGET


@pytest.mark.parametrize("payload", [{"replaced": "not a list"}, {"replaced": [1, 2]}, {"fact_retention_score": "x"}])
def test_a_malformed_payload_does_not_read(payload):
    good = SessionCompacted("s", "v", ("a",), "", "sliding_window", "extractive", 1.0, 1, 1).to_payload()
    with pytest.raises((ValueError, TypeError)):
        SessionCompacted.from_payload(good | payload)
