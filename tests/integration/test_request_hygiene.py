"""Requests the engine must refuse cleanly, through real gRPC with real tokens (issue #18 items 5
and 6): bodies that do not parse answer INVALID_ARGUMENT before authentication and say nothing
of what was sent, on the API and on the detector sidecar; identifiers with a trailing newline or
a line separator answer INVALID_ARGUMENT naming the field, and write nothing."""

from __future__ import annotations

import hashlib
import random
import uuid

import asyncpg
import grpc
import pytest
from google.protobuf.message import DecodeError

from context_engine.config import Settings
from entrypoints.detector.server import build_detector_server, start_detector
from entrypoints.serving.status import error_info
from inference.detector.settings import DetectorSettings
from inference.detector.token import service_token as detector_token
from tests.fixtures.calls import archived_count
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb
from upsquad.ml.v1 import detector_pb2

pytestmark = pytest.mark.integration

SECRET = "hunter2-body-marker"  # in every body below: no answer may repeat any of it
API = "/upsquad.context.v1.ContextEngine/"
DETECTOR = "/upsquad.ml.v1.MLDetectorService/"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string_field(number: int, raw: bytes) -> bytes:
    """A length-delimited field holding `raw` as is (no UTF-8 check: that is the point)."""
    return varint(number << 3 | 2) + varint(len(raw)) + raw


def with_bad_utf8(message, number: int) -> bytes:
    """`message` serialised, then string field `number` appended holding invalid UTF-8."""
    return message.SerializeToString() + string_field(number, b"\xff\xfe" + SECRET.encode() + b"\xc3\x28")


def random_body(message_type) -> bytes:
    """Seeded random bytes that do not parse as `message_type` (checked, not assumed)."""
    rng = random.Random(18)
    while True:
        body = rng.randbytes(96) + SECRET.encode()
        try:
            message_type.FromString(body)
        except DecodeError:
            return body


def api_bodies(org: str) -> dict[str, tuple[str, bytes]]:
    scope = pb.ScopePath(org_id=org)
    return {
        "IngestEvent session_id": ("IngestEvent", with_bad_utf8(
            pb.IngestEventRequest(scope=scope, event_type="message", content=b"x"), 2)),
        "CreateSnapshot snapshot_name": ("CreateSnapshot", with_bad_utf8(
            pb.CreateSnapshotRequest(scope=scope, session_id="s"), 3)),
        "scope.org_id": ("Search", string_field(1, string_field(1, b"\xff" + SECRET.encode())) +
                         pb.SearchRequest(query="q").SerializeToString()),
        "Search random bytes": ("Search", random_body(pb.SearchRequest)),
        "IngestEvent random bytes": ("IngestEvent", random_body(pb.IngestEventRequest)),
        "AssembleContext random bytes": ("AssembleContext", random_body(pb.AssembleContextRequest)),
    }


def raw_call(channel: grpc.aio.Channel, path: str):
    """A call that sends and receives bytes as they are (identity serializers)."""
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


def assert_refused_without_echo(err: grpc.aio.AioRpcError, message_name: str) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert err.details() == f"the request body is not a valid {message_name}"
    info = error_info(err)
    assert info.reason == "REQUEST_UNDECODABLE"
    assert dict(info.metadata) == {"message": message_name}
    everything = err.details() + str(info) + repr(err.trailing_metadata())
    for leaked in (SECRET, "hunter2", "DecodeError", "UTF-8", "utf-8", "parsing", "Exception", "corrupt"):
        assert leaked not in everything, leaked


@pytest.mark.parametrize("case", ["IngestEvent session_id", "CreateSnapshot snapshot_name", "scope.org_id",
                                  "Search random bytes", "IngestEvent random bytes",
                                  "AssembleContext random bytes"])
