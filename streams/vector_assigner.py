"""Gives chunks the vectors of `embedding.recorded` events, after the projector has committed them.

The projector records an event's vectors (`content_vectors`) in its batch's transaction, and
chunks written from then on take them on insert. Chunks written before need an UPDATE, and each
updated chunk goes into the HNSW graph (~1 ms a vector here): inside the projector's
transaction a batch holding 64 vectors took 80-150 ms instead of ~15, and every acknowledgement
in it waited. So the projector only notes the event in `vector_assignments` (same transaction),
the worker hands it to this assigner after the commit, and the assigner gives the vectors to the
chunks in a transaction of its own on another connection, removing the note in it. Assignment
is order-independent (a vector is given only where it is still the latest recorded for its
content, `chunk_projection.assign_vectors_recorded_by`), so live read models equal a replay's
whatever the order or the retries.

It never waits long on the projector: its transaction gives up a row lock after
`lock_timeout_ms` (a rollback in the projector may hold some of the same chunks) and tries again
a few times. A note it could not finish stays in `vector_assignments`; a worker starting again
resumes every note left (`resume`).
"""

from __future__ import annotations

import asyncio

import asyncpg
import structlog

from context_engine.metrics import VECTOR_ASSIGNMENT_SECONDS, VECTOR_ASSIGNMENTS_WAITING
from projections.projector.chunks import assign_vectors_recorded_by, pending_vector_assignments
from projections.store.pool import SYSTEM_ORG, org_transaction

log = structlog.get_logger("context_engine.vectors")


class VectorAssigner:
    def __init__(self, pool: asyncpg.Pool, *, lock_timeout_ms: int = 200, attempts: int = 5,
                 retry_after_s: float = 0.1) -> None:
        self.pool = pool
        self.lock_timeout_ms = lock_timeout_ms
        self.attempts = attempts
        self.retry_after_s = retry_after_s
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def put(self, org_id: str, event_id: str) -> None:
        """An `embedding.recorded` event the projector has committed."""
        self._queue.put_nowait((org_id, event_id))
        VECTOR_ASSIGNMENTS_WAITING.inc()

    async def resume(self) -> int:
        """Queue every assignment a previous run left; returns how many."""
        async with org_transaction(self.pool, SYSTEM_ORG, readonly=True) as conn:
            left = await pending_vector_assignments(conn)
        for org_id, event_id in left:
            self.put(org_id, event_id)
        return len(left)

    async def run(self) -> None:
        while True:
            org_id, event_id = await self._queue.get()
            try:
                with VECTOR_ASSIGNMENT_SECONDS.time():
                    await self.assign(org_id, event_id)
            except Exception:  # never stop assigning; the note stays for the next start
                log.exception("vector assignment failed", org_id=org_id, event_id=event_id)
            finally:
                VECTOR_ASSIGNMENTS_WAITING.dec()

    async def assign(self, org_id: str, event_id: str) -> int:
        """Returns how many chunks got a vector; 0 when it gave up (the note stays)."""
        for attempt in range(1, self.attempts + 1):
            try:
                lock_timeout = {"lock_timeout": f"{self.lock_timeout_ms}ms"}
                async with org_transaction(self.pool, org_id, local=lock_timeout) as conn:
                    return await assign_vectors_recorded_by(conn, org_id, event_id)
            except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
                await asyncio.sleep(self.retry_after_s * attempt)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                log.exception("vectors not assigned; left for the next start", org_id=org_id, event_id=event_id)
                return 0
        log.warning("vectors not assigned: chunks stayed locked; left for the next start",
                    org_id=org_id, event_id=event_id, attempts=self.attempts)
        return 0
