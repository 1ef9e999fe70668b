"""Names a client picks are its own scope's: an idempotency-key (a sibling sending the same key
into a session both write to writes its own event, learns nothing of the other's, and each one's
retry returns its own) and a snapshot name (a scope below cannot take the name its parent means,
and so decide which state the parent's PullContext reads)."""

from __future__ import annotations

import grpc
import pytest

from entrypoints.serving.status import error_info
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

KEY = (("idempotency-key", "shared-key-1"),)


@pytest.mark.parametrize("same_content", [True, False])
async def test_a_siblings_key_is_another_request(quiet_engine, same_content) -> None:
    org = unique("keys")
    session = "shared"
    await quiet_engine.caller(org)("IngestEvent", pb.IngestEventRequest(
        session_id=session, event_type="message", content=b"opened by the org"))
    emea, apac = quiet_engine.caller(org, "sales", "emea"), quiet_engine.caller(org, "sales", "apac")
    theirs_content = b"emea's turn" if same_content else b"apac's own turn"

    mine = await emea("IngestEvent", pb.IngestEventRequest(
        session_id=session, event_type="message", content=b"emea's turn"), *KEY)
    theirs = await apac("IngestEvent", pb.IngestEventRequest(
        session_id=session, event_type="message", content=theirs_content), *KEY)
    assert theirs.event_id != mine.event_id
    retried = await emea("IngestEvent", pb.IngestEventRequest(
        session_id=session, event_type="message", content=b"emea's turn"), *KEY)
    assert retried.event_id == mine.event_id

    await emea("PushContext", pb.PushContextRequest(
        session_id=session, memory_type="working", content=b"emea memory"), *KEY)
    await apac("PushContext", pb.PushContextRequest(
        session_id=session, memory_type="working",
        content=b"emea memory" if same_content else b"apac memory"), *KEY)
    for caller, content in ((emea, b"emea memory"), (apac, b"emea memory" if same_content else b"apac memory")):
        pulled = await caller("PullContext", pb.PullContextRequest(session_id=session))
        assert pulled.content == content  # each team's own version (a sibling's is never visible)


async def test_a_server_key_naming_a_siblings_event_is_refused(quiet_engine) -> None:
    """`ce-event:<id>` of another scope's event, with the same bytes: refused as another request,
    not answered as if it were the caller's own write."""
    org = unique("keys")
    await quiet_engine.caller(org)("IngestEvent", pb.IngestEventRequest(
        session_id="shared", event_type="message", content=b"opened by the org"))
    emea, apac = quiet_engine.caller(org, "sales", "emea"), quiet_engine.caller(org, "sales", "apac")
    request = pb.IngestEventRequest(session_id="shared", event_type="message", content=b"emea's turn")
    mine = await emea("IngestEvent", request)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await apac("IngestEvent", request, ("idempotency-key", f"ce-event:{mine.event_id}"))
    assert (err.value.code(), error_info(err.value).reason) == \
        (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")


async def test_a_snapshot_name_taken_below_is_not_the_parents(quiet_engine) -> None:
    org = unique("names")
    team, agent = quiet_engine.caller(org, "sales", "emea"), quiet_engine.caller(org, "sales", "emea", "bot-1")
    await team("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"opened"))
    await team("PushContext", pb.PushContextRequest(session_id="s", memory_type="working", content=b"team v1"))
    taken_below = await agent("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name="release-1"))
    await team("PushContext", pb.PushContextRequest(session_id="s", memory_type="working", content=b"team v2"))
    mine = await team("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name="release-1"))
    assert mine.snapshot_id != taken_below.snapshot_id and mine.version_hash != taken_below.version_hash
    # The team's name means the team's snapshot (the nearest scope's), not the one taken below.
    assert (await team("PullContext", pb.PullContextRequest(session_id="s", snapshot_name="release-1"))).content \
        == b"team v2"
    for caller in (team, agent):  # each scope's name is taken once, by itself
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name="release-1"))
        assert (err.value.code(), error_info(err.value).reason) == \
            (grpc.StatusCode.ALREADY_EXISTS, "SNAPSHOT_NAME_TAKEN")
