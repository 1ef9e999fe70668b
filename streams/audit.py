"""The audit trail of cross-scope access, as the handlers record it (issue #21).

A handler that reads or assembles through a share grant, creates or revokes a share, or refuses a
cross-scope attempt calls `AuditTrail.record(AccessAttempt(...))` (streams/access_attempts.py). In
the API that is an
`AuditPublisher`: `record` only appends to a bounded queue in memory, and a background task
publishes batches on the audit:access stream as `StreamEnvelope(AuditAccessEvent)`s keyed by org
(streams/jobs.py `audit_access`), which the worker's audit-writer stores
(streams/agents/audit.py, projections/projector/audit_rows.py). So the hot path never waits for the log.

When the log does not take them, the failed events are retried with backoff while new ones queue;
a full queue drops the newest, counted (`context_engine_audit_events_total{result}`). `health()`
says so: degraded while publishing fails, or once events were dropped and nothing has been
published since. The API reports it on its own health service name and in its log, and stays
SERVING for every other call (docs/operations.md, "The audit trail").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from context_engine.metrics import AUDIT_EVENTS, AUDIT_EVENTS_PENDING
from streams.access_attempts import AccessAttempt
from streams.jobs import JobMessage, audit_access
from streams.log import EventLog

log = structlog.get_logger("context_engine.audit")

_PUBLISHED, _DROPPED, _FAILED = (AUDIT_EVENTS.labels(r) for r in ("published", "dropped", "failed"))


@dataclass(frozen=True)
class AuditHealth:
    ok: bool
    pending: int
    published: int
    dropped: int
    failed: int
    last_error: str = ""

    def __str__(self) -> str:
        if self.ok:
            return (f"audit: ok, {self.published} published, {self.pending} pending"
                    + (f", {self.dropped} dropped earlier" if self.dropped else ""))
        return (f"audit: degraded, {self.dropped} dropped, {self.failed} failed publishes, {self.pending} pending"
                + (f", last error: {self.last_error}" if self.last_error else ""))


class AuditPublisher:
    """The API's AuditTrail: `record` queues (up to `max_pending` events, queued or being retried);
    the task started by `start` publishes up to `batch_max` events at a time, each batch taking what
    came within `flush_within_s` of its first event. Run on the event loop of its callers."""

    def __init__(self, log: EventLog, topic: str, *, max_pending: int = 10_000, batch_max: int = 500,
                 flush_within_s: float = 0.05, retry_max_s: float = 5.0) -> None:
        self._log = log
        self._topic = topic
        self._max_pending = max_pending
        self._batch_max = batch_max
        self._flush_within_s = flush_within_s
        self._retry_max_s = retry_max_s
        self._queue: collections.deque[tuple[float, AccessAttempt]] = collections.deque()  # (arrived, attempt)
        self._retrying: list[JobMessage] = []  # the batch being published or retried
        self._arrived = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._closed = False
        self._published = self._dropped = self._failed = 0
        self._failing = False
        self._dropped_since_published = False
        self._last_error = ""

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._retrying)

    def record(self, attempt: AccessAttempt) -> None:
        try:
            if self._closed or self.pending >= self._max_pending:
                self._drop(1)
                return
            self._queue.append((time.monotonic(), attempt))
            self._arrived.set()
            if len(self._queue) >= self._batch_max:
                self._batch_full.set()
            AUDIT_EVENTS_PENDING.set(self.pending)
        except Exception:  # the caller's call goes on whatever happens here
            with contextlib.suppress(Exception):
                self._drop(1)

    def health(self) -> AuditHealth:
        died = self._task is not None and self._task.done() and not self._stopping
        error = self._last_error or ("the publishing task ended" if died else "")
        return AuditHealth(ok=not (self._failing or self._dropped_since_published or died), pending=self.pending,
                           published=self._published, dropped=self._dropped, failed=self._failed, last_error=error)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="audit-publisher")
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._last_error = f"the publishing task failed: {exc!r}"
            log.error("audit publisher failed; audit events are no longer published", error=repr(exc))

    async def stop(self, timeout: float = 5.0) -> None:
        """Publish what is pending, for at most `timeout` seconds; what is left then is dropped
        (counted). Later records are dropped too."""
        self._stopping = True
        self._arrived.set()
        self._batch_full.set()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=timeout)
            if not done:
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
        self._closed = True
        if lost := self.pending:
            self._queue.clear()
            self._retrying = []
            self._drop(lost)
            log.warning("audit events not published at shutdown", dropped=lost, last_error=self._last_error)

    def _drop(self, n: int) -> None:
        self._dropped += n
        self._dropped_since_published = True
        _DROPPED.inc(n)
        AUDIT_EVENTS_PENDING.set(self.pending)

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            window = self._queue[0][0] + self._flush_within_s - time.monotonic()  # opened by the first event
            if len(self._queue) < self._batch_max and not self._stopping and window > 0:
                self._batch_full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._batch_full.wait(), window)
            batch = [self._queue.popleft()[1] for _ in range(min(len(self._queue), self._batch_max))]
            messages = None
            try:
                messages = self._messages(batch)
                await self._publish(messages)
            except Exception as exc:  # a fault of ours: what is left of the batch is lost, counted; the trail goes on
                lost = len(batch) if messages is None else len(self._retrying)
                self._retrying = []
                self._last_error = f"publishing failed: {exc!r}"
                self._drop(lost)
                log.exception("audit events lost", dropped=lost)

    def _messages(self, batch: list[AccessAttempt]) -> list[JobMessage]:
        messages = []
        for attempt in batch:
            try:
                messages.append(audit_access(attempt))
            except Exception as exc:  # a value protobuf refuses: that event cannot be published
                self._last_error = f"not encodable: {exc!r}"
                self._drop(1)
                log.error("audit event not encodable; dropped", error=repr(exc))
        return messages

    async def _publish(self, messages: list[JobMessage]) -> None:
        """Publish the batch; retry what failed with backoff until it is on the log (or `stop`
        gives up on it)."""
        delay = 0.1
        self._retrying = messages
        while self._retrying:
            results = await asyncio.gather(
                *(self._log.publish(self._topic, m.key.decode(), m.value) for m in self._retrying),
                return_exceptions=True)
            failed = [(m, r) for m, r in zip(self._retrying, results, strict=True) if isinstance(r, BaseException)]
            published = len(self._retrying) - len(failed)
            self._published += published
            _PUBLISHED.inc(published)
            self._retrying = [m for m, _ in failed]
            AUDIT_EVENTS_PENDING.set(self.pending)
            if published:
                self._dropped_since_published = False
            if not failed:
                self._failing = False
                return
            self._failed += len(failed)
            _FAILED.inc(len(failed))
            self._last_error = repr(failed[0][1])
            if not self._failing:
                log.warning("audit events not published; retrying", events=len(failed), error=self._last_error)
            self._failing = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max_s)


async def follow_health(publisher: AuditPublisher, on_change: Callable[[AuditHealth], Awaitable[None]], *,
                        interval: float = 1.0) -> None:
    """Call `on_change(health)` whenever the publisher turns degraded or ok again (and log it);
    runs until cancelled."""
    ok = True
    while True:
        await asyncio.sleep(interval)
        health = publisher.health()
        if health.ok != ok:
            ok = health.ok
            (log.info if ok else log.warning)(str(health))
            await on_change(health)
