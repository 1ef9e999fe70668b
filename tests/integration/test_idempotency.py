"""Retries a client can rely on (docs/architecture.md, "Retries and idempotency"), through gRPC
with real tokens, broker, worker and PostgreSQL.

NOT_DURABLE_YET is forced deterministically: a second API on the engine's own Deps whose
acknowledgement timeout is zero appends every write and answers NOT_DURABLE_YET at once, and the
worker is paused (SIGSTOP) where a test needs the retry to reach the log before the first write
is projected."""

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import os
import signal
import uuid

import asyncpg
import grpc
import pytest

from context_engine.events import EVENT_INGESTED, Event, SessionRef, session_aggregate
from context_engine.scope import Scope
from entrypoints.api.app import build_api_server
from entrypoints.serving.status import error_info
from projections.projector.outcome import ProjectionOutcome
from streams.acknowledgement import ArchiveWatch, EventRejected
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

KEY = "idempotency-key"
SETTLE_S = 60  # a hang guard for waiting on the worker, never a latency assertion


@contextlib.asynccontextmanager
async def api_with_ack_timeout(engine, seconds: float):
    """Another in-process API on the engine's Deps (same producer, archive watch and pool), with
    its own `ack_timeout_seconds`; yields a function that points a Caller at it."""
    settings = engine.settings.model_copy(update={"ack_timeout_seconds": seconds})
    server = build_api_server(settings, dataclasses.replace(engine.deps, settings=settings), address="127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield lambda caller: dataclasses.replace(caller, stub=context_pb2_grpc.ContextEngineStub(channel))
    finally:
        await channel.close()
        await server.stop(0)


@contextlib.asynccontextmanager
async def apis(engine):
    """(unacknowledging, patient): every write through the first is answered NOT_DURABLE_YET right
    after its append; the second waits for the worker for as long as a test may take."""
    async with api_with_ack_timeout(engine, 0.0) as unacknowledging, \
            api_with_ack_timeout(engine, SETTLE_S) as patient:
        yield unacknowledging, patient


@contextlib.contextmanager
def worker_paused(engine):
    pid = engine.worker.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def expect_error(code, coro, reason):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro
    assert err.value.code() == code, err.value.details()
    info = error_info(err.value)
    assert info.reason == reason, err.value.details()
    return err.value, dict(info.metadata)


async def not_durable_yet(coro):
    return await expect_error(grpc.StatusCode.UNAVAILABLE, coro, "NOT_DURABLE_YET")


async def query(engine, sql, *args):
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def counts(engine, org) -> tuple[int, int, int]:
    """(events the org's commands archived, ingested events applied, memory versions applied)."""
    rows = await query(engine, """
        SELECT (SELECT count(*) FROM event_archive WHERE org_id = $1
                AND type NOT IN ('embedding.recorded', 'memory.scrubbed')) AS archived,
               (SELECT count(*) FROM session_events WHERE org_id = $1) AS events,
               (SELECT count(*) FROM memory_versions WHERE org_id = $1) AS memories""", org)
    return rows[0]["archived"], rows[0]["events"], rows[0]["memories"]


async def until_archived(engine, org, event_ids) -> None:
    """Wait until the worker has archived (and projected) all of these events."""
    wanted = {str(e) for e in event_ids}
    async with asyncio.timeout(SETTLE_S):
        while True:
            rows = await query(engine, "SELECT event_id::text FROM event_archive WHERE org_id = $1 "
                                       "AND event_id = ANY($2::uuid[])", org, list(wanted))
            if {r["event_id"] for r in rows} == wanted:
                return
            await asyncio.sleep(0.05)


async def applied_events(engine, org):
    return [r["event_id"] for r in await query(
        engine, "SELECT event_id::text FROM session_events WHERE org_id = $1", org)]


def ingest(content: bytes = b"the answer is 42", event_type: str = "tool_output", metadata=None):
    return pb.IngestEventRequest(session_id="s1", event_type=event_type, content=content,
                                 metadata=metadata or {"tool": "calc"})


# -- a key reused with other content ------------------------------------------------------------


async def test_a_key_reused_with_other_content_is_refused_and_writes_nothing(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    first = await caller("IngestEvent", ingest(), (KEY, "k-1"))
    before = await counts(engine, org)
    for other in (ingest(content=b"the answer is 43"), ingest(event_type="message"),
                  ingest(metadata={"tool": "abacus"})):
        err, meta = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, caller("IngestEvent", other, (KEY, "k-1")),
                                       "IDEMPOTENCY_KEY_REUSED")
        assert "'k-1'" in err.details()
        assert meta["idempotency_key"] == "k-1" and meta["event_id"] == first.event_id
    assert await counts(engine, org) == before == (1, 1, 0)
    again = await caller("IngestEvent", ingest(), (KEY, "k-1"))
    assert (again.event_id, again.version_hash, again.token_count) == \
        (first.event_id, first.version_hash, first.token_count)
    assert await counts(engine, org) == before


async def test_a_key_reused_with_other_content_is_refused_when_the_projector_settles_the_race(engine):
    """The second request finds no event with its key before it appends (the first is not
    projected yet); the projector gives the key to the first (IDEMPOTENCY_KEY_TAKEN), and the
    second handler reads the first back and refuses."""
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    async with apis(engine) as (unacknowledging, patient):
        with worker_paused(engine):
            _, meta = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest(), (KEY, "k-race")))
            second = asyncio.create_task(patient(caller)("IngestEvent", ingest(content=b"other"), (KEY, "k-race")))
            async with asyncio.timeout(SETTLE_S):
                while not engine.deps.watch.waiting():  # past its lookup, appending: the worker may go on
                    await asyncio.sleep(0.01)
        err, refused = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, second, "IDEMPOTENCY_KEY_REUSED")
    assert "'k-race'" in err.details()
    assert refused["event_id"] == meta["event_id"]
    assert await applied_events(engine, org) == [meta["event_id"]]
    archived, _, _ = await counts(engine, org)
    assert archived == 2  # the second is in the log and the archive, applied nowhere


