"""A process on the host that can reach the broker cannot write through the log
(docs/security.md, "The log").

Every record below is produced with a plain aiokafka producer, as any local process could: an
event claiming another org's session without an authenticator, one signed with a key the engine
does not hold, a genuine record's authenticator on altered bytes, genuine records moved to another
stream or key or copied to another partition of their topic, and forged job records of every
stream a worker agent consumes. Each must be refused by the worker (its refusal counter says when
it has consumed the record, so no sleep), change no row of any table, leave nothing of its content
in the worker's log, and hold up nothing: an ingest right after it is acknowledged and readable.
The same records signed by the engine's key are applied (the controls), so the refusals are what
stops them. Last, the key is rotated while the stack runs, then the old key retired.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import shutil
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from context_engine.events import EVENT_INGESTED, Event, session_aggregate
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from streams import jobs
from streams.record_auth import (
    BAD_MAC,
    KEYRING_FORMAT,
    MISSING,
    UNKNOWN_KEY,
    WRONG_PARTITION,
    Keyring,
    RecordSigner,
    RecordVerifier,
    partition_for,
    signer_from_settings,
)
from streams.topics import LogTopics
from tests.fixtures.engine import unique
from tests.fixtures.settling import settled
from tests.security.deployment import quiet_deployment
from tests.security.row_counts import unchanged
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

MARKER = f"FORGED-{uuid.uuid4().hex}"  # in every forged content: must never reach a table or a log


@pytest.fixture(scope="module")
async def log_engine(postgres_url, kafka_bootstrap, tmp_path_factory):
    """A deployment of this module's own: its keyring is rotated below, its worker's metrics are
    read, and it samples no savings (nothing but a request or a job writes a row)."""
    home = tmp_path_factory.mktemp("host-log-home")
    async with quiet_deployment(postgres_url, kafka_bootstrap, home) as (running, _):
        yield running


@dataclass(frozen=True)
class Victim:
    org: str
    session: str
    ingested_id: str  # an ingest of the victim (the source of its chunks)
    memory_id: str  # a pushed memory of the victim
    chunk_ids: list[str]


@pytest.fixture(scope="module")
async def victim(log_engine) -> Victim:
    org, session = unique("victim"), "s"
    caller = log_engine.caller(org, clearance=4)
    ingested = await caller("IngestEvent", pb.IngestEventRequest(session_id=session, event_type="message",
                                                                  content=b"the victim's first turn"))
    await caller("PushContext", pb.PushContextRequest(session_id=session, memory_type="semantic",
                                                      content=b"the victim's memory"))
    await settled(log_engine.settings.database_url)
    conn = await asyncpg.connect(log_engine.settings.database_url)
    try:
        memory_id = str(await conn.fetchval("SELECT event_id FROM memory_versions WHERE org_id = $1", org))
        chunk_ids = [str(r[0]) for r in await conn.fetch("SELECT chunk_id FROM chunks WHERE org_id = $1", org)]
    finally:
        await conn.close()
    return Victim(org, session, ingested.event_id, memory_id, chunk_ids)


# -- records, as a forger makes them -----------------------------------------------------------


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    partition: int | None = None  # None: where the default partitioner sends the key, as trusted producers do


def ingested_event(org: str, session: str, text: str) -> Event:
    content = text.encode()
    return Event(EVENT_INGESTED, Scope(org), session_aggregate(org, session), "intruder", {
        "session_id": session, "event_type": "message", "content_b64": base64.b64encode(content).decode(),
        "metadata": {}, "content_sha256": sha256_hex(content), "token_count": 4, "idempotency_key": ""})


def event_record(topics: LogTopics, event: Event, headers=()) -> Record:
    return Record(topics.events, event.aggregate.encode(), event.to_bytes(), list(headers))


def job_record(topics: LogTopics, stream: str, job: jobs.JobMessage, headers=()) -> Record:
    return Record(topics.jobs[stream], job.key, job.value, list(headers))


def foreign_signer(tmp_path, key_id: str | None = None) -> RecordSigner:
    """A forger's own key: under an id of the engine's (read off a genuine record), or its own."""
    path = tmp_path / f"forger-{uuid.uuid4().hex[:6]}.keyring"
    now = "2026-01-01T00:00:00+00:00"
    path.write_text(json.dumps({"format": KEYRING_FORMAT, "keys": [{
        "id": key_id or "forger-1", "secret": os.urandom(32).hex(), "created_at": now, "signing_from": now}]}))
    return RecordSigner(Keyring(path, create=False))


async def genuine(settings, topic: str, wanted: Callable[[bytes], bool]) -> Record:
    """A record a trusted writer put on the log, read back as any broker client can. Only one that
    verifies where it lies: an earlier case's forged copy of the same record is on the log too."""
    verifier = RecordVerifier(Keyring.from_settings(settings), LogTopics.from_settings(settings).partitions)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for r in records:
                    if (r.value is not None and wanted(r.value)
                            and verifier.check(topic, r.partition, r.key, r.value, r.headers) is None):
                        return Record(topic, r.key, r.value, list(r.headers), r.partition)
        raise AssertionError(f"no such record on {topic}")
    finally:
        await consumer.stop()


