"""The audit trail's publisher (streams/audit.py) against a fake log at its seam (`EventLog.publish`):
batches, the bounded queue, retries, what `record` never does (block, raise), what `stop` flushes,
and the health it reports; and the AuditAccessEvent it publishes as the writer reads it back
(streams/jobs.py, streams/agents/audit.py)."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import gc
import time
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from context_engine.errors import Unavailable
from context_engine.scope import Scope
from entrypoints.api.app import AUDIT_HEALTH_SERVICE, report_audit_health
from entrypoints.serving.server import NOT_SERVING, SERVING, build_server
from projections.projector.records import LogRecord
from streams.access_attempts import AccessAttempt, RecordedAudit
from streams.agents.audit import readable_rows
from streams.audit import AuditPublisher, follow_health
from streams.jobs import audit_access, audit_row, envelope, open_envelope, scope_path
from upsquad.context.v1 import stream_pb2

TOPIC = "ce.audit-access"
ACTOR = Scope("org-a", "sales", "emea", "bot-1")


class FakeLog:
    """`publish` as EventLog's: records what it took; while `down`, fails as the real one does
    when the broker is gone; while `held`, waits (the broker is slow)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes]] = []
        self.started = 0
        self.down = False
        self.released = asyncio.Event()
        self.released.set()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    async def publish(self, topic: str, key: str, value: bytes):
        self.started += 1
        if self.down:
            raise Unavailable("the event log is unavailable: KafkaConnectionError()", reason="LOG_UNAVAILABLE")
        await self.released.wait()
        self.published.append((topic, key, value))