# -- NOT_DURABLE_YET and the retry it asks for -------------------------------------------------


@pytest.mark.parametrize("client_key", ["", "client-key-7"])
async def test_not_durable_yet_names_the_event_and_the_key_that_retries_it(engine, client_key):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    sent = ((KEY, client_key),) if client_key else ()
    async with apis(engine) as (unacknowledging, _):
        err, meta = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest(), *sent))
    event_id, key = meta["event_id"], meta["idempotency_key"]
    assert uuid.UUID(event_id)
    assert key == (client_key or f"ce-event:{event_id}")
    assert event_id in err.details()
    assert f"retry with idempotency-key {key}: a retry returns this event if it was applied, and " \
           "writes it once otherwise" in err.details()


@pytest.mark.parametrize("client_key", ["", "client-key-8"])
async def test_a_retry_after_the_first_was_applied_late_returns_it(engine, client_key):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    sent = ((KEY, client_key),) if client_key else ()
    async with apis(engine) as (unacknowledging, _):
        _, meta = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest(), *sent))
    await until_archived(engine, org, [meta["event_id"]])  # applied although never acknowledged
    reply = await caller("IngestEvent", ingest(), (KEY, meta["idempotency_key"]))
    assert reply.event_id == meta["event_id"]
    assert reply.version_hash == hashlib.sha256(ingest().content).hexdigest()
    assert await counts(engine, org) == (1, 1, 0)


@pytest.mark.parametrize("client_key", ["", "client-key-9"])
async def test_a_retry_before_the_first_was_applied_writes_one_event(engine, client_key):
    """First and retry both reach the log before the worker projects either."""
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    sent = ((KEY, client_key),) if client_key else ()
    async with apis(engine) as (unacknowledging, patient):
        with worker_paused(engine):
            _, first = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest(), *sent))
            _, retry = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest(),
                                                                     (KEY, first["idempotency_key"])))
        assert retry["idempotency_key"] == first["idempotency_key"]
        if not client_key:  # the server's key names the event: the retry is the same event id
            assert retry["event_id"] == first["event_id"]
        await until_archived(engine, org, {first["event_id"], retry["event_id"]})
        reply = await patient(caller)("IngestEvent", ingest(), (KEY, first["idempotency_key"]))
    assert reply.event_id == first["event_id"]
    assert await applied_events(engine, org) == [first["event_id"]]
    archived, events, _ = await counts(engine, org)
    assert events == 1
    if not client_key:
        assert archived == 1  # the archive keeps one event per id


