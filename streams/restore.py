"""Restoring the log from the PostgreSQL archive.

The bundled broker keeps everything in memory: a restart empties it. Every acknowledged event is
in `event_archive`, so before the API produces anything it compares, per partition of the
domain-event topic, how many records the broker holds (its high-water mark, read from a fetch:
the bundled broker's ListOffsets answer is wrong) with how many events the archive holds. When
the broker holds fewer, the archived events of that partition are produced again, in archive
order (= log order within the partition), to the same partition. Records the broker still had
arrive twice; the projector drops the copies by event_id, so restoring is always safe.

The restored records are signed again with the keyring's signing key (streams/record_auth.py):
the archive holds the values the worker accepted, the authenticators were the broker's.

With a durable broker the check can be switched off (`restore_log_from_archive`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from projections.reads.archive import archived_counts_by_partition, archived_partition
from projections.store.pool import advisory_lock
from streams.log import producer_request_bytes
from streams.record_auth import RecordSigner
from streams.topics import TOPIC_MAX_MESSAGE_BYTES

log = structlog.get_logger("context_engine.restore")

RESTORE_LOCK = 0x636F6E74  # pg advisory lock: one restorer at a time across API replicas
SEND_WINDOW = 1000


@dataclass(frozen=True)
class RestoreReport:
    partitions: int
    records: int
    seconds: float


async def high_water_marks(bootstrap: str, topic: str, partitions: list[int], *,
                           security: Mapping[str, Any] | None = None) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=20, **(security or {}))
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        marks: dict[int, int] = {}
        deadline = time.monotonic() + 10
        while len(marks) < len(tps) and time.monotonic() < deadline:
            await consumer.getmany(*tps, timeout_ms=200, max_records=1)
            for tp in tps:
                if (hw := consumer.highwater(tp)) is not None:
                    marks[tp.partition] = hw
        if len(marks) < len(tps):
            raise RuntimeError(f"no high-water mark for {topic} partitions "
                               f"{sorted(set(partitions) - set(marks))} within 10s")
        return marks
    finally:
        await consumer.stop()


async def restore_if_behind(bootstrap: str, topic: str, admin_pool: asyncpg.Pool, *, signer: RecordSigner,
                            security: Mapping[str, Any] | None = None) -> RestoreReport:
    started = time.monotonic()
    restored_partitions = restored_records = 0
    async with admin_pool.acquire() as conn, advisory_lock(conn, RESTORE_LOCK):
        archived = await archived_counts_by_partition(conn, topic)
        if archived:
            marks = await high_water_marks(bootstrap, topic, sorted(archived), security=security)
            behind = [p for p, n in sorted(archived.items()) if marks[p] < n]
            if behind:
                producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                            enable_idempotence=False, linger_ms=5,
                                            max_request_size=producer_request_bytes(TOPIC_MAX_MESSAGE_BYTES),
                                            **(security or {}))
                await producer.start()
                try:
                    for partition in behind:
                        restored_records += await _restore_partition(conn, producer, signer, topic, partition)
                        restored_partitions += 1
                finally:
                    await producer.stop()
    report = RestoreReport(restored_partitions, restored_records, time.monotonic() - started)
    if restored_partitions:
        log.warning("log restored from archive", topic=topic, partitions=report.partitions,
                    records=report.records, seconds=round(report.seconds, 3))
    return report


async def _restore_partition(conn: asyncpg.Connection, producer: AIOKafkaProducer, signer: RecordSigner,
                             topic: str, partition: int) -> int:
    pending: list[asyncio.Future] = []
    count = 0
    async with conn.transaction():
        async for aggregate, raw in archived_partition(conn, topic, partition):
            key = aggregate.encode()
            pending.append(await producer.send(topic, raw, key=key, partition=partition,
                                               headers=signer.headers(topic, key, raw)))
            count += 1
            if len(pending) >= SEND_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
    await asyncio.gather(*pending)
    return count
