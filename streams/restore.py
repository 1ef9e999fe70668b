"""Restoring the log from the PostgreSQL archive.

The bundled broker keeps everything in memory: a restart empties it. Every acknowledged event is
in `event_archive` with its (topic, partition, offset), so on start, when the broker lacks the
archive's last record of a partition, the partition is produced again from the archive, in
offset order, to the same explicit partition. The broker then assigns the same offsets (measured:
re-producing in per-partition order reproduces every position). Offsets the archive skipped (a
retried send that duplicated an event is archived once) are filled with a copy of the previous
record, so later offsets still line up; the projector drops the copy by event_id.

A broker that holds part of a partition but not its archived tail is not something a
memory-only broker produces; it is reported, not patched over.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

log = structlog.get_logger("context_engine.restore")

RESTORE_LOCK = 0x636F6E74  # pg advisory lock: one restorer at a time across API replicas


class RestoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class RestoreReport:
    partitions: int
    records: int
    seconds: float


async def _broker_has(bootstrap: str, topic: str, partition: int, offset: int) -> bool:
    """Whether the broker serves the record at `offset` (ListOffsets is not trusted on tansu)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="none", fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        try:
            batch = await consumer.getmany(tp, timeout_ms=1500, max_records=1)
        except Exception:  # OffsetOutOfRange and friends: the broker does not hold it
            return False
        return any(r.offset == offset for r in batch.get(tp, []))
    finally:
        await consumer.stop()


async def restore_if_behind(bootstrap: str, topic: str, admin_pool: asyncpg.Pool) -> RestoreReport:
    started = time.monotonic()
    restored_partitions = restored_records = 0
    async with admin_pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", RESTORE_LOCK)
        try:
            tails = await conn.fetch(
                'SELECT partition, max("offset") AS last FROM event_archive WHERE topic = $1 GROUP BY partition',
                topic)
            producer = None
            try:
                for row in tails:
                    partition, last = row["partition"], row["last"]
                    if await _broker_has(bootstrap, topic, partition, last):
                        continue
                    if await _broker_has(bootstrap, topic, partition, 0):
                        raise RestoreError(
                            f"{topic}/{partition} holds records but not the archived offset {last}: "
                            "the broker lost a tail it should have kept; restore by hand")
                    if producer is None:
                        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                                    enable_idempotence=False, linger_ms=5)
                        await producer.start()
                    restored_records += await _restore_partition(conn, producer, topic, partition)
                    restored_partitions += 1
            finally:
                if producer is not None:
                    await producer.stop()
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", RESTORE_LOCK)
    report = RestoreReport(restored_partitions, restored_records, time.monotonic() - started)
    if restored_partitions:
        log.warning("log restored from archive", topic=topic, partitions=report.partitions,
                    records=report.records, seconds=round(report.seconds, 3))
    return report


async def _restore_partition(conn: asyncpg.Connection, producer: AIOKafkaProducer, topic: str,
                             partition: int) -> int:
    expected = 0
    previous: tuple[bytes, bytes] | None = None
    sent = []
    async with conn.transaction():
        cursor = conn.cursor('SELECT "offset", aggregate, raw FROM event_archive '
                             'WHERE topic = $1 AND partition = $2 ORDER BY "offset"', topic, partition)
        async for row in cursor:
            while expected < row["offset"]:  # a skipped duplicate: keep later offsets aligned
                if previous is None:
                    raise RestoreError(f"{topic}/{partition} archive starts at offset {row['offset']}, not 0")
                sent.append(await producer.send(topic, previous[1], key=previous[0], partition=partition))
                expected += 1
            previous = (row["aggregate"].encode(), bytes(row["raw"]))
            sent.append(await producer.send(topic, previous[1], key=previous[0], partition=partition))
            expected += 1
    results = await asyncio.gather(*sent)
    drift = [m.offset for i, m in enumerate(results) if m.offset != i]
    if drift:
        raise RestoreError(f"{topic}/{partition}: restored records landed at other offsets (first {drift[0]})")
    return len(results)