async def test_a_server_key_retry_with_other_content_is_refused(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    async with apis(engine) as (unacknowledging, _):
        _, meta = await not_durable_yet(unacknowledging(caller)("IngestEvent", ingest()))
    await until_archived(engine, org, [meta["event_id"]])
    before = await counts(engine, org)
    err, refused = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, caller(
        "IngestEvent", ingest(content=b"something else"), (KEY, meta["idempotency_key"])), "IDEMPOTENCY_KEY_REUSED")
    assert meta["idempotency_key"] in err.details()
    assert refused["idempotency_key"] == meta["idempotency_key"]
    other_session = pb.IngestEventRequest(session_id="s2", event_type="tool_output", content=ingest().content,
                                          metadata={"tool": "calc"})
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, caller(
        "IngestEvent", other_session, (KEY, meta["idempotency_key"])), "IDEMPOTENCY_KEY_REUSED")
    assert await counts(engine, org) == before == (1, 1, 0)


@pytest.mark.parametrize("key", ["ce-event:mine", "ce-event:", "ce-event:0B5E7C9A-3D2F-4E61-8A7B-9C0D1E2F3A4B",
                                 "x" * 129])
async def test_keys_in_the_servers_namespace_are_refused_naming_the_header(engine, key):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    err, meta = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller("IngestEvent", ingest(), (KEY, key)),
                                   "INVALID_ARGUMENT")
    assert "idempotency-key" in err.details()
    assert meta["field"] == "idempotency-key"
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller("PushContext", pb.PushContextRequest(
        session_id="s1", memory_type="semantic", content=b"x"), (KEY, key)), "INVALID_ARGUMENT")
    assert await counts(engine, org) == (0, 0, 0)


# -- PushContext, CreateSnapshot, RollbackContext ----------------------------------------------


def push(content: bytes = b'{"fact": 1}'):
    return pb.PushContextRequest(session_id="s1", memory_type="semantic", content=content, metadata={"src": "a"})


async def test_push_not_durable_yet_gives_a_key_and_a_retry_writes_one_version(engine):
    org = unique("org")
    agent = engine.caller(org, "p", "t", "bot", clearance=1)
    async with apis(engine) as (unacknowledging, patient):
        with worker_paused(engine):
            err, first = await not_durable_yet(unacknowledging(agent)("PushContext", push()))
            _, retry = await not_durable_yet(unacknowledging(agent)("PushContext", push(),
                                                                    (KEY, first["idempotency_key"])))
        assert first["idempotency_key"] == f"ce-event:{first['event_id']}"
        assert f"retry with idempotency-key {first['idempotency_key']}: a retry returns this memory version " \
               "if it was applied, and writes it once otherwise" in err.details()
        assert retry["event_id"] == first["event_id"]
        await until_archived(engine, org, [first["event_id"]])
        reply = await patient(agent)("PushContext", push(), (KEY, first["idempotency_key"]))
    created = await query(engine, "SELECT created_at FROM memory_versions WHERE org_id = $1", org)
    assert [r["created_at"] for r in created] == [reply.created_at.ToDatetime(dt.UTC)]
    assert reply.version_hash == hashlib.sha256(push().content).hexdigest()
    assert await counts(engine, org) == (1, 0, 1)


async def test_push_with_a_client_key_is_written_once_and_other_content_is_refused(engine):
    org = unique("org")
    agent = engine.caller(org, "p", "t", "bot", clearance=1)
    first = await agent("PushContext", push(), (KEY, "push-1"))
    again = await agent("PushContext", push(), (KEY, "push-1"))
    assert (again.version_hash, again.created_at) == (first.version_hash, first.created_at)
    err, meta = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, agent(
        "PushContext", push(b'{"fact": 2}'), (KEY, "push-1")), "IDEMPOTENCY_KEY_REUSED")
    assert "'push-1'" in err.details() and meta["idempotency_key"] == "push-1"
    other = await agent("PushContext", push(), (KEY, "push-2"))  # a new key is a new version
    assert other.created_at != first.created_at
    assert await counts(engine, org) == (2, 0, 2)