@pytest.mark.parametrize("with_token", [False, True], ids=["no token", "token"])
async def test_undecodable_api_bodies_are_invalid_argument_and_echo_nothing(engine, case, with_token):
    org = unique("org")
    method, body = api_bodies(org)[case]
    request_type = getattr(pb, f"{method}Request")
    with pytest.raises(DecodeError):  # the body really does not parse
        request_type.FromString(body)
    metadata = engine.caller(org, clearance=4).metadata() if with_token else None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw_call(engine.channel, API + method)(body, metadata=metadata)
    assert_refused_without_echo(err.value, request_type.DESCRIPTOR.full_name)


async def test_an_undecodable_health_check_is_invalid_argument_and_echoes_nothing(engine):
    """Health is open (probes carry no token): its body still gets no parser text back."""
    from grpc_health.v1 import health_pb2

    body = string_field(1, b"\xff" + SECRET.encode())  # HealthCheckRequest.service, not UTF-8
    with pytest.raises(DecodeError):
        health_pb2.HealthCheckRequest.FromString(body)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw_call(engine.channel, "/grpc.health.v1.Health/Check")(body)
    assert_refused_without_echo(err.value, health_pb2.HealthCheckRequest.DESCRIPTOR.full_name)
    ok = await raw_call(engine.channel, "/grpc.health.v1.Health/Check")(
        health_pb2.HealthCheckRequest().SerializeToString())
    assert health_pb2.HealthCheckResponse.FromString(ok).status == health_pb2.HealthCheckResponse.SERVING


async def test_an_undecodable_body_writes_nothing(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    _, body = api_bodies(org)["IngestEvent session_id"]
    with pytest.raises(grpc.aio.AioRpcError):
        await raw_call(engine.channel, API + "IngestEvent")(body, metadata=caller.metadata())
    assert await archived_count(engine, org) == 0
    # The same channel and token still work: the refusal is the body's, not the connection's.
    reply = await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"x"))
    assert reply.version_hash == hashlib.sha256(b"x").hexdigest()


@pytest.fixture(params=[None, "detector-secret"], ids=["detector with its home's token", "detector with a set token"])
async def detector(request, tmp_path):
    """The real detector server over an empty models directory (no weights needed to parse)."""
    settings = Settings(home=tmp_path, detector_service_token=request.param)
    hosted, servicer = build_detector_server(settings, DetectorSettings(models_dir=tmp_path / "models"),
                                             address="127.0.0.1:0")
    await start_detector(hosted, servicer)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{hosted.port}")
    try:
        yield channel, detector_token(settings)
    finally:
        await channel.close()
        await hosted.stop(0)
        servicer.close()


@pytest.mark.parametrize("method, body", [
    ("Classify", with_bad_utf8(detector_pb2.ClassifyRequest(model_hint="prompt-guard-86m"), 1)),
    ("DetectPII", with_bad_utf8(detector_pb2.DetectPIIRequest(model_hint="gliner-small-v2.1"), 1)),
    ("Classify", random_body(detector_pb2.ClassifyRequest)),
    ("DetectPII", random_body(detector_pb2.DetectPIIRequest)),
], ids=["Classify bad UTF-8", "DetectPII bad UTF-8", "Classify random bytes", "DetectPII random bytes"])
@pytest.mark.parametrize("with_token", [False, True], ids=["no token", "token"])
async def test_undecodable_detector_bodies_are_invalid_argument_and_echo_nothing(detector, method, body,
                                                                                 with_token):
    channel, service_token = detector
    request_type = getattr(detector_pb2, f"{method}Request")
    with pytest.raises(DecodeError):
        request_type.FromString(body)
    metadata = (("authorization", f"Bearer {service_token or 'not-configured'}"),) if with_token else None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw_call(channel, DETECTOR + method)(body, metadata=metadata)
    assert_refused_without_echo(err.value, request_type.DESCRIPTOR.full_name)


# -- identifiers -------------------------------------------------------------------------------------

