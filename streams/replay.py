"""Replay and verify: rebuild the read models from the log, and check the live ones against a
rebuild.

Replay is a bulk path (ARCHITECTURE.md section 4): records go through the same `apply_batch` the
live projector uses, in large batches, into a database that holds no events yet. Being the only
writer of an empty database, it loads in bulk: postings by COPY, the HNSW and posting indexes
built once at the end, recorded vectors given to their chunks in one pass at the end, and the
retrieval statistics recounted at the end instead of kept by deltas per batch (both give the same
rows as the live path, projections/projector/chunks.py). `verify`
replays into a scratch database and compares every version hash, item and snapshot with the live
read models, naming the event behind each difference.

Two readings of the log:
- `read_log`: the broker's topic, every partition from offset 0 to its high-water mark, with a
  plain aiokafka consumer (Faust's per-event overhead would cap it near 10k events/s). Only the
  records a trusted writer signed (streams/record_auth.py), as the worker: the others were never
  applied, so a rebuild leaves them out too, and `on_refused` hears of each (verify names them).
- `read_archive`: the archive's copy of the log, in the order the projector applied it
  (`archive_seq`). With a memory-only broker this is the authoritative copy: after a broker
  crash, a produce that was never acknowledged can reach the restarted broker ahead of the
  restored events, so the broker's order can differ from the order the read models were built
  in for exactly those unacknowledged events. Deployments that restore the log from the archive
  therefore replay and verify from the archive by default; with a durable broker, from the log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from context_engine.events import GUARDRAIL_PUBLISHED
from context_engine.hashing import sha256_hex
from projections.projector import bulk_load
from projections.projector.batch import apply_batch
from projections.projector.chunks import BulkLoad
from projections.projector.deferred_indexing import requested_sources
from projections.projector.guardrail_layers import refused_on_the_log
from projections.projector.records import LogRecord
from projections.projector.rejections import claimed_identity
from projections.reads import archive as archive_reads
from projections.reads import verification
from projections.store import admin
from projections.store.migrations import migrate
from projections.store.pool import SYSTEM_ORG, create_pool
from streams.record_auth import RecordVerifier

BATCH = 2000
# maintenance_work_mem of the index builds at the end. pgvector builds an HNSW graph much faster
# while it fits in this memory: 100,000 384-d vectors need ~200 MB, PostgreSQL's default is 64 MB.
BUILD_MEMORY_MB = 1024


@dataclass(frozen=True)
class ReplayReport:
    events: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Difference:
    event_id: str
    where: str
    live: str
    recomputed: str

    def __str__(self) -> str:
        return f"event {self.event_id} ({self.where}): read model has {self.live}, the log gives {self.recomputed}"


@dataclass(frozen=True)
class RefusedRecord:
    """A record of the log without a valid authenticator: the worker dropped it unread."""

    topic: str
    partition: int
    offset: int
    reason: str
    key_id: str | None

    def __str__(self) -> str:
        key = f", key {self.key_id}" if self.key_id else ""
        return (f"log record {self.topic}[{self.partition}]@{self.offset}: not from a trusted writer "
                f"({self.reason}{key}); refused, not applied")


async def read_log(bootstrap: str, topic: str, *, verifier: RecordVerifier, batch: int = BATCH,
                   security: Mapping[str, Any] | None = None,
                   on_total: Callable[[int], None] | None = None,
                   on_refused: Callable[[RefusedRecord], None] | None = None) -> AsyncIterator[list[LogRecord]]:
    """Every authentic record of `topic`, partition order kept, up to the high-water marks seen at
    start; each other record is given to `on_refused` instead."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=20,
                                max_partition_fetch_bytes=8 * 1024 * 1024, **(security or {}))
    await consumer.start()
    try:
        if topic not in await consumer.topics():  # all-topics Metadata: creates nothing
            raise RuntimeError(f"topic {topic!r} does not exist on {bootstrap}")
        partitions = consumer.partitions_for_topic(topic) or set()
        if partitions:  # each record is checked against the partition its key maps to
            verifier.expect_partitions(topic, len(partitions))
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends: dict[TopicPartition, int] = {}
        while len(ends) < len(tps):  # the fetch's high-water mark is right where ListOffsets is not
            got = await consumer.getmany(*tps, timeout_ms=200, max_records=batch)
            for tp in tps:
                if tp not in ends and (hw := consumer.highwater(tp)) is not None:
                    ends[tp] = hw
            for tp, records in got.items():
                consumer.seek(tp, records[0].offset)  # re-read below, now that the end is known
        if on_total:
            on_total(sum(ends.values()))
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            got = await consumer.getmany(*remaining, timeout_ms=500, max_records=batch)
            verifier.refresh()
            out = []
            for tp, records in got.items():
                for r in records:
                    if r.offset >= ends[tp]:
                        continue
                    if (refusal := verifier.check(r.topic, r.partition, r.key, r.value, r.headers)) is not None:
                        if on_refused:
                            on_refused(RefusedRecord(r.topic, r.partition, r.offset, *refusal))
                        continue
                    out.append(LogRecord(r.topic, r.partition, r.offset, r.value))
                if records and records[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
            if out:
                yield out
    finally:
        await consumer.stop()


async def read_archive(admin_url: str, topic: str, *, batch: int = BATCH,
                       on_total: Callable[[int], None] | None = None) -> AsyncIterator[list[LogRecord]]:
    conn = await asyncpg.connect(admin_url)
    try:
        if on_total:
            on_total(await archive_reads.archived_count(conn, topic))
        async with conn.transaction():
            out = []
            async for record in archive_reads.archived_records(conn, topic, prefetch=batch):
                out.append(record)
                if len(out) >= batch:
                    yield out
                    out = []
            if out:
                yield out
    finally:
        await conn.close()


def source(name: str, *, bootstrap: str, topic: str, admin_url: str, verifier: RecordVerifier,
           security: Mapping[str, Any] | None = None, on_total: Callable[[int], None] | None = None,
           on_refused: Callable[[RefusedRecord], None] | None = None) -> AsyncIterator[list[LogRecord]]:
    """The log (authentic records only) or the archive (what the worker accepted)."""
    if name == "log":
        return read_log(bootstrap, topic, verifier=verifier, security=security, on_total=on_total,
                        on_refused=on_refused)
    if name == "archive":
        return read_archive(admin_url, topic, on_total=on_total)
    raise ValueError(f"replay source must be 'log' or 'archive', not {name!r}")


async def replay(records: AsyncIterator[list[LogRecord]], target_admin_url: str, *,
                 progress: Callable[[int], None] | None = None) -> ReplayReport:
    await migrate(target_admin_url)
    pool = await create_pool(target_admin_url, org_scoped=False, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            if await archive_reads.archive_holds_events(conn):
                raise RuntimeError("the target database already holds events; replay needs an empty one")
            orgs: set[str] = set()
            started, count = time.monotonic(), 0
            bulk = BulkLoad(copy=await bulk_load.role_may_copy(conn))
            deferred = await bulk_load.deferred_indexes(conn)
            await bulk_load.drop_indexes(conn, deferred)
            try:
                async for batch in records:
                    orgs.update(a.org_id for a in await apply_batch(conn, batch, bulk=bulk))
                    count += len(batch)
                    if progress:
                        progress(len(batch))
            finally:  # a replay cut short still leaves a schema the stack can serve from
                try:
                    for org_id in sorted(orgs - {SYSTEM_ORG}):
                        await bulk_load.finish_org(conn, org_id)
                finally:
                    await bulk_load.build_indexes(conn, deferred, memory_mb=BUILD_MEMORY_MB)
            return ReplayReport(count, time.monotonic() - started)
    finally:
        await pool.close()


async def compare(live_url: str, rebuilt_url: str) -> list[Difference]:
    live, rebuilt = await asyncpg.connect(live_url), await asyncpg.connect(rebuilt_url)
    try:
        differences = []
        # Sources whose indexing is still asked for have no chunks live yet (not a difference).
        pending = await requested_sources(live)
        for what in verification.COMPARED:
            want = await verification.compared_rows(rebuilt, what)
            have = await verification.compared_rows(live, what)
            if what == "chunk":
                want = {k: v for k, v in want.items() if v[0] not in pending}
            for key in sorted(want.keys() | have.keys()):
                w, h = want.get(key), have.get(key)
                if w != h:
                    found = w or h
                    assert found is not None  # the key is want's or have's
                    event = found[0]
                    differences.append(Difference(event, f"{what} {key}", h[1] if h else "nothing",
                                                  w[1] if w else "nothing"))
        return differences
    finally:
        await live.close()
        await rebuilt.close()


# An event can be on the log and not yet projected while the stack runs: a record missing from
# the archive is looked for again until this long after the log was read.
IN_FLIGHT_GRACE_S = 10.0


async def verify(records: AsyncIterator[list[LogRecord]], admin_url: str, *,
                 log: tuple[AsyncIterator[list[LogRecord]], str] | None = None,
                 progress: Callable[[int], None] | None = None,
                 in_flight_grace_s: float = IN_FLIGHT_GRACE_S) -> tuple[ReplayReport, list[Difference]]:
    """Rebuild from `records` into a scratch database and compare its read models with the live
    ones; with `log` (the broker's records of a topic, and that topic), also compare the log with
    the archive and the set-aside records, so that an event the read models never received is
    named too."""
    differences = await compare_log(*log, admin_url, in_flight_grace_s) if log is not None else []
    scratch = await admin.create_database(admin_url, admin.timestamped_name("context_engine_verify"))
    try:
        report = await replay(records, scratch, progress=progress)
        return report, differences + await compare(admin_url, scratch)
    finally:
        await admin.drop_database(admin_url, admin.database_of(scratch))


async def compare_log(log: AsyncIterator[list[LogRecord]], topic: str, admin_url: str,
                      in_flight_grace_s: float = IN_FLIGHT_GRACE_S) -> list[Difference]:
    """Every record of the log is archived or set aside, and every event archived before the log
    was read is on the log. `log` holds the authentic records only (`read_log`): one no trusted
    writer signed is neither, by design, and is reported apart (RefusedRecord). The archive's mark
    is taken first, so an event the stack archives while the log is being read (a live write, a
    worker's vectors) is no difference."""
    conn = await asyncpg.connect(admin_url)
    try:
        mark = await archive_reads.last_archive_seq(conn, topic)
        on_log: dict[str, tuple[str | None, str]] = {}  # record hash -> (event id, position)
        layers: dict[str, bytes] = {}  # guardrail layers the projection may have refused (not archived)
        async for batch in log:
            for rec in batch:
                _org, event_id = claimed_identity(rec.raw)
                on_log.setdefault(sha256_hex(rec.raw), (event_id or None, f"{rec.topic}[{rec.partition}]@{rec.offset}"))
                if GUARDRAIL_PUBLISHED.encode() in rec.raw:
                    layers[sha256_hex(rec.raw)] = bytes(rec.raw)
        refused: set[str] = set()
        deadline = time.monotonic() + in_flight_grace_s
        while True:
            archived = await archive_reads.archive_seqs_by_event(conn, topic)
            set_aside = await archive_reads.set_aside_record_hashes(conn, topic)
            missing = {d: v for d, v in on_log.items() if d not in set_aside and v[0] not in archived}
            for d in [d for d in missing if d in layers]:  # a refused layer is rightly neither
                if await refused_on_the_log(conn, layers.pop(d)):
                    refused.add(d)
            missing = {d: v for d, v in missing.items() if d not in refused}
            if not missing or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
    finally:
        await conn.close()
    logged_ids = {event_id for event_id, _ in on_log.values() if event_id}
    differences = [Difference(event_id or f"record {digest[:16]}", f"log record {where}",
                              "nothing (neither archived nor set aside)", "a record")
                   for digest, (event_id, where) in sorted(missing.items(), key=lambda kv: kv[1][1])]
    differences += [Difference(event_id, f"archive of {topic}", "an archived event", "nothing (not on the log)")
                    for event_id, seq in sorted(archived.items()) if seq <= mark and event_id not in logged_ids]
    return differences
