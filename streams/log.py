"""Appending to the log, and knowing when an append is durable.

`EventLog.append` produces a domain event keyed by its aggregate and returns its log position.
`ArchiveWatch.wait` returns once the archiver has stored (and projected) that event in
PostgreSQL: the projector announces every batch with `NOTIFY event_archived`, and a lookup by
event_id covers a notification that was missed (a reconnect, or one that arrived before the
wait began). Only then is a command acknowledged, so an acknowledged event survives a crash
of a memory-only broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass

import asyncpg
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from context_engine.errors import Unavailable
from context_engine.events import Event
from context_engine.streams.topics import LogTopics

log = structlog.get_logger("context_engine.log")

ARCHIVED_CHANNEL = "event_archived"


@dataclass(frozen=True, slots=True)
class LogPosition:
    topic: str
    partition: int
    offset: int


def archived_payload(topic: str, max_offsets: dict[int, int]) -> str:
    """NOTIFY payload: the highest offset handled per partition in one committed batch."""
    return topic + "|" + ",".join(f"{p}:{o}" for p, o in sorted(max_offsets.items()))


def parse_archived_payload(payload: str) -> tuple[str, dict[int, int]]:
    topic, _, parts = payload.rpartition("|")
    return topic, {int(p): int(o) for p, o in (item.split(":") for item in parts.split(",") if item)}


class EventLog:
    """The producer the command handlers share."""

    def __init__(self, bootstrap: str, topics: LogTopics) -> None:
        self.topics = topics
        # No idempotent producer on the bundled broker; a retried send may duplicate a record,
        # which the projector drops by event_id.
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1,
                                          enable_idempotence=False, request_timeout_ms=10_000)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def append(self, event: Event) -> LogPosition:
        return await self._send(self.topics.events, event.to_bytes(), event.aggregate.encode())

    async def publish(self, topic: str, key: str, value: bytes) -> LogPosition:
        return await self._send(topic, value, key.encode())

    async def _send(self, topic: str, value: bytes, key: bytes) -> LogPosition:
        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception_type(KafkaError),
                                               stop=stop_after_attempt(3),
                                               wait=wait_exponential(multiplier=0.05, max=1.0), reraise=True):
                with attempt:
                    meta = await self._producer.send_and_wait(topic, value, key=key)
        except KafkaError as exc:
            raise Unavailable(f"the event log is unavailable: {exc}", reason="LOG_UNAVAILABLE") from exc
        return LogPosition(meta.topic, meta.partition, meta.offset)


class ArchiveWatch:
    """Waits for the archiver's word that a position is durable."""

    def __init__(self, database_url: str, pool: asyncpg.Pool, *, poll_interval: float = 0.05) -> None:
        self._url = database_url
        self._pool = pool
        self._poll = poll_interval
        self._conn: asyncpg.Connection | None = None
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future]]] = defaultdict(list)
        # (topic, partition) -> (highest archived offset seen, monotonic time it was seen)
        self._seen: dict[tuple[str, int], tuple[int, float]] = {}

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._url)
        await self._conn.add_listener(ARCHIVED_CHANNEL, self._on_notify)

    async def stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        topic, offsets = parse_archived_payload(payload)
        now = time.monotonic()
        for partition, offset in offsets.items():
            key = (topic, partition)
            if offset > self._seen.get(key, (-1, 0.0))[0]:
                self._seen[key] = (offset, now)
            still = []
            for wanted, future in self._waiters.get(key, ()):
                if wanted <= offset:
                    if not future.done():
                        future.set_result(None)
                elif not future.done():
                    still.append((wanted, future))
            self._waiters[key] = still

    async def wait(self, event_id: str, org_id: str, position: LogPosition, *, since: float,
                   timeout: float) -> None:
        """Return once the event is archived. `since` is the monotonic time the append began:
        only a notification seen after it can speak for this append."""
        key = (position.topic, position.partition)
        seen_offset, seen_at = self._seen.get(key, (-1, 0.0))
        if seen_offset >= position.offset and seen_at >= since:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters[key].append((position.offset, future))
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Unavailable(
                        f"event {event_id} was appended at {position.topic}/{position.partition}"
                        f"@{position.offset} but not archived within {timeout:.1f}s; it is not "
                        "acknowledged, retry with the same idempotency-key", reason="NOT_DURABLE_YET")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(future), min(self._poll, remaining))
                    return
                if await self._archived(event_id, org_id):
                    return
        finally:
            if not future.done():
                future.cancel()

    async def _archived(self, event_id: str, org_id: str) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)
            return await conn.fetchval("SELECT true FROM event_archive WHERE event_id = $1", event_id) or False
