"""The acknowledgement protocol: a write is answered only once the worker has archived and
projected it, so an acknowledged event survives a crash of a memory-only broker.

1. `append_and_wait` registers interest in the event id (`ArchiveWatch.expect`), then appends the
   event to the log (streams/log.py `EventLog`).
2. The worker's projector commits the batch holding it and, in that same transaction, NOTIFYs
   `ARCHIVED_CHANNEL` with `announcement(applied)`: "event_id:OUTCOME,..." (delivered at COMMIT).
3. The API's listening connection parses the payload (`parse_payload`) and resolves the waiter's
   future with the projector's outcome (APPLIED, DUPLICATE, OUT_OF_SCOPE...); the command answers.
4. A notification can be missed (a reconnect, or one sent before the wait began): every
   poll interval the waiter asks event_archive / rejected_events directly (outcome read back).
5. No decision within ack_timeout_seconds: UNAVAILABLE NOT_DURABLE_YET, never an acknowledgement;
   the message and ErrorInfo say what a retry of that command does (the `RetryAdvice` it passes).
6. REJECTED (the projector set the event aside): a definite answer, `EventRejected`.
Read-your-writes, the same promise seen from a read, is streams/freshness.py: the append holds a
SessionFreshness registration until its answer, and a read of the session waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import asyncpg

from context_engine.errors import DomainError, InvalidArgument, Unavailable
from context_engine.events import Event, SessionRef
from projections.projector.outcome import Applied, ProjectionOutcome
from streams.freshness import SessionFreshness
from streams.log import EventLog, LogPosition

ARCHIVED_CHANNEL = "event_archived"

# NOTIFY payloads are limited to 8,000 bytes: at most this many "event_id:OUTCOME" per notification.
IDS_PER_NOTIFICATION = 120


# --- The worker's side: what the projector announces at COMMIT ---------------------------------

def archived_payloads(outcomes: list[tuple[str, str]]) -> list[str]:
    """The notifications announcing one committed batch: each event id with what the projector
    did with it (APPLIED, DUPLICATE, OUT_OF_SCOPE…), so the waiting command knows its result
    without reading it back.

    Ids, not offsets: after a memory-only broker is restored, offsets are reused, and a
    notification about a restored record at "my" offset must never acknowledge my event."""
    items = [f"{event_id}:{outcome}" for event_id, outcome in outcomes]
    return [",".join(items[i:i + IDS_PER_NOTIFICATION]) for i in range(0, len(items), IDS_PER_NOTIFICATION)]


def announcement(applied: list[Applied]) -> tuple[str, list[str]]:
    """The projector's `notify` callback: the channel and payloads it renders as pg_notify in the
    batch's transaction (projections/projector/batch.py `_closing`)."""
    # A record too broken to name its event (rejected undecodable) has no waiter to answer.
    return ARCHIVED_CHANNEL, archived_payloads([(a.event_id, a.outcome) for a in applied if a.event_id])


# --- The API's side: hearing it ------------------------------------------------------------------

def parse_payload(payload: str) -> list[tuple[str, str]]:
    """(event_id, outcome) for each item of one notification, in order."""
    return [(event_id, outcome) for event_id, _, outcome in (item.partition(":") for item in payload.split(","))]


@dataclass(frozen=True, slots=True)
class RetryAdvice:
    """What an unacknowledged command's caller is told a retry does (`text`, the end of the
    NOT_DURABLE_YET message), and what the retry needs (ErrorInfo metadata, e.g. idempotency_key)."""

    text: str
    metadata: dict[str, str] = field(default_factory=dict)


# What a retry of a command that says nothing more does.
APPENDS_AGAIN = RetryAdvice("a retry appends a second event")


