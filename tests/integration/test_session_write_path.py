"""The session write path through gRPC with real tokens, a real broker, a real worker process
and a real PostgreSQL: IngestEvent, PushContext, PullContext, CreateSnapshot, RollbackContext."""

import base64
import hashlib
import uuid

import asyncpg
import grpc
import pytest

from context_engine import hashing
from context_engine.events import canonical_bytes
from inference.tokens import count_tokens
from tests.fixtures.calls import archived_count, expect_error, session_version
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration


def ingest_payload(session_id, event_type, content: bytes, metadata=None, idempotency_key=""):
    """The payload the engine builds for an ingest; its hash is the chain input."""
    return {"session_id": session_id, "event_type": event_type,
            "content_b64": base64.b64encode(content).decode(), "metadata": metadata or {},
            "content_sha256": hashlib.sha256(content).hexdigest(),
            "token_count": count_tokens(content.decode()), "idempotency_key": idempotency_key}


def chain_input(payload) -> str:
    return hashlib.sha256(canonical_bytes(payload)).hexdigest()


async def test_ingest_returns_content_hash_and_tokens(engine):
    caller = engine.caller(unique("org"), clearance=1)
    content = b'{"role": "user", "text": "hello world, this is a test"}'
    reply = await caller("IngestEvent", pb.IngestEventRequest(
        session_id="s1", event_type="message", content=content, metadata={"role": "user"}))
    assert uuid.UUID(reply.event_id)
    assert reply.version_hash == hashlib.sha256(content).hexdigest()
    assert reply.token_count == count_tokens(content.decode()) > 0


async def test_idempotency_key_returns_first_result_without_a_second_event(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    request = pb.IngestEventRequest(session_id="s1", event_type="tool_output", content=b"42")
    first = await caller("IngestEvent", request, ("idempotency-key", "k-1"))
    again = await caller("IngestEvent", request, ("idempotency-key", "k-1"))
    other = await caller("IngestEvent", request, ("idempotency-key", "k-2"))
    assert again.event_id == first.event_id
    assert other.event_id != first.event_id
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM session_events WHERE org_id = $1", org) == 2
    finally:
        await conn.close()


@pytest.mark.parametrize("method, request_, field", [
    ("IngestEvent", pb.IngestEventRequest(session_id="", event_type="message", content=b"x"), "session_id"),
    ("IngestEvent", pb.IngestEventRequest(session_id="bad id!", event_type="message", content=b"x"), "session_id"),
    ("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="email", content=b"x"), "event_type"),
    ("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b""), "content"),
    ("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message",
                                          content=b"x" * (1024 * 1024 + 1)), "content"),
    ("PushContext", pb.PushContextRequest(session_id="s", memory_type="procedural", content=b"x"), "memory_type"),
    ("PushContext", pb.PushContextRequest(session_id="", memory_type="semantic", content=b"x"), "session_id"),
    ("RollbackContext", pb.RollbackContextRequest(session_id="s", target_version_hash="abc"),
     "target_version_hash"),
    ("RollbackContext", pb.RollbackContextRequest(session_id="s", target_version_hash="A" * 64),
     "target_version_hash"),
    ("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name=""), "snapshot_name"),
    ("PullContext", pb.PullContextRequest(agent_id="a", snapshot_name="n"), "session_id"),
])
async def test_bad_input_is_invalid_argument_and_writes_nothing(engine, method, request_, field):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller(method, request_), field=field)
    assert await archived_count(engine, org) == 0


async def test_push_then_pull_latest_version(engine):
    org = unique("org")
    agent = engine.caller(org, "p", "t", "bot", clearance=1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s1"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    first = await agent("PushContext", pb.PushContextRequest(
        session_id="s1", memory_type="semantic", content=b'{"fact": 1}', metadata={"src": "a"}))
    second = await agent("PushContext", pb.PushContextRequest(
        session_id="s1", memory_type="working", content=b'{"fact": 2}'))
    assert first.version_hash == hashlib.sha256(b'{"fact": 1}').hexdigest()
    pulled = await agent("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s1"))
    assert (pulled.version_hash, pulled.memory_type, pulled.content) == \
        (second.version_hash, "working", b'{"fact": 2}')
    assert pulled.created_at.ToDatetime() >= first.created_at.ToDatetime()
    # Without a session: the newest memory of the agent across sessions.
    anywhere = await agent("PullContext", pb.PullContextRequest(agent_id="bot"))
    assert anywhere.version_hash == second.version_hash


async def test_snapshot_needs_l2_and_names_are_unique_per_session(engine):
    org = unique("org")
    low, lead = engine.caller(org, clearance=1), engine.caller(org, clearance=2)
    await low("IngestEvent", pb.IngestEventRequest(session_id="s1", event_type="message", content=b"a"))
    await expect_error(grpc.StatusCode.PERMISSION_DENIED,
                       low("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s1", snapshot_name="v1")),
                       reason="CLEARANCE_TOO_LOW")
    snap = await lead("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s1", snapshot_name="v1"))
    assert snap.version_hash == await session_version(engine, org, "s1")
    await expect_error(grpc.StatusCode.ALREADY_EXISTS,
                       lead("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s1", snapshot_name="v1")),
                       reason="SNAPSHOT_NAME_TAKEN")
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       lead("CreateSnapshot", pb.CreateSnapshotRequest(session_id="nope", snapshot_name="v1")))