async def produce(settings, records: list[Record]) -> list[str]:
    """Produce as any broker client can; returns where each record landed, as `topic[partition]@offset`."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        landed = []
        for r in records:
            meta = await producer.send_and_wait(r.topic, r.value, key=r.key, headers=r.headers or None,
                                                partition=r.partition)
            landed.append(f"{meta.topic}[{meta.partition}]@{meta.offset}")
        return landed
    finally:
        await producer.stop()


# -- what the worker says ----------------------------------------------------------------------


def refusals(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.labels["stream"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "context_engine_log_records_refused_total"}


async def until_refused(engine, before: dict, expected: dict[tuple[str, str], int], timeout: float = 30.0) -> None:
    """Until the worker has refused `expected` more records, by (stream, reason): it has consumed them."""
    deadline = time.monotonic() + timeout
    while True:
        now = await asyncio.to_thread(refusals, engine.settings.worker_metrics_port)
        grown = {k: now.get(k, 0) - before.get(k, 0) for k in expected}
        if all(grown[k] >= n for k, n in expected.items()):
            assert grown == expected, "more refusals than forged records"
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"refused {grown}, expected {expected}\n{engine.worker.log_tail()}")
        await asyncio.sleep(0.05)


async def still_writes(engine, victim: Victim) -> None:
    """An authentic write after the forgeries is acknowledged and readable: nothing stalled."""
    caller = engine.caller(victim.org, clearance=4)
    text = f"an authentic turn {unique('t')}"
    await caller("IngestEvent", pb.IngestEventRequest(session_id=victim.session, event_type="message",
                                                      content=text.encode()))
    prompt = (await caller("AssembleContext", pb.AssembleContextRequest(
        session_id=victim.session, token_budget=4000))).assembled_prompt
    assert text in prompt and MARKER not in prompt


# -- the forgeries ------------------------------------------------------------------------------

async def no_header(engine, victim, tmp_path):
    """(a) a well-formed event claiming the victim org's session, without an authenticator."""
    t = LogTopics.from_settings(engine.settings)
    return [event_record(t, ingested_event(victim.org, victim.session, MARKER))]


async def wrong_secret(engine, victim, tmp_path):
    """(b) signed under the engine's own key id (read off a genuine record) with another secret."""
    t = LogTopics.from_settings(engine.settings)
    key_id = signer_from_settings(engine.settings).keyring.signing.key_id
    event = ingested_event(victim.org, victim.session, MARKER)
    raw, key = event.to_bytes(), event.aggregate.encode()
    return [Record(t.events, key, raw, foreign_signer(tmp_path, key_id).headers(t.events, key, raw))]


async def unknown_key(engine, victim, tmp_path):
    """(b) signed with a key of the forger's own, under an id the engine never had."""
    t = LogTopics.from_settings(engine.settings)
    event = ingested_event(victim.org, victim.session, MARKER)
    raw, key = event.to_bytes(), event.aggregate.encode()
    return [Record(t.events, key, raw, foreign_signer(tmp_path).headers(t.events, key, raw))]