async def eventually(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def attempt(n: int = 0, *, allowed: bool = True, actor: Scope = ACTOR) -> AccessAttempt:
    return AccessAttempt(actor, "chunk", f"00000000-0000-4000-8000-{n:012d}", "read", allowed,
                         share_id="" if not allowed else "11111111-1111-4111-8111-111111111111",
                         denial_reason="" if allowed else "sibling_scope")


def count(result: str) -> float:
    return REGISTRY.get_sample_value("context_engine_audit_events_total", {"result": result}) or 0.0


@pytest.fixture
async def publishers():
    """Publishers made by a test, stopped after it whatever happened."""
    made: list[AuditPublisher] = []

    def make(log: FakeLog, **options) -> AuditPublisher:
        made.append(AuditPublisher(log, TOPIC, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for p in made:
        await p.stop(timeout=1.0)


async def test_a_full_batch_goes_at_once_and_each_event_is_published_keyed_by_its_org(publishers):
    log = FakeLog()
    log.hold()
    publisher = publishers(log, batch_max=500)
    attempts = [attempt(n) for n in range(1200)]
    for a in attempts:
        publisher.record(a)
    assert publisher.pending == 1200
    publisher.start()
    await eventually(lambda: log.started == 500, "the first batch was not published")
    await asyncio.sleep(0)
    assert log.started == 500  # the next batch waits for this one
    log.release()
    await eventually(lambda: len(log.published) == 1200, "not every event was published")
    assert {(topic, key) for topic, key, _ in log.published} == {(TOPIC, "org-a")}
    rows = [audit_row(value) for _, _, value in log.published]
    assert [(r.resource_id, r.outcome, r.occurred_at) for r in rows] == [
        (a.resource_id, "allowed", a.occurred_at) for a in attempts]
    assert len({r.message_id for r in rows}) == 1200
    await eventually(lambda: publisher.pending == 0, "published events still count as pending")
    assert publisher.health().ok


async def test_a_batch_closes_when_full_or_when_its_window_ends(publishers):
    log = FakeLog()
    log.hold()
    full = publishers(log, batch_max=3, flush_within_s=60.0)
    full.start()
    full.record(attempt(1))
    await asyncio.sleep(0.01)
    assert log.started == 0  # the window is open
    full.record(attempt(2))
    full.record(attempt(3))
    await eventually(lambda: log.started == 3, "a full batch waited for its window")
    log.release()
    await eventually(lambda: len(log.published) == 3, "the batch was not published")

    timed = publishers(log, batch_max=500, flush_within_s=0.01)
    timed.start()
    timed.record(attempt(4))
    await eventually(lambda: len(log.published) == 4, "a lone event was not published after its window")


async def test_a_full_queue_drops_and_counts_and_health_says_so(publishers):
    log = FakeLog()
    publisher = publishers(log, max_pending=10, flush_within_s=0.01)
    dropped_before = count("dropped")
    for n in range(15):
        assert publisher.record(attempt(n)) is None
    assert publisher.pending == 10
    assert count("dropped") - dropped_before == 5
    health = publisher.health()
    assert not health.ok and health.dropped == 5 and "degraded, 5 dropped" in str(health)
    publisher.start()
    await eventually(lambda: len(log.published) == 10 and publisher.pending == 0,  # counted, too
                     "the queued events were not published")
    health = publisher.health()
    assert health.ok and health.published == 10 and "5 dropped earlier" in str(health)


async def test_failed_publishes_are_retried_and_counted_while_record_goes_on(publishers):
    log = FakeLog()
    log.down = True
    publisher = publishers(log, batch_max=3, flush_within_s=0.01, retry_max_s=0.02)
    failed_before, published_before = count("failed"), count("published")
    publisher.start()
    for n in range(3):
        publisher.record(attempt(n))
    await eventually(lambda: publisher.health().failed >= 6, "the failed batch was not retried")
    health = publisher.health()
    assert not health.ok and "the event log is unavailable" in health.last_error
    assert count("failed") - failed_before == health.failed
    for n in range(3, 100):  # callers are not held while the log is down
        publisher.record(attempt(n))
    assert publisher.pending == 100
    log.down = False
    # Until the batch's publishes have all returned (pending 0), the log may hold them all while the
    # publisher has not counted them yet.
    await eventually(lambda: len(log.published) == 100 and publisher.pending == 0,
                     "the events were not published once the log was back")
    assert publisher.health().ok and count("published") - published_before == 100
    assert sorted(audit_row(v).resource_id for _, _, v in log.published) == sorted(
        attempt(n).resource_id for n in range(100))


class FullMemory(collections.deque):
    def append(self, item) -> None:
        raise MemoryError


async def test_record_never_raises(publishers):
    log = FakeLog()
    publisher = publishers(log, flush_within_s=0.01)
    publisher._queue = FullMemory()  # whatever breaks inside, the caller goes on
    publisher.record(attempt(1))
    assert publisher.health().dropped == 1

    publisher = publishers(log, flush_within_s=0.01)
    publisher.start()
    publisher.record("not an attempt")  # type: ignore[arg-type]
    publisher.record(attempt(2))
    await eventually(lambda: len(log.published) == 1, "the good event was not published")
    health = publisher.health()
    assert health.dropped == 1 and "not encodable" in health.last_error


async def test_stop_publishes_what_is_pending_within_its_bound(publishers):
    log = FakeLog()
    publisher = publishers(log, flush_within_s=60.0)
    publisher.start()
    for n in range(50):
        publisher.record(attempt(n))
    await publisher.stop()
    assert len(log.published) == 50 and publisher.pending == 0 and publisher.health().dropped == 0
    publisher.record(attempt(51))  # after stop: dropped, counted
    assert publisher.health().dropped == 1 and len(log.published) == 50

    log.down = True
    stuck = publishers(log, flush_within_s=0.01, retry_max_s=0.02)
    stuck.start()
    for n in range(7):
        stuck.record(attempt(n))
    await stuck.stop(timeout=0.2)
    assert stuck.pending == 0 and stuck.health().dropped == 7 and len(log.published) == 50


async def test_follow_health_reports_each_change(publishers):
    log = FakeLog()
    log.down = True
    publisher = publishers(log, flush_within_s=0.01, retry_max_s=0.02)
    publisher.start()
    seen: list[bool] = []

    async def changed(health) -> None:
        seen.append(health.ok)

    follower = asyncio.create_task(follow_health(publisher, changed, interval=0.01))
    try:
        publisher.record(attempt(1))
        await eventually(lambda: seen == [False], "the degraded audit was not reported")
        log.down = False
        await eventually(lambda: seen == [False, True], "the recovery was not reported")
    finally:
        follower.cancel()
        await asyncio.wait({follower})


async def test_the_api_reports_a_broken_audit_stream_on_its_own_health_name_and_stays_serving(publishers):
    log = FakeLog()
    publisher = publishers(log, flush_within_s=0.01, retry_max_s=0.02)
    publisher.start()
    server = build_server("127.0.0.1:0", [])
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(channel)
    statuses: dict[str, int] = {}

    async def check(*names: str) -> dict[str, int]:
        for name in names:
            statuses[name] = (await health.Check(health_pb2.HealthCheckRequest(service=name))).status
        return statuses

    reporter = await report_audit_health(server, SimpleNamespace(audit=publisher))  # type: ignore[arg-type]
    try:
        assert reporter is not None
        assert await check("", AUDIT_HEALTH_SERVICE) == {"": SERVING, AUDIT_HEALTH_SERVICE: SERVING}
        log.down = True
        publisher.record(attempt(1))
        deadline = time.monotonic() + 30
        while (await check(AUDIT_HEALTH_SERVICE))[AUDIT_HEALTH_SERVICE] != NOT_SERVING:
            assert time.monotonic() < deadline, "the broken audit stream was not reported"
            await asyncio.sleep(0.05)
        assert (await check(""))[""] == SERVING  # every other call is still served
        log.down = False
        while (await check(AUDIT_HEALTH_SERVICE))[AUDIT_HEALTH_SERVICE] != SERVING:
            assert time.monotonic() < deadline, "the recovered audit stream was not reported"
            await asyncio.sleep(0.05)
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.wait({reporter})
        await channel.close()
        await server.stop(0)
        gc.unfreeze()


def test_recorded_audit_keeps_what_it_is_given():
    trail = RecordedAudit()
    trail.record(attempt(1))
    trail.record(attempt(2, allowed=False))
    assert [(a.resource_id, a.allowed) for a in trail.attempts] == [(attempt(1).resource_id, True),
                                                                    (attempt(2).resource_id, False)]


# -- the message on the stream, as the writer reads it ------------------------------------------


def test_an_attempt_travels_as_an_audit_access_event_in_its_envelope():
    at = dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
    denied = AccessAttempt(ACTOR, "snapshot", "snap-x", "read", False, denial_reason="revoked_grant",
                           share_id="22222222-2222-4222-8222-222222222222", occurred_at=at)
    job = audit_access(denied)
    env, event = open_envelope(job.value, stream_pb2.AuditAccessEvent)
    assert job.key == b"org-a" and env.stream == "audit:access" and env.message_id == job.message_id
    assert (env.scope.org_id, env.scope.agent_id) == ("org-a", "bot-1")
    assert (event.target_resource_type, event.target_resource_id, event.operation, event.outcome,
            event.denial_reason) == ("snapshot", "snap-x", "read", "denied", "revoked_grant")
    row = audit_row(job.value)
    assert (row.message_id, row.org_id, row.actor, row.resource_type, row.resource_id, row.operation,
            row.share_id, row.outcome, row.denial_reason, row.occurred_at) == (
        job.message_id, "org-a", ACTOR, "snapshot", "snap-x", "read", denied.share_id, "denied", "revoked_grant", at)


def test_the_writer_skips_what_no_publisher_writes():
    good = audit_access(attempt(1))
    odd_outcome = envelope("audit:access", ACTOR, stream_pb2.AuditAccessEvent(
        actor_scope=scope_path(ACTOR), target_resource_id="x", outcome="maybe"))
    other_org = envelope("audit:access", Scope("org-b"), stream_pb2.AuditAccessEvent(
        actor_scope=scope_path(ACTOR), target_resource_id="x", outcome="allowed"))

    rows = readable_rows([LogRecord(TOPIC, 0, n, value) for n, value in enumerate(
        [b"\xff not protobuf", odd_outcome.value, other_org.value, good.value])])
    assert [r.message_id for r in rows] == [good.message_id]
