"""Lanes beside the session projector's batches, so that one org's megabytes do not sit in front of
every other org's events (issue #41, item 1).

The projector applies its batches one after the other; a record of a megabyte (archived verbatim,
its content stored) took ~50-80 ms to apply under load, and every event of any org fetched behind
it waited. A record over LANE_RECORD_BYTES goes instead to a lane of its org's own, a task that
applies what it is given in order on a connection of its own; every later record of that org
follows it into the lane until the lane is empty, so an org's events are applied in log order
(and a session's, in its chain's). Other orgs' records go on in the batches meanwhile.

The lane's events are held out of their batch's acknowledgement and acknowledged when the lane has
committed them: Faust commits a partition's offset only up to its first unacknowledged record, so
a crash redelivers them (and whatever came after, which the projector recognises as duplicates).
At most MAX_LANES lanes run at once; another org's large record waits in the batches as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from projections.projector.archive import decode_record
from projections.projector.outcome import Applied, ProjectionError
from projections.projector.records import LogRecord

E = TypeVar("E")

LANE_RECORD_BYTES = 256 * 1024
MAX_LANES = 2


class OrgLanes(Generic[E]):
    """`apply(records)` commits records of one org (a lane's own connection); `publish(applied)`
    does what the projector does after a commit (jobs, vector assignments); `ack(event)`
    acknowledges a held event."""

    def __init__(self, apply: Callable[[list[LogRecord]], Awaitable[list[Applied]]],
                 publish: Callable[[list[Applied]], Awaitable[None]], ack: Callable[[E], Awaitable[object]], *,
                 record_bytes: int = LANE_RECORD_BYTES, max_lanes: int = MAX_LANES, batch_max: int = 500) -> None:
        """`batch_max`: the most records a lane applies in one transaction (the projector's own
        batches' bound)."""
        self._apply, self._publish, self._ack = apply, publish, ack
        self._record_bytes, self._max_lanes, self._batch_max = record_bytes, max_lanes, batch_max
        self._queues: dict[str, list[tuple[LogRecord, E]]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def route(self, items: list[tuple[LogRecord, E]], hold: Callable[[E], None]) -> list[LogRecord]:
        """The records the batch applies now, in order; the others are queued to their org's lane
        and their events held (`hold`) from the batch's acknowledgement."""
        self.raise_failure()
        batch: list[LogRecord] = []
        for record, event in items:
            org = self._lane_of(record)
            if org is None:
                batch.append(record)
                continue
            hold(event)
            self._queues.setdefault(org, []).append((record, event))
            if org not in self._tasks:
                self._tasks[org] = asyncio.create_task(self._run(org), name=f"projector-lane-{org}")
        return batch

    def busy(self) -> list[str]:
        return sorted(self._tasks)

    def _lane_of(self, record: LogRecord) -> str | None:
        """The org whose lane takes `record`, or None for the batch."""
        if not self._tasks and len(record.raw) <= self._record_bytes:
            return None  # the usual case: nothing to decode
        try:
            org = decode_record(record).scope.org_id
        except ProjectionError:
            return None  # the batch sets it aside
        if org in self._tasks:
            return org
        if len(record.raw) > self._record_bytes and len(self._tasks) < self._max_lanes:
            return org
        return None

    async def _run(self, org: str) -> None:
        queue = self._queues[org]
        while queue:
            taken = queue[:self._batch_max]
            del queue[:self._batch_max]
            applied = await self._apply([record for record, _ in taken])
            await self._publish(applied)
            for _, event in taken:
                await self._ack(event)
        # No await between the last look at the queue and here: route() sees the lane open for
        # as long as it may still take a record.
        del self._tasks[org], self._queues[org]

    def raise_failure(self) -> None:
        """A lane that failed (not PostgreSQL's failing, which `apply` outlasts) fails the
        projector as a batch would: its events were never acknowledged, so a restart redelivers them."""
        for org, task in self._tasks.items():
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise RuntimeError(f"the projector lane of org {org!r} failed") from exc