async def replayed_header(engine, victim, tmp_path):
    """(c) the authenticator of the victim's genuine ingest (read off the log) on altered bytes:
    another content, and the same event moved into another org."""
    t = LogTopics.from_settings(engine.settings)
    real = await genuine(engine.settings, t.events, lambda v: victim.ingested_id.encode() in v)
    doc = json.loads(real.value)
    altered = dict(doc, payload=dict(doc["payload"], content_b64=base64.b64encode(MARKER.encode()).decode()))
    other_org = dict(doc, scope=dict(doc["scope"], org_id=unique("attacker")))
    return [Record(t.events, real.key, json.dumps(d, sort_keys=True).encode(), real.headers)
            for d in (altered, other_org)] + [Record(t.events, real.key, real.value + b" ", real.headers)]


async def moved(engine, victim, tmp_path):
    """(d) genuine records, bytes and authenticator unchanged, on another stream or partition:
    the PII job the projector published for the victim's memory onto the reindex and embedding
    streams, the victim's ingest onto the PII stream, and re-keyed to another session."""
    t = LogTopics.from_settings(engine.settings)
    pii = await genuine(engine.settings, t.jobs["pii"], lambda v: victim.memory_id.encode() in v)
    event = await genuine(engine.settings, t.events, lambda v: victim.ingested_id.encode() in v)
    return [Record(t.jobs["reindex"], pii.key, pii.value, pii.headers),
            Record(t.jobs["embedding"], pii.key, pii.value, pii.headers),
            Record(t.jobs["pii"], event.key, event.value, event.headers),
            Record(t.events, session_aggregate(victim.org, "other").encode(), event.value, event.headers)]


async def copied_to_another_partition(engine, victim, tmp_path):
    """(d) genuine records, bytes and headers unchanged, copied to another partition of their topic:
    the victim's ingest and the PII job of its memory, read off the log; and an event the engine's
    key signed that is found only on another partition than its key's, as a copy is when its
    original's partition lags (had it been applied, its content would be in a table)."""
    t = LogTopics.from_settings(engine.settings)
    counts = t.partitions

    def elsewhere(r: Record) -> Record:
        return dataclasses.replace(r, partition=(r.partition + 1) % counts[r.topic])

    event = await genuine(engine.settings, t.events, lambda v: victim.ingested_id.encode() in v)
    pii = await genuine(engine.settings, t.jobs["pii"], lambda v: victim.memory_id.encode() in v)
    ahead = ingested_event(victim.org, victim.session, MARKER)
    raw, key = ahead.to_bytes(), ahead.aggregate.encode()
    signed = Record(t.events, key, raw, signer_from_settings(engine.settings).headers(t.events, key, raw),
                    partition_for(key, counts[t.events]))
    return [elsewhere(event), elsewhere(pii), elsewhere(signed)]


def forged_jobs(engine, victim) -> list[Record]:
    t, scope = LogTopics.from_settings(engine.settings), Scope(victim.org)
    return [job_record(t, "embedding", jobs.embedding_job(scope, victim.ingested_id, victim.chunk_ids)),
            job_record(t, "pii", jobs.pii_scan_job(scope, victim.memory_id)),
            job_record(t, "indexing", jobs.indexing_job(scope, victim.ingested_id)),
            job_record(t, "reindex", jobs.reindex_job(scope, "", "", "intruder")),
            job_record(t, "metrics:baseline", jobs.baseline_metric(
                scope, prompt_id=MARKER, session_id=victim.session, assembled_tokens=10, naive_tokens=1000,
                model_id=""))]


async def job_records(engine, victim, tmp_path):
    """(e) job records of every stream a worker agent consumes, without an authenticator."""
    return forged_jobs(engine, victim)


async def signed_jobs_wrong_key(engine, victim, tmp_path):
    """(e) the same jobs, signed with a key of the forger's own."""
    signer = foreign_signer(tmp_path)
    return [Record(r.topic, r.key, r.value, signer.headers(r.topic, r.key, r.value))
            for r in forged_jobs(engine, victim)]


def jobs_expected(reason: str) -> dict[tuple[str, str], int]:
    return {(s, reason): 1 for s in ("embedding", "pii", "indexing", "reindex", "metrics-baseline")}


