"""Appending to the log.

`EventLog.append` produces a domain event keyed by its aggregate and returns its log position;
`LogGuard` keeps the producer closed while the broker does not hold the log. When an append is
durable, and so acknowledged, is streams/acknowledgement.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from context_engine.errors import InvalidArgument, Unavailable
from context_engine.events import Event
from context_engine.validation import MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE
from streams.record_auth import RecordSigner
from streams.topics import LogTopics

log = structlog.get_logger("context_engine.log")


@dataclass(frozen=True, slots=True)
class LogPosition:
    topic: str
    partition: int
    offset: int


# What one event on the log may take, so that every content up to MAX_CONTENT_BYTES is accepted end
# to end: the content travels base64-encoded (4 bytes per 3), its metadata as JSON text (at most
# 6 bytes per character, a control escaped as \u00XX), and the envelope (ids, scope, hashes,
# type, times) takes a few hundred bytes; the rest is headroom.
ENVELOPE_ALLOWANCE_BYTES = 64 * 1024
METADATA_CHARS = MAX_METADATA_ENTRIES * (MAX_METADATA_KEY + MAX_METADATA_VALUE)


def record_bytes_limit(max_content_bytes: int) -> int:
    return 4 * -(-max_content_bytes // 3) + 6 * METADATA_CHARS + ENVELOPE_ALLOWANCE_BYTES


def producer_request_bytes(max_record_bytes: int) -> int:
    """The producer's max_request_size: one such record and its batch framing."""
    return max_record_bytes + 16 * 1024


