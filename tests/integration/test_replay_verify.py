"""Determinism of the version chain, replay into an empty database, and verify.

The chain's test replays the shared deployment's log, every event the suite wrote before it; the
tests of what verify names run on a small deployment of this module's own (`own`), since verify
replays the whole log each time it runs."""

import asyncio
import base64
import hashlib

import asyncpg
import pytest

from context_engine import hashing
from context_engine.events import EVENT_INGESTED, Event, canonical_bytes, session_aggregate
from context_engine.scope import Scope
from inference.tokens import count_tokens
from projections.projector.records import LogRecord
from streams.record_auth import partition_for, signer_from_settings
from streams.replay import compare, read_archive, replay, verify
from streams.topics import LogTopics
from tests.fixtures.calls import wait_embedded
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import running_engine, unique
from tests.fixtures.replay import log_of
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

SESSIONS, EVENTS = 10, 1000

READ_MODELS = ("event_archive", "sessions", "session_items", "session_versions", "session_events",
               "memory_versions", "snapshots", "chunks", "chunk_terms", "corpus_stats")


def chain_input(session_id: str, content: bytes) -> str:
    payload = {"session_id": session_id, "event_type": "message",
               "content_b64": base64.b64encode(content).decode(), "metadata": {"n": content.decode()[-4:]},
               "content_sha256": hashlib.sha256(content).hexdigest(),
               "token_count": count_tokens(content.decode()), "idempotency_key": ""}
    return hashlib.sha256(canonical_bytes(payload)).hexdigest()