FORGERIES = [
    # (case, forgery, refusals expected by (stream, reason))
    ("a: event into another org's session, no header", no_header, {("events", MISSING): 1}),
    ("b: right key id, wrong secret", wrong_secret, {("events", BAD_MAC): 1}),
    ("b: a key the engine never had", unknown_key, {("events", UNKNOWN_KEY): 1}),
    ("c: a genuine header on altered bytes", replayed_header, {("events", BAD_MAC): 3}),
    ("d: genuine records moved to another stream or key", moved,
     {("reindex", BAD_MAC): 1, ("embedding", BAD_MAC): 1, ("pii", BAD_MAC): 1, ("events", BAD_MAC): 1}),
    ("d: genuine records copied to another partition", copied_to_another_partition,
     {("events", WRONG_PARTITION): 2, ("pii", WRONG_PARTITION): 1}),
    ("e: job records without a header", job_records, jobs_expected(MISSING)),
    ("e: job records signed with the forger's key", signed_jobs_wrong_key, jobs_expected(UNKNOWN_KEY)),
]


@pytest.mark.parametrize("case, forge, expected", FORGERIES, ids=[f[0] for f in FORGERIES])
async def test_a_record_no_trusted_writer_signed_is_refused_unread(log_engine, victim, tmp_path, case, forge,
                                                                  expected):
    engine = log_engine
    records = await forge(engine, victim, tmp_path)
    await settled(engine.settings.database_url)
    before = await asyncio.to_thread(refusals, engine.settings.worker_metrics_port)
    async with unchanged(engine.settings.database_url):
        await produce(engine.settings, records)
        await until_refused(engine, before, expected)
        await settled(engine.settings.database_url)  # had anything been applied, its jobs would be done too
    await still_writes(engine, victim)


async def test_the_worker_logs_refusals_by_position_never_their_content(log_engine, victim, tmp_path):
    """A line per refusal naming topic, partition, offset, key id and reason, and nothing of what
    the record said (nor its key, a session of the victim org)."""
    engine = log_engine
    before = await asyncio.to_thread(refusals, engine.settings.worker_metrics_port)
    [where] = await produce(engine.settings, await unknown_key(engine, victim, tmp_path))
    await until_refused(engine, before, {("events", UNKNOWN_KEY): 1})
    text = engine.worker.log_path.read_text(errors="replace")
    lines = [json.loads(line) for line in text.splitlines() if "log record refused" in line]
    assert {frozenset(line) - {"timestamp", "process", "level"} for line in lines} == {
        frozenset({"event", "topic", "partition", "offset", "key_id", "reason"})}
    assert {"key_id": "forger-1", "reason": UNKNOWN_KEY} in [
        {"key_id": line["key_id"], "reason": line["reason"]} for line in lines
        if f"{line['topic']}[{line['partition']}]@{line['offset']}" == where]
    assert MARKER not in text and base64.b64encode(MARKER.encode()).decode() not in text
    assert not [line for line in lines if victim.org in json.dumps(line)]


async def test_verify_lists_the_refused_records_apart_from_differences(log_engine, victim, tmp_path):
    """verify names each record of the log no trusted writer signed, by position and reason, as
    refused and not applied; they are no difference (the read models are right without them)."""
    engine = log_engine
    before = await asyncio.to_thread(refusals, engine.settings.worker_metrics_port)
    forged = await no_header(engine, victim, tmp_path) + await wrong_secret(engine, victim, tmp_path)
    landed = await produce(engine.settings, forged)
    await until_refused(engine, before, {("events", MISSING): 1, ("events", BAD_MAC): 1})
    await settled(engine.settings.database_url)
    code, out = await engine.cli("verify")
    assert code == 0, out
    listed = {line.split(":")[0].removeprefix("log record "): line for line in out.splitlines()
              if "not from a trusted writer" in line}
    assert f"({MISSING})" in listed[landed[0]] and f"({BAD_MAC}, key " in listed[landed[1]], out
    assert "0 difference(s)" in out and f"{len(listed)} record(s) on the log no trusted writer signed" in out
    assert MARKER not in out