async def snapshot_names(engine, org: str) -> list[str]:
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        return [r["name"] for r in await conn.fetch("SELECT name FROM snapshots WHERE org_id = $1", org)]
    finally:
        await conn.close()


async def refused(call, field: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.value.code(), err.value.details())
    assert err.value.details().startswith(f"{field}: "), err.value.details()
    assert error_info(err.value).metadata["field"] == field
    return err.value


async def test_a_session_id_ending_in_newline_is_refused_and_writes_nothing(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    for session_id in ("abc\n", "abc\r\n", "abc\u2028", "abc\x00", "abc\u0085"):
        await refused(caller("IngestEvent", pb.IngestEventRequest(
            session_id=session_id, event_type="message", content=b"x")), "session_id")
        await refused(caller("PushContext", pb.PushContextRequest(
            session_id=session_id, memory_type="semantic", content=b"x")), "session_id")
    assert await archived_count(engine, org) == 0
    # "abc" itself is a session id, and its session was never created by the refused calls.
    await caller("IngestEvent", pb.IngestEventRequest(session_id="abc", event_type="message", content=b"x"))
    assert await archived_count(engine, org) == 1


async def test_a_snapshot_named_by_a_line_separator_is_refused_and_writes_nothing(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"x"))
    before = await archived_count(engine, org)
    for name in ("\u2028", "\u2029", "v1\n", "v1\t", "\x7f", "v1\u202e"):
        await refused(caller("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name=name)),
                      "snapshot_name")
        await refused(caller("PullContext", pb.PullContextRequest(agent_id="a", session_id="s",
                                                                  snapshot_name=name)), "snapshot_name")
    assert await archived_count(engine, org) == before
    assert await snapshot_names(engine, org) == []
    # A name with letters of other scripts and spaces is still a name.
    await caller("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s", snapshot_name="vor dem Umbau ü"))
    assert await snapshot_names(engine, org) == ["vor dem Umbau ü"]


async def test_every_id_field_is_checked_whole(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    first = await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"x"))
    before = await archived_count(engine, org)
    version = hashlib.sha256(b"anything").hexdigest()
    chunk = str(uuid.uuid4())
    cases = [
        (caller("RollbackContext", pb.RollbackContextRequest(session_id="s", target_version_hash=version + "\n")),
         "target_version_hash"),
        (caller("RollbackContext", pb.RollbackContextRequest(session_id="s\n", target_version_hash=version)),
         "session_id"),
        (caller("CreateSnapshot", pb.CreateSnapshotRequest(session_id="s\n", snapshot_name="v1")), "session_id"),
        (caller("PullContext", pb.PullContextRequest(agent_id="bot\n")), "agent_id"),
        (caller("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s\u2029")), "session_id"),
        (caller("AssembleContext", pb.AssembleContextRequest(session_id="s\n", token_budget=100)), "session_id"),
        (caller("AssembleContext", pb.AssembleContextRequest(
            session_id="s", token_budget=100, hints={"pinned_chunk_ids": "{" + chunk + "}"})),
         "hints.pinned_chunk_ids"),
        (caller("AssembleContext", pb.AssembleContextRequest(
            session_id="s", token_budget=100, hints={"must_include": f"event:urn:uuid:{first.event_id}"})),
         "hints.must_include"),
        (caller("AssembleContext", pb.AssembleContextRequest(session_id="s", token_budget=100,
                                                             model_id="gpt-4o\u2028")), "model_id"),
        (caller("Search", pb.SearchRequest(query="x", domain="billing\u2028x")), "domain"),
        (caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"y"),
                ("idempotency-key", "two words")), "idempotency-key"),
        (caller("PushContext", pb.PushContextRequest(session_id="s", memory_type="semantic", content=b"y"),
                ("idempotency-key", "two words")), "idempotency-key"),
    ]
    for call, field in cases:
        await refused(call, field)
    assert await archived_count(engine, org) == before