async def test_snapshot_not_durable_yet_says_a_retry_answers_already_exists_once_it_landed(engine):
    org = unique("org")
    lead = engine.caller(org, clearance=3)
    await lead("IngestEvent", ingest())
    request = pb.CreateSnapshotRequest(session_id="s1", snapshot_name="v1")
    async with apis(engine) as (unacknowledging, _):
        err, meta = await not_durable_yet(unacknowledging(lead)("CreateSnapshot", request))
    assert meta["snapshot_name"] == "v1" and uuid.UUID(meta["snapshot_id"])
    assert "ALREADY_EXISTS (SNAPSHOT_NAME_TAKEN) if it was" in err.details()
    await until_archived(engine, org, [meta["event_id"]])
    await expect_error(grpc.StatusCode.ALREADY_EXISTS, lead("CreateSnapshot", request), "SNAPSHOT_NAME_TAKEN")
    rows = await query(engine, "SELECT snapshot_id::text FROM snapshots WHERE org_id = $1", org)
    assert [r["snapshot_id"] for r in rows] == [meta["snapshot_id"]]


async def test_rollback_not_durable_yet_says_what_a_retry_does(engine):
    org = unique("org")
    lead = engine.caller(org, clearance=3)
    one = await lead("IngestEvent", ingest(b"one"))
    await lead("IngestEvent", ingest(b"two"))
    target = (await query(engine, "SELECT version FROM session_items WHERE org_id = $1 AND event_id = $2",
                          org, uuid.UUID(one.event_id)))[0]["version"]
    request = pb.RollbackContextRequest(session_id="s1", target_version_hash=target)
    async with apis(engine) as (unacknowledging, _):
        err, meta = await not_durable_yet(unacknowledging(lead)("RollbackContext", request))
    assert meta["target_version_hash"] == target
    assert f"a retry rolls the session back to {target} again" in err.details()
    await until_archived(engine, org, [meta["event_id"]])
    reply = await lead("RollbackContext", request)  # the retry: same state, one more rollback recorded
    assert reply.restored_version_hash == target
    rows = await query(engine, "SELECT version FROM sessions WHERE org_id = $1", org)
    assert [r["version"] for r in rows] == [target]


# -- an event the projector sets aside ----------------------------------------------------------


def malformed_ingest(org: str) -> Event:
    """Past the handlers' validation (content_b64 that is not base64), as only a bug could build it."""
    return Event(EVENT_INGESTED, Scope(org), session_aggregate(org, "s1"), "test", {
        "session_id": "s1", "event_type": "message", "content_b64": "not base64!", "metadata": {},
        "content_sha256": hashlib.sha256(b"").hexdigest(), "token_count": 0, "idempotency_key": ""})


async def test_an_event_the_projector_sets_aside_is_a_definite_answer(engine):
    org = unique("org")
    event = malformed_ingest(org)
    with pytest.raises(EventRejected) as err:
        await engine.deps.append(event, SessionRef(org, "s1"))
    assert err.value.reason == "EVENT_REJECTED"
    assert err.value.message == f"the event could not be applied: it was set aside (event {event.event_id})"
    assert err.value.metadata["event_id"] == event.event_id
    assert await counts(engine, org) == (0, 0, 0)


async def test_the_watch_learns_the_outcome_without_a_notification(engine):
    """A watch that never listens (as after a missed notification) asks the database: archived,
    or set aside."""
    org = unique("org")
    deaf = ArchiveWatch(engine.settings.database_url, engine.deps.pool, poll_interval=0.01)
    rejected, fine = malformed_ingest(org), Event(EVENT_INGESTED, Scope(org), session_aggregate(org, "s1"), "test", {
        "session_id": "s1", "event_type": "message", "content_b64": "b2s=", "metadata": {},
        "content_sha256": hashlib.sha256(b"ok").hexdigest(), "token_count": 1, "idempotency_key": ""})
    for event, outcome in ((rejected, ProjectionOutcome.REJECTED), (fine, None)):
        position = await engine.deps.log.append(event)
        assert await deaf.wait(event.event_id, org, position, timeout=SETTLE_S) == outcome
    assert await applied_events(engine, org) == [fine.event_id]
