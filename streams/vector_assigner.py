"""Gives chunks the vectors of `embedding.recorded` events, after the projector has committed them.

The projector records an event's vectors (`content_vectors`) in its batch's transaction, and
chunks written from then on take them on insert. Chunks written before need an UPDATE, and each
updated chunk goes into the HNSW graph (~1 ms a vector here): inside the projector's
transaction a batch holding 64 vectors took 80-150 ms instead of ~15, and every acknowledgement
in it waited. So the worker hands each applied `embedding.recorded` to this assigner, which runs
them one at a time, in log order (so the last recorded vector wins, as live and replay agree), each
in a transaction of its own on another connection.

It never holds up the projector: its transaction gives up a row lock after `lock_timeout_ms`
(a rollback in the projector may hold some of the same chunks) and tries again a few times.
What it does not finish (a crash, a lock never free, PostgreSQL down) is found again by the
embedding backlog sweep: the chunks still lack a vector from the running model, and the pipeline
records the known vector again without recomputing it.
"""

from __future__ import annotations

import asyncio

import asyncpg
import structlog

from context_engine.projections.chunk_projection import assign_vectors_recorded_by

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

    async def run(self) -> None:
        while True:
            org_id, event_id = await self._queue.get()
            try:
                await self.assign(org_id, event_id)
            except Exception:  # never stop assigning; the sweep covers this one
                log.exception("vector assignment failed", org_id=org_id, event_id=event_id)

    async def assign(self, org_id: str, event_id: str) -> int:
        """Returns how many chunks got a vector; 0 when it gave up (the sweep will come)."""
        for attempt in range(1, self.attempts + 1):
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    await conn.execute("SELECT set_config('app.org_id', $1, true), set_config('lock_timeout', $2, true)",
                                       org_id, f"{self.lock_timeout_ms}ms")
                    return await assign_vectors_recorded_by(conn, org_id, event_id)
            except asyncpg.LockNotAvailableError:
                await asyncio.sleep(self.retry_after_s * attempt)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                log.exception("vectors not assigned; left for the backlog sweep", org_id=org_id, event_id=event_id)
                return 0
        log.warning("vectors not assigned: chunks stayed locked; left for the backlog sweep",
                    org_id=org_id, event_id=event_id, attempts=self.attempts)
        return 0
