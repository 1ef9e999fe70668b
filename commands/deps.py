"""What the command handlers share, built once per API process (the composition root is
context_engine.api.app)."""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from commands.session_access import SessionOwners
from commands.write_budget import WriteBudget
from context_engine.config import Settings
from context_engine.errors import DomainError, InvalidArgument, Unavailable
from context_engine.events import EVENT_INGESTED, MEMORY_PUSHED, SESSION_ROLLED_BACK, SNAPSHOT_CREATED, Event
from inference.embedder import Embedder
from inference.query_vectors import QueryVectors
from projections.session_projector import REJECTED
from streams.freshness import SessionFreshness
from streams.log import ArchiveWatch, EventLog, RetryAdvice


class EventRejected(InvalidArgument):
    """The projector could not apply the event and set it aside (rejected_events): a definite
    answer, and a retry of the same request is set aside again."""

    def __init__(self, event_id: str) -> None:
        DomainError.__init__(self, f"the event could not be applied: it was set aside (event {event_id})",
                             reason="EVENT_REJECTED", metadata={"event_id": event_id})


def retry_advice(event: Event, idempotency_key: str = "") -> RetryAdvice:
    """What a caller told NOT_DURABLE_YET (or LOG_UNAVAILABLE) may do, true for each command:
    the event may still be applied later, so say what a retry does and give it what it needs."""
    p = event.payload
    if event.type in (EVENT_INGESTED, MEMORY_PUSHED) and idempotency_key:
        what = "event" if event.type == EVENT_INGESTED else "memory version"
        return RetryAdvice(f"retry with idempotency-key {idempotency_key}: a retry returns this {what} "
                           "if it was applied, and writes it once otherwise",
                           {"idempotency_key": idempotency_key})
    if event.type == SNAPSHOT_CREATED:
        return RetryAdvice(f"a retry with snapshot_name {p['name']!r} creates the snapshot if this one was "
                           "not applied, and answers ALREADY_EXISTS (SNAPSHOT_NAME_TAKEN) if it was (or if "
                           "another create of that name won)",
                           {"snapshot_name": p["name"], "snapshot_id": p["snapshot_id"]})
    if event.type == SESSION_ROLLED_BACK:
        return RetryAdvice(f"a retry rolls the session back to {p['target_version']} again: if this rollback "
                           "was applied and nothing was written to the session since, the state stays the "
                           "same (one more rollback is recorded); anything written since is rolled back too",
                           {"target_version_hash": p["target_version"]})
    return RetryAdvice("a retry appends a second event")


@dataclass
class Deps:
    settings: Settings
    log: EventLog
    watch: ArchiveWatch
    freshness: SessionFreshness
    pool: asyncpg.Pool
    owners: SessionOwners
    embedder: Embedder
    query_vectors: QueryVectors
    write_budget: WriteBudget = field(default_factory=lambda: WriteBudget(0, 1))  # none unless given

    async def append(self, event: Event, session_key: str, *, idempotency_key: str = "") -> str | None:
        """Append and return once the event is archived and projected: the acknowledgement point.
        Returns the projector's outcome (APPLIED, OUT_OF_SCOPE…), or None when it must be read back.
        An event the projector set aside is refused here (EventRejected), for every command.
        `idempotency_key`: the key a retry of this request sends (IngestEvent, PushContext), named
        in the UNAVAILABLE answers together with the event id."""
        advice = retry_advice(event, idempotency_key)
        async with self.freshness.appending(session_key):
            self.watch.expect(event.event_id)
            try:
                position = await self.log.append(event)
            except Unavailable as exc:  # a produce that timed out may still have landed
                self.watch.forget(event.event_id)
                raise Unavailable(f"{exc.message}; event {event.event_id} may have been appended and may "
                                  f"still be applied: {advice.text}", reason=exc.reason,
                                  metadata={**exc.metadata, "event_id": event.event_id, **advice.metadata}) from exc
            except BaseException:
                self.watch.forget(event.event_id)
                raise
            outcome = await self.watch.wait(event.event_id, event.scope.org_id, position,
                                            timeout=self.settings.ack_timeout_seconds, retry=advice)
        if outcome == REJECTED:
            raise EventRejected(event.event_id)
        return outcome