class EventRejected(InvalidArgument):
    """The projector could not apply the event and set it aside (rejected_events): a definite
    answer, and a retry of the same request is set aside again."""

    def __init__(self, event_id: str) -> None:
        DomainError.__init__(self, f"the event could not be applied: it was set aside (event {event_id})",
                             reason="EVENT_REJECTED", metadata={"event_id": event_id})


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
        for event_id, outcome in parse_payload(payload):
            future = self._waiters.get(event_id)
            if future is not None and not future.done():
                future.set_result(outcome)

    def expect(self, event_id: str) -> None:
        """Register interest before appending, so a notification cannot arrive unheard."""
        self._waiters[event_id] = asyncio.get_running_loop().create_future()

    async def wait(self, event_id: str, org_id: str, position: LogPosition, *, timeout: float,
                   retry: RetryAdvice = APPENDS_AGAIN) -> str | None:
        """Return once the event is archived (and projected: one transaction): the projector's
        outcome, or None when the archive was asked directly and the caller must read back.
        After `timeout`: UNAVAILABLE (NOT_DURABLE_YET), saying what `retry` of the command does;
        its ErrorInfo metadata carries `event_id` and the retry's own (e.g. `idempotency_key`)."""
        future = self._waiters.get(event_id) or asyncio.get_running_loop().create_future()
        self._waiters[event_id] = future
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Unavailable(
                        f"event {event_id} was appended at {position.topic}/{position.partition}"
                        f"@{position.offset} but not archived within {timeout:.1f}s: it is not "
                        f"acknowledged, and it may still be applied; {retry.text}",
                        reason="NOT_DURABLE_YET", metadata={"event_id": event_id, **retry.metadata})
                with contextlib.suppress(asyncio.TimeoutError):
                    return await asyncio.wait_for(asyncio.shield(future), min(self._poll, remaining))
                # A notification can be missed (the listening connection dropped): ask directly.
                if (found := await self._archived(event_id, org_id)) is not None:
                    return found or None
        finally:
            self._waiters.pop(event_id, None)

    def waiting(self) -> int:
        """How many appends are waiting for their acknowledgement now."""
        return len(self._waiters)

    def forget(self, event_id: str) -> None:
        self._waiters.pop(event_id, None)

    async def _archived(self, event_id: str, org_id: str) -> str | None:
        """Whether the projector has decided: '' when the event is archived (the caller reads its
        outcome back), 'REJECTED' (its outcome) when it was set aside instead, None when neither yet."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)
            return await conn.fetchval(
                "SELECT CASE WHEN EXISTS (SELECT FROM event_archive WHERE event_id = $1) THEN '' "
                "WHEN EXISTS (SELECT FROM rejected_events WHERE event_id = $1) THEN 'REJECTED' END",
                event_id)


async def append_and_wait(log: EventLog, watch: ArchiveWatch, freshness: SessionFreshness | None, event: Event,
                          session: SessionRef | None, *, timeout: float,
                          retry: RetryAdvice = APPENDS_AGAIN) -> str | None:
    """Append and return once the event is archived and projected: the acknowledgement point.
    Returns the projector's outcome (APPLIED, OUT_OF_SCOPE…), or None when it must be read back.
    An event the projector set aside is refused here (EventRejected), for every command.
    `retry`: what the command's caller is told a retry does, in the UNAVAILABLE answers together
    with the event id. `session` None: an event of no session (a share grant, a guardrail layer),
    which no session read waits for; `freshness` may then be None."""
    async with freshness.appending(session) if freshness and session else contextlib.nullcontext():
        watch.expect(event.event_id)
        try:
            position = await log.append(event)
        except Unavailable as exc:  # a produce that timed out may still have landed
            watch.forget(event.event_id)
            raise Unavailable(f"{exc.message}; event {event.event_id} may have been appended and may "
                              f"still be applied: {retry.text}", reason=exc.reason,
                              metadata={**exc.metadata, "event_id": event.event_id, **retry.metadata}) from exc
        except BaseException:
            watch.forget(event.event_id)
            raise
        outcome = await watch.wait(event.event_id, event.scope.org_id, position, timeout=timeout, retry=retry)
    if outcome == ProjectionOutcome.REJECTED:
        raise EventRejected(event.event_id)
    return outcome
