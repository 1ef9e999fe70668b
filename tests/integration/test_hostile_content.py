"""Hostile input on the write path, through gRPC, the real broker, worker and PostgreSQL: every
content up to MAX_CONTENT_BYTES is accepted end to end whatever its bytes, one byte more is
refused before anything is written, and a record nobody can apply takes no other tenant's event
with it."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from context_engine.events import EVENT_INGESTED, Event, session_aggregate
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from context_engine.validation import MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE
from entrypoints.serving.status import error_info
from projections.projector import deferred_indexing
from streams.record_auth import partition_for, signer_from_settings
from streams.topics import LogTopics
from tests.fixtures.calls import archived_count, expect_error
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration


def contents_at(limit: int) -> dict[str, bytes]:
    """Contents of exactly `limit` bytes. The text ones repeat one pattern, so that their many
    chunks share a few content hashes and the suite embeds them once (the splitting of every kind
    of text is unit-tested in tests/unit/test_chunking.py)."""
    return {
        "no spaces": b"x" * limit,
        "NUL bytes": (b"abc\x00def " * (limit // 8 + 1))[:limit],
        "binary": bytes(range(256)) * (limit // 256) + bytes(limit % 256),
        "multi-byte": ("€" * (limit // 3)).encode() + b"." * (limit % 3),
    }


async def stored(engine, org: str, session_id: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            rows = await conn.fetch("SELECT length(content) AS n, encode(sha256(content), 'hex') AS h "
                                    "FROM session_events WHERE org_id = $1 AND session_id = $2 ORDER BY seq",
                                    org, session_id)
            return [(r["n"], r["h"]) for r in rows]
    finally:
        await conn.close()


async def indexed_chunks(engine, org: str) -> dict[str, bool]:
    """Once the org's indexing requests are done: per content kind (in ingest order), whether its
    event has chunks."""
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while await deferred_indexing.pending_count(conn, [org]) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert await deferred_indexing.pending_count(conn, [org]) == 0
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            rows = await conn.fetch(
                "SELECT e.seq, count(c.chunk_id) AS n, coalesce(max(c.token_count), 0) AS most, "
                "       bool_or(strpos(c.content, chr(1)) > 0) AS controls "
                "FROM session_events e LEFT JOIN chunks c ON c.org_id = e.org_id AND c.source_event_id = e.event_id "
                "WHERE e.org_id = $1 GROUP BY e.seq ORDER BY e.seq", org)
    finally:
        await conn.close()
    assert all(r["most"] <= 256 and not r["controls"] for r in rows)
    return dict(zip(contents_at(1), (r["n"] > 0 for r in rows)))


async def test_every_content_up_to_the_limit_is_accepted_and_one_byte_more_is_refused(engine):
    limit = engine.settings.max_content_bytes
    org = unique("big")
    caller = engine.caller(org, clearance=1)
    contents = contents_at(limit)
    for kind, content in contents.items():
        reply = await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message",
                                                                  content=content))
        assert reply.version_hash == sha256_hex(content), kind
    push = await caller("PushContext", pb.PushContextRequest(session_id="s", memory_type="episodic",
                                                             content=contents["binary"]))
    assert push.version_hash == sha256_hex(contents["binary"])
    assert await stored(engine, org, "s") == [(limit, sha256_hex(c)) for c in contents.values()]
    # Their chunks come after the acknowledgement (projections/projector/deferred_indexing.py): the text ones
    # have chunks, within the token limit, without a NUL; the binary one has none.
    assert await indexed_chunks(engine, org) == {"no spaces": True, "NUL bytes": True, "binary": False,
                                                 "multi-byte": True}

    before = await archived_count(engine, org)
    for method, request in (
            ("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"y" * (limit + 1))),
            ("PushContext", pb.PushContextRequest(session_id="s", memory_type="episodic", content=b"y" * (limit + 1)))):
        await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller(method, request), field="content",
                           reason="CONTENT_TOO_LARGE")
    assert await archived_count(engine, org) == before


async def test_the_largest_content_with_the_largest_metadata_fits_the_log(engine):
    """Controls in metadata values are escaped (6 bytes each) in the event's JSON: the worst case
    the limits allow is what the producer and the topics must take."""
    org = unique("widest")
    caller = engine.caller(org, clearance=1)
    metadata = {f"{i:03d}".ljust(MAX_METADATA_KEY, "k"): "\x01" * MAX_METADATA_VALUE
                for i in range(MAX_METADATA_ENTRIES)}
    content = bytes(range(256)) * (engine.settings.max_content_bytes // 256)
    reply = await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="tool_output",
                                                              content=content, metadata=metadata))
    assert reply.version_hash == sha256_hex(content)
    assert await stored(engine, org, "s") == [(len(content), sha256_hex(content))]


@pytest.mark.parametrize("metadata, field", [
    ({"note": "a\x00b"}, "metadata[note]"),
    ({"k\x00ey": "value"}, "metadata"),
    ({"line\u2028break": "value"}, "metadata"),
    ({"tab\tkey": "value"}, "metadata"),
    ({"domain": "d" * 129}, "metadata[domain]"),  # a key of the statistics' index rows
    ({"domain": "line\nbreak"}, "metadata[domain]"),
])
async def test_metadata_postgresql_cannot_hold_is_refused_before_the_append(engine, metadata, field):
    org = unique("meta")
    caller = engine.caller(org, clearance=1)
    for method, request in (
            ("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"x",
                                                  metadata=metadata)),
            ("PushContext", pb.PushContextRequest(session_id="s", memory_type="semantic", content=b"x",
                                                  metadata=metadata))):
        err = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller(method, request), field=field)
        assert "\x00" not in err.details()
    assert await archived_count(engine, org) == 0


async def test_a_record_nobody_can_apply_takes_no_other_tenants_event_with_it(engine):
    """Records a trusted writer signed (a bug, a writer of another version) appended straight to the
    events topic, among a victim org's writes: each is set aside, and every victim write is
    acknowledged and projected. (Unsigned ones are refused unread: tests/security/test_host_log.py.)"""
    victim, attacker = unique("victim"), unique("attacker")
    caller = engine.caller(victim, clearance=1)
    topic = LogTopics.from_settings(engine.settings).events
    forged = Event(EVENT_INGESTED, Scope(attacker), session_aggregate(attacker, "s"), "intruder",
                   {"session_id": "s", "event_type": "message", "content_b64": "", "metadata": {"k": "\x00"},
                    "content_sha256": sha256_hex(b""), "token_count": 0, "idempotency_key": ""})
    poison = [b"not an event", b"\xff\xfe" * 100, orjson.dumps({"type": EVENT_INGESTED}), forged.to_bytes()]
    signer = signer_from_settings(engine.settings)
    producer = AIOKafkaProducer(bootstrap_servers=engine.settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        async def victim_writes(n: int) -> list[str]:
            return [(await caller("IngestEvent", pb.IngestEventRequest(
                session_id=f"v{i % 4}", event_type="message", content=f"victim turn {i}".encode()))).version_hash
                for i in range(n)]

        # A key of each partition: a trusted writer's record is on its key's partition (unkeyed or
        # elsewhere, it is refused unread, not set aside: streams/record_auth.py).
        partitions, keys = LogTopics.from_settings(engine.settings).partitions[topic], {}
        for i in range(1000):
            keys.setdefault(partition_for(f"poison/{i}".encode(), partitions), f"poison/{i}".encode())

        async def attack() -> None:
            for _round in range(5):
                for p, key in sorted(keys.items()):
                    for raw in poison:
                        await producer.send(topic, raw, key=key, partition=p, headers=signer.headers(topic, key, raw))
                await asyncio.sleep(0)
            await producer.flush()

        acknowledged, _ = await asyncio.gather(victim_writes(40), attack())
    finally:
        await producer.stop()
    assert len(acknowledged) == 40
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM session_events WHERE org_id = $1", victim) == 40
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the last poison records may still be on their way through the projector
            rejected = {bytes(r["raw"]) for r in await conn.fetch(
                "SELECT raw FROM rejected_events WHERE raw = ANY($1::bytea[])", poison)}
            if rejected == set(poison) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert await conn.fetchval("SELECT count(*) FROM event_archive WHERE org_id = $1", attacker) == 0
    finally:
        await conn.close()
    assert rejected == set(poison)


async def test_an_org_writing_megabytes_as_fast_as_it_can_is_held_to_its_budget(engine):
    """The shared engine's default budget (1 MiB/s, bursts of 8 MiB): a tenant writing 1 MiB
    contents back to back is refused with RESOURCE_EXHAUSTED and when to retry; what is refused
    writes nothing, and another tenant's writes go on meanwhile."""
    attacker, bystander = unique("flood"), unique("bystander")
    flood, other = engine.caller(attacker, clearance=1), engine.caller(bystander, clearance=1)
    content = bytes(range(256)) * (engine.settings.max_content_bytes // 256)
    accepted, refusal = 0, None
    for _ in range(4 * engine.settings.org_write_burst_bytes // len(content)):
        try:
            await flood("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=content))
            accepted += 1
        except grpc.aio.AioRpcError as err:
            refusal = err
            break
        await other("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message", content=b"still here"))
    assert refusal is not None and refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(refusal)
    assert info.reason == "ORG_WRITE_RATE_EXCEEDED" and float(info.metadata["retry_after_seconds"]) > 0
    assert accepted >= engine.settings.org_write_burst_bytes // len(content) - 1
    assert await archived_count(engine, attacker) == accepted
    assert await archived_count(engine, bystander) == accepted
