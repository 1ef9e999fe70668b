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
from dataclasses import dataclass

import asyncpg
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from context_engine.errors import Unavailable
from context_engine.events import Event
from context_engine.streams.topics import LogTopics, existing_topics

log = structlog.get_logger("context_engine.log")

ARCHIVED_CHANNEL = "event_archived"


@dataclass(frozen=True, slots=True)
class LogPosition:
    topic: str
    partition: int
    offset: int


# NOTIFY payloads are limited to 8,000 bytes: at most this many event ids per notification.
IDS_PER_NOTIFICATION = 200


def archived_payloads(event_ids: list[str]) -> list[str]:
    """The notifications announcing one committed batch: its event ids, comma-separated.

    Ids, not offsets: after a memory-only broker is restored, offsets are reused, and a
    notification about a restored record at "my" offset must never acknowledge my event."""
    return [",".join(event_ids[i:i + IDS_PER_NOTIFICATION])
            for i in range(0, len(event_ids), IDS_PER_NOTIFICATION)]


class EventLog:
    """The producer the command handlers share."""

    def __init__(self, bootstrap: str, topics: LogTopics, guard: "LogGuard | None" = None,
                 hold_timeout: float = 5.0) -> None:
        self.topics = topics
        self._guard = guard
        self._hold_timeout = hold_timeout
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
        if self._guard is not None:
            await self._guard.wait_ready(self._hold_timeout)
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
    """Waits for the archiver's word that an event is durable."""

    def __init__(self, database_url: str, pool: asyncpg.Pool, *, poll_interval: float = 0.25) -> None:
        self._url = database_url
        self._pool = pool
        self._poll = poll_interval
        self._conn: asyncpg.Connection | None = None
        self._waiters: dict[str, asyncio.Future] = {}

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._url)
        await self._conn.add_listener(ARCHIVED_CHANNEL, self._on_notify)

    async def stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        for event_id in payload.split(","):
            future = self._waiters.get(event_id)
            if future is not None and not future.done():
                future.set_result(None)

    def expect(self, event_id: str) -> None:
        """Register interest before appending, so a notification cannot arrive unheard."""
        self._waiters[event_id] = asyncio.get_running_loop().create_future()

    async def wait(self, event_id: str, org_id: str, position: LogPosition, *, timeout: float) -> None:
        """Return once the event is archived (and projected: one transaction)."""
        future = self._waiters.get(event_id) or asyncio.get_running_loop().create_future()
        self._waiters[event_id] = future
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
                # A notification can be missed (the listening connection dropped): ask directly.
                if await self._archived(event_id, org_id):
                    return
        finally:
            self._waiters.pop(event_id, None)

    def forget(self, event_id: str) -> None:
        self._waiters.pop(event_id, None)

    async def _archived(self, event_id: str, org_id: str) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)
            return await conn.fetchval("SELECT true FROM event_archive WHERE event_id = $1", event_id) or False


class LogGuard:
    """Holds appends until the broker is known to hold the log, at start and after the broker
    restarts.

    A memory-only broker comes back empty; a produce that reaches it before its topic is
    re-created is acknowledged by the broker and then lost (shared/ENVIRONMENT.md). So the guard
    watches the topic list (an all-topics Metadata request creates nothing); when the domain
    topic is missing it closes the gate, re-creates the topics, restores the log from the
    archive, and opens the gate again. Appends in flight at the moment of a crash may still be
    lost by the broker; they are never archived, so they are never acknowledged."""

    def __init__(self, bootstrap: str, topics: LogTopics, recover, *, interval: float = 0.2) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self._recover = recover  # async () -> None: ensure topics, restore from the archive
        self._interval = interval
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.recoveries = 0

    async def start(self) -> None:
        await self._recover()
        self._ready.set()
        self._task = asyncio.create_task(self._watch(), name="log-guard")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_ready(self, timeout: float) -> None:
        if self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            raise Unavailable("the event log is being recovered after a broker restart; retry shortly",
                              reason="LOG_RECOVERING") from None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                present = self._topics.events in await existing_topics(self._bootstrap)
            except Exception as exc:  # broker down: hold appends until it is back and restored
                present = False
                log.warning("broker unreachable", error=str(exc))
            if present:
                continue
            self._ready.clear()
            while True:
                try:
                    await self._recover()
                    break
                except Exception as exc:
                    log.warning("log recovery failed; retrying", error=str(exc))
                    await asyncio.sleep(self._interval)
            self.recoveries += 1
            log.warning("log recovered after broker restart", recoveries=self.recoveries)
            self._ready.set()