async def ingest_workload(engine, org: str) -> dict[str, list[str]]:
    """1,000 events over 10 sessions from 10 concurrent writers; returns contents per session."""
    caller = engine.caller(org, clearance=1)
    contents = {f"s{i}": [f"session s{i} turn {n:04d}".encode() for n in range(EVENTS // SESSIONS)]
                for i in range(SESSIONS)}

    async def writer(session_id):
        for content in contents[session_id]:
            await caller("IngestEvent", pb.IngestEventRequest(
                session_id=session_id, event_type="message", content=content,
                metadata={"n": content.decode()[-4:]}))

    await asyncio.gather(*(writer(s) for s in contents))
    await settled(engine, org)
    return contents


async def settled(engine, org: str, quiet_s: float = 0.5) -> None:
    """Every chunk of `org` has its vector and no event has been archived for `quiet_s`: the
    embedding pipeline runs below the projectors' priority, so its `embedding.recorded` events can
    trail the acknowledged ones, and a replay must read a log that no longer grows."""
    await wait_embedded(engine, org)
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        count = await conn.fetchval("SELECT count(*) FROM event_archive")
        while True:
            await asyncio.sleep(quiet_s)
            count, before = await conn.fetchval("SELECT count(*) FROM event_archive"), count
            if count == before:
                return
    finally:
        await conn.close()


async def versions(url: str, org: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        return {r["session_id"]: r["version"] for r in await conn.fetch(
            "SELECT session_id, version FROM sessions WHERE org_id = $1", org)}
    finally:
        await conn.close()


def key_of_partition(settings, topic: str, partition: int) -> bytes:
    """A record key the default partitioner maps to `partition`: the verifier refuses a record
    anywhere else (streams/record_auth.py)."""
    count = LogTopics.from_settings(settings).partitions[topic]
    return next(k for i in range(10_000) if partition_for(k := f"garbage/{i}".encode(), count) == partition)


async def row_counts(url: str, org: str) -> dict[str, int]:
    """The org's rows: the shared deployment's worker is still embedding other tests' chunks."""
    conn = await asyncpg.connect(url)
    try:
        return {t: await conn.fetchval(f"SELECT count(*) FROM {t} WHERE org_id = $1", org) for t in READ_MODELS}
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def own(postgres_url, kafka_bootstrap, tmp_path_factory):
    """A deployment with its own database and topics, for verify's tests."""
    async with running_engine(postgres_url, kafka_bootstrap, tmp_path_factory.mktemp("verify-home")) as running:
        yield running


async def test_chain_is_a_pure_function_of_the_log_and_replay_reproduces_it(engine):
    org = unique("org")
    contents = await ingest_workload(engine, org)

    # Same inputs, same hashes: computed here independently of the engine, from the contents alone.
    expected = {s: hashing.chain(f"{org}/{s}", [chain_input(s, c) for c in cs])[-1] for s, cs in contents.items()}
    assert await versions(engine.settings.database_url, org) == expected

    topic = LogTopics.from_settings(engine.settings).events
    async with fresh_database(engine.settings.database_url, "ce_test_replay") as target:
        report = await replay(log_of(engine.settings, topic), target)
        assert report.events >= EVENTS
        assert await versions(target, org) == expected
        assert await row_counts(target, org) == await row_counts(engine.settings.database_url, org)
        assert await compare(engine.settings.database_url, target) == []
    # The archive's copy of the log rebuilds the same state.
    async with fresh_database(engine.settings.database_url, "ce_test_replay") as target:
        await replay(read_archive(engine.settings.database_url, topic), target)
        assert await compare(engine.settings.database_url, target) == []


async def test_verify_reports_nothing_then_names_a_tampered_event(own):
    org = unique("org")
    caller = own.caller(org, clearance=3)
    for n in range(5):
        await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message",
                                                          content=f"turn {n}".encode()))
    settings = own.settings
    topic = LogTopics.from_settings(settings).events
    _, differences = await verify(log_of(settings, topic), settings.database_url)
    assert differences == []

    conn = await asyncpg.connect(settings.database_url)
    try:
        victim = await conn.fetchrow("SELECT event_id, version FROM session_items WHERE org_id = $1 AND seq = 3", org)
        await conn.execute("UPDATE session_items SET version = $1 WHERE event_id = $2", "0" * 64, victim["event_id"])
        try:
            report, differences = await verify(log_of(settings, topic), settings.database_url)
        finally:
            await conn.execute("UPDATE session_items SET version = $1 WHERE event_id = $2",
                               victim["version"], victim["event_id"])
    finally:
        await conn.close()
    assert [d.event_id for d in differences] == [str(victim["event_id"])]
    assert "0" * 64 in str(differences[0]) and victim["version"] in str(differences[0])
    assert report.events > 0


async def test_verify_names_an_event_on_the_log_the_read_models_never_received(own):
    """A record the projector set aside is accounted for, on every source; one that is on the
    log and in neither the archive nor rejected_events is a difference, named by its event id."""
    from aiokafka import AIOKafkaProducer

    org = unique("org")
    caller = own.caller(org, clearance=3)
    await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"kept"))
    settings = own.settings
    topic = LogTopics.from_settings(settings).events
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:  # a trusted writer's garbage (signed, on its key's partition): set aside, not refused
        garbage, key = b"\x00 garbage on the log \xff", key_of_partition(settings, topic, 0)
        await producer.send_and_wait(topic, garbage, key=key, partition=0,
                                     headers=signer_from_settings(settings).headers(topic, key, garbage))
    finally:
        await producer.stop()
    await settled(own, org)
    conn = await asyncpg.connect(settings.database_url)
    try:  # set aside (a row to account for), not refused unread
        assert await conn.fetchval("SELECT count(*) FROM rejected_events WHERE topic = $1 AND raw = $2",
                                   topic, garbage) == 1
    finally:
        await conn.close()
    for name, records in (("log", lambda: log_of(settings, topic)),
                          ("archive", lambda: read_archive(settings.database_url, topic))):
        _, differences = await verify(records(), settings.database_url, log=(log_of(settings, topic), topic))
        assert differences == [], name

    # An event on the log that never reached the archive (as when a projector dropped a batch).
    lost = Event(EVENT_INGESTED, Scope(org), session_aggregate(org, "s"), "user", {"session_id": "s"})

    async def log_with_lost_event():
        async for batch in log_of(settings, topic):
            yield batch
        yield [LogRecord(topic, 0, 10**9, lost.to_bytes())]

    _, differences = await verify(read_archive(settings.database_url, topic), settings.database_url,
                                  log=(log_with_lost_event(), topic), in_flight_grace_s=1.0)
    assert [(d.event_id, d.where) for d in differences] == [(lost.event_id, f"log record {topic}[0]@{10**9}")]


@pytest.mark.parametrize("source", ["log", "archive"])
async def test_the_verify_command_reads_a_log_with_set_aside_records(own, source):
    from aiokafka import AIOKafkaProducer

    settings = own.settings
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    topic = LogTopics.from_settings(settings).events
    await producer.start()
    try:  # signed, on its key's partition: a trusted writer's record that does not decode is set aside
        key = key_of_partition(settings, topic, 1)
        await producer.send_and_wait(topic, b"{not json", key=key, partition=1,
                                     headers=signer_from_settings(settings).headers(topic, key, b"{not json"))
    finally:
        await producer.stop()
    org = unique("org")
    await own.caller(org, clearance=1)("IngestEvent", pb.IngestEventRequest(
        session_id="s", event_type="message", content=b"after the garbage"))
    await settled(own, org)
    code, out = await own.cli("verify", "--source", source)
    assert code == 0, out
    assert "0 difference(s)" in out and "Traceback" not in out