CONTROLS = [
    # (case, the forgery signed by the engine's key, the table it must then have written)
    ("event into the session", lambda e, v: [event_record(LogTopics.from_settings(e.settings),
                                                          ingested_event(v.org, v.session, "a signed turn"))],
     "public.event_archive"),
    ("pii job", lambda e, v: [r for r in forged_jobs(e, v) if r.topic.endswith(".pii")], "public.event_archive"),
    ("baseline job", lambda e, v: [r for r in forged_jobs(e, v) if r.topic.endswith(".metrics-baseline")],
     "public.savings_samples"),
]


@pytest.mark.parametrize("case, make, table", CONTROLS, ids=[c[0] for c in CONTROLS])
async def test_the_same_records_signed_are_applied(log_engine, victim, case, make, table):
    """The refusals above are what stops the forgeries: signed by the engine's key, they act."""
    from tests.security.row_counts import changed, row_counts

    engine = log_engine
    signer = signer_from_settings(engine.settings)
    records = [Record(r.topic, r.key, r.value, signer.headers(r.topic, r.key, r.value)) for r in make(engine, victim)]
    await settled(engine.settings.database_url)
    before = await row_counts(engine.settings.database_url)
    await produce(engine.settings, records)
    deadline = time.monotonic() + 30
    while table not in changed(before, await row_counts(engine.settings.database_url)):
        assert time.monotonic() < deadline, f"{case}: nothing written to {table}"
        await asyncio.sleep(0.05)
    await settled(engine.settings.database_url)


# -- rotation -----------------------------------------------------------------------------------


async def archived(settings, event_ids: list[str], timeout: float = 30.0) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        deadline = time.monotonic() + timeout
        while await conn.fetchval("SELECT count(*) FROM event_archive WHERE event_id = ANY($1::uuid[])",
                                  event_ids) < len(event_ids):
            assert time.monotonic() < deadline, f"not archived: {event_ids}"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_rotating_the_log_key_while_the_stack_runs(log_engine, victim, tmp_path):
    engine, settings = log_engine, log_engine.settings
    topics = LogTopics.from_settings(settings)
    pinned = tmp_path / "before-rotation.keyring"  # a producer that still holds only the old key
    shutil.copy(settings.log_keyring_path, pinned)
    old = RecordSigner(Keyring(pinned, create=False))
    old_id = old.keyring.signing.key_id

    code, out = await engine.cli("keys", "rotate-log-key")
    assert code == 0, out
    new = signer_from_settings(settings)  # a producer started after the rotation
    new_id = new.keyring.signing.key_id
    assert new_id != old_id and new_id in out and os.stat(settings.log_keyring_path).st_mode & 0o777 == 0o600
    assert all(k not in out for k in (new.keyring.signing.secret.hex(), old.keyring.signing.secret.hex()))

    def signed(signer: RecordSigner, text: str) -> tuple[str, Record]:
        event = ingested_event(victim.org, unique("rotation"), text)
        raw, key = event.to_bytes(), event.aggregate.encode()
        return event.event_id, Record(topics.events, key, raw, signer.headers(topics.events, key, raw))

    (old_event, old_record), (new_event, new_record) = signed(old, "old key"), signed(new, "new key")
    assert old_record.headers[0][1].split(b".")[1] == old_id.encode()
    await produce(settings, [old_record, new_record])
    await archived(settings, [old_event, new_event])  # both keys verify while the old one is not retired
    await still_writes(engine, victim)  # and the API, which follows the keyring, goes on

    code, out = await engine.cli("keys", "retire-log-key", old_id)
    assert code == 0, out
    code, out = await engine.cli("keys", "retire-log-key", new_id)
    assert code != 0 and "rotate first" in out  # the key that signs cannot be retired

    await settled(settings.database_url)
    before = await asyncio.to_thread(refusals, settings.worker_metrics_port)
    _, stale = signed(old, "old key after retirement")
    async with unchanged(settings.database_url):
        await produce(settings, [stale])
        await until_refused(engine, before, {("events", UNKNOWN_KEY): 1})
    newer_event, newer = signed(new, "new key after retirement")
    await produce(settings, [newer])
    await archived(settings, [newer_event])
    await still_writes(engine, victim)