class EventLog:
    """The producer the command handlers share, fenced by a LogGuard.

    While the guard holds the log (at start, and from the moment the broker is lost until the
    log is restored), appends wait at the gate and the producer does not exist: a producer that
    outlived a broker restart would retry its in-flight batches against the fresh broker before
    the topics are back, which the bundled broker loses silently, or answers by crashing
    (measured: a segfault while serialising the ProduceResponse).

    Every record it writes carries the signer's authenticator (streams/record_auth.py); `security`
    is the broker's SASL/TLS (streams/kafka_security.py)."""

    def __init__(self, bootstrap: str, topics: LogTopics, recover, *, signer: RecordSigner,
                 security: Mapping[str, Any] | None = None, hold_timeout: float = 5.0,
                 watch_interval: float = 0.05, max_record_bytes: int = record_bytes_limit(1024 * 1024)) -> None:
        self.topics = topics
        self.max_record_bytes = max_record_bytes
        self._max_request_bytes = producer_request_bytes(max_record_bytes)
        self._bootstrap = bootstrap
        self._security = dict(security or {})
        self._signer = signer
        self._hold_timeout = hold_timeout
        self._producer: AIOKafkaProducer | None = None
        self.guard = LogGuard(bootstrap, topics, recover, open_log=self._open, close_log=self._close,
                              interval=watch_interval, security=self._security)

    async def start(self) -> None:
        await self.guard.start()

    async def stop(self) -> None:
        await self.guard.stop()
        await self._close()

    async def _open(self) -> None:
        # No idempotent producer on the bundled broker; a retried send may duplicate a record,
        # which the projector drops by event_id.
        # A long retry backoff keeps a batch whose connection died from being re-sent before the
        # guard (polling every 50 ms) has noticed the broker is gone and dropped this producer.
        producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", linger_ms=1,
                                    enable_idempotence=False, request_timeout_ms=5_000,
                                    retry_backoff_ms=1_000, max_request_size=self._max_request_bytes,
                                    **self._security)
        await producer.start()
        self._producer = producer

    async def _close(self) -> None:
        """Drop the producer without flushing: its batches must never reach a restarted broker.
        Their senders time out in `_send` and are answered UNAVAILABLE (never acknowledged)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        sender = producer._sender  # aiokafka has no public abort; stop() would flush
        if sender is not None and sender.sender_task is not None:
            sender.sender_task.cancel()
        with contextlib.suppress(Exception):
            await producer.client.close()
        producer._closed = True  # it is: sender cancelled, connections closed (no ResourceWarning at exit)

    async def append(self, event: Event) -> LogPosition:
        raw = event.to_bytes()
        if len(raw) > self.max_record_bytes:  # the handlers' limits keep every event below this
            raise InvalidArgument("request", f"encodes to a {len(raw)}-byte event; the log takes at most "
                                  f"{self.max_record_bytes}", reason="EVENT_TOO_LARGE")
        return await self._send(self.topics.events, raw, event.aggregate.encode())

    async def publish(self, topic: str, key: str, value: bytes) -> LogPosition:
        return await self._send(topic, value, key.encode())

    async def _send(self, topic: str, value: bytes, key: bytes) -> LogPosition:
        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception_type((KafkaError, asyncio.TimeoutError)),
                                               stop=stop_after_attempt(3),
                                               wait=wait_exponential(multiplier=0.05, max=1.0), reraise=True):
                with attempt:
                    await self.guard.wait_ready(self._hold_timeout)
                    producer = self._producer
                    if producer is None:  # lost between the gate and here
                        raise KafkaError("the log is being recovered")
                    headers = self._signer.headers(topic, key, value)  # each attempt: a rotation may have come
                    meta = await asyncio.wait_for(producer.send_and_wait(topic, value, key=key, headers=headers),
                                                  self._hold_timeout)
        except (KafkaError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"the event log is unavailable: {exc!r}", reason="LOG_UNAVAILABLE") from exc
        return LogPosition(meta.topic, meta.partition, meta.offset)


# The guard's probe: how long one answer may take, and how long the broker may stay silent before
# it counts as lost. A refused connection or a topic list without the domain topic acts at once;
# slow answers under CPU load (measured: > 0.25 s at load average 9) must not drop the producer.
PROBE_TIMEOUT_S = 0.5
SILENT_LIMIT_S = 2.0


class LogGuard:
    """Opens the log only when the broker is known to hold it: at start, and after the broker
    restarts.

    A memory-only broker comes back empty. The guard asks for the topic list every `interval`
    (an all-topics Metadata request creates nothing) over one long-lived client; the moment
    the broker is unreachable or the domain topic is gone it closes the gate and drops the
    producer, then re-creates the topics, restores the log from the archive, opens a fresh
    producer and opens the gate. Appends that were in flight at the crash are never archived,
    so they are never acknowledged."""

    def __init__(self, bootstrap: str, topics: LogTopics, recover, *, open_log, close_log,
                 interval: float = 0.05, security: Mapping[str, Any] | None = None) -> None:
        self._bootstrap = bootstrap
        self._security = dict(security or {})
        self._topics = topics
        self._recover = recover  # async () -> None: ensure topics, restore from the archive
        self._open_log = open_log
        self._close_log = close_log
        self._interval = interval
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._stopping = False
        self.recoveries = 0

    async def start(self) -> None:
        await self._recover()
        await self._open_log()
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap, request_timeout_ms=1000,
                                          **self._security)
        await self._admin.start()
        self._ready.set()
        self._task = asyncio.create_task(self._watch(), name="log-guard")

    async def stop(self) -> None:
        # A flag as well as cancel(): on Python 3.11 a wait_for that completes as it is cancelled
        # can swallow the cancellation, and the loop would go on. asyncio.wait never suppresses
        # our own caller's cancellation, unlike awaiting the task under suppress(CancelledError).
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2.0)
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()

    async def wait_ready(self, timeout: float) -> None:
        if self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            raise Unavailable("the event log is being recovered after a broker restart; retry shortly",
                              reason="LOG_RECOVERING") from None

    async def _log_present(self) -> bool | None:
        """True: the broker lists the domain topic. False: it answered without it, or refused the
        connection (restarted empty, or down). None: no answer in time, which on a loaded machine
        is usually just a slow answer."""
        try:
            assert self._admin is not None  # start() makes it before it starts _watch, the one caller
            topics = await asyncio.wait_for(self._admin.describe_topics(None), PROBE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return None
        except Exception:
            return False
        return any(t["topic"] == self._topics.events and t["error_code"] == 0 for t in topics)

    async def _watch(self) -> None:
        silent_since: float | None = None
        while not self._stopping:
            await asyncio.sleep(self._interval)
            present = await self._log_present()
            if present:
                silent_since = None
                continue
            if present is None:  # only a broker silent for a while counts as lost
                now = asyncio.get_running_loop().time()
                silent_since = silent_since if silent_since is not None else now
                if now - silent_since < SILENT_LIMIT_S:
                    continue
            silent_since = None
            self._ready.clear()
            await self._close_log()
            log.warning("broker lost or emptied: appends held until the log is restored")
            while not self._stopping:
                try:
                    await self._recover()
                    await self._open_log()
                    break
                except Exception as exc:
                    log.warning("log recovery failed; retrying", error=str(exc))
                    await asyncio.sleep(0.2)
            self.recoveries += 1
            log.warning("log recovered", recoveries=self.recoveries)
            self._ready.set()