async def test_rollback_restores_state_and_new_events_chain_from_target(engine):
    org = unique("org")
    lead, member = engine.caller(org, clearance=3), engine.caller(org, clearance=2)
    contents = [b"one", b"two", b"three"]
    for c in contents:
        await lead("IngestEvent", pb.IngestEventRequest(session_id="s1", event_type="message", content=c))
    expected = hashing.chain(f"{org}/s1", [chain_input(ingest_payload("s1", "message", c)) for c in contents])
    assert await session_version(engine, org, "s1") == expected[3]

    await expect_error(grpc.StatusCode.PERMISSION_DENIED, member("RollbackContext", pb.RollbackContextRequest(
        session_id="s1", target_version_hash=expected[1])), reason="CLEARANCE_TOO_LOW")
    await expect_error(grpc.StatusCode.NOT_FOUND, lead("RollbackContext", pb.RollbackContextRequest(
        session_id="s1", target_version_hash=hashlib.sha256(b"never").hexdigest())), reason="VERSION_NOT_FOUND")

    reply = await lead("RollbackContext", pb.RollbackContextRequest(session_id="s1", target_version_hash=expected[1]))
    assert reply.restored_version_hash == expected[1]
    assert await session_version(engine, org, "s1") == expected[1]

    await lead("IngestEvent", pb.IngestEventRequest(session_id="s1", event_type="message", content=b"four"))
    after = hashing.next_version(expected[1], chain_input(ingest_payload("s1", "message", b"four")))
    assert await session_version(engine, org, "s1") == after
    # The rolled-back events stay in the log archive and the audit view.
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        rows = await conn.fetch("SELECT active FROM session_items WHERE org_id = $1 AND session_id = 's1' "
                                "ORDER BY seq", org)
    finally:
        await conn.close()
    assert [r["active"] for r in rows] == [True, False, False, True]
    assert await archived_count(engine, org) == 5


async def test_pull_named_snapshot_after_later_pushes(engine):
    org = unique("org")
    agent = engine.caller(org, "p", "t", "bot", clearance=2)
    await agent("PushContext", pb.PushContextRequest(session_id="s1", memory_type="episodic", content=b"before"))
    snap = await agent("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s1", snapshot_name="checkpoint"))
    await agent("PushContext", pb.PushContextRequest(session_id="s1", memory_type="episodic", content=b"after"))
    pulled = await agent("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s1",
                                                              snapshot_name="checkpoint"))
    assert (pulled.content, pulled.version_hash) == (b"before", snap.version_hash)
    latest = await agent("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s1"))
    assert latest.content == b"after"


async def test_other_org_never_reads_this_orgs_data(engine):
    org_a, org_b = unique("org-a"), unique("org-b")
    a = engine.caller(org_a, "p", "t", "bot", clearance=4)
    b = engine.caller(org_b, "p", "t", "bot", clearance=4)
    await a("PushContext", pb.PushContextRequest(session_id="shared-id", memory_type="semantic", content=b"secret"))
    await a("CreateSnapshot", pb.CreateSnapshotRequest(session_id="shared-id", snapshot_name="snap"))
    for request in (pb.PullContextRequest(agent_id="bot", session_id="shared-id"),
                    pb.PullContextRequest(agent_id="bot"),
                    pb.PullContextRequest(agent_id="bot", session_id="shared-id", snapshot_name="snap")):
        await expect_error(grpc.StatusCode.NOT_FOUND, b("PullContext", request))
    await expect_error(grpc.StatusCode.NOT_FOUND, b("CreateSnapshot", pb.CreateSnapshotRequest(
        session_id="shared-id", snapshot_name="x")))


async def test_sibling_team_cannot_touch_a_teams_session(engine):
    org = unique("org")
    emea = engine.caller(org, "sales", "emea", clearance=4)
    apac = engine.caller(org, "sales", "apac", clearance=4)
    emea_agent = engine.caller(org, "sales", "emea", "bot", clearance=4)
    await emea("IngestEvent", pb.IngestEventRequest(session_id="deal-1", event_type="message", content=b"x"))
    await expect_error(grpc.StatusCode.PERMISSION_DENIED, apac("IngestEvent", pb.IngestEventRequest(
        session_id="deal-1", event_type="message", content=b"y")), reason="SESSION_OUT_OF_SCOPE")
    await expect_error(grpc.StatusCode.NOT_FOUND, apac("CreateSnapshot", pb.CreateSnapshotRequest(
        session_id="deal-1", snapshot_name="x")))
    # A descendant of the owner may write into it.
    await emea_agent("IngestEvent", pb.IngestEventRequest(session_id="deal-1", event_type="message", content=b"z"))
