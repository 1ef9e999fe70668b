"""The read-back port: what a write command reads after its append, to answer a retry or a race
with the first request's result (commands/idempotency.py).

Commands depend on the `ReadBack` protocol; the API wires `PostgresReadBack` (the projections'
read models), the unit tests an in-memory fake (tests/fixtures/fakes.py). Both are held to one
contract (tests/contracts/test_read_back_contract.py). Each read is a read-only transaction of
its own: the projector archives and projects an event in one transaction, so two reads never see
an event archived in one and its projection missing in a later one unless it was never projected.
"""

from __future__ import annotations

from typing import Protocol

import asyncpg

from projections.reads import sessions
from projections.reads.sessions import ArchivedEvent, MemoryVersion, SessionEvent
from projections.store.pool import org_transaction


class ReadBack(Protocol):
    async def archived(self, org_id: str, event_id: str) -> ArchivedEvent | None:
        """The archived event, projected or not; None when unknown (or not a UUID)."""

    async def ingested(self, org_id: str, event_id: str) -> SessionEvent | None:
        """The session event an IngestEvent projected; None when not projected."""

    async def ingested_with_key(self, org_id: str, key: str, session_id: str,
                                writer_scope_path: str) -> SessionEvent | None:
        """The session event that won a client's idempotency key in this session at this writer
        scope (rolled back or not); None when none did."""

    async def pushed(self, org_id: str, event_id: str) -> MemoryVersion | None:
        """The memory version a PushContext projected; None when not projected."""


class PostgresReadBack:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def archived(self, org_id: str, event_id: str) -> ArchivedEvent | None:
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            return await sessions.archived_event(conn, org_id, event_id)

    async def ingested(self, org_id: str, event_id: str) -> SessionEvent | None:
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            return await sessions.event_by_id(conn, org_id, event_id)

    async def ingested_with_key(self, org_id: str, key: str, session_id: str,
                                writer_scope_path: str) -> SessionEvent | None:
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            return await sessions.event_by_idempotency_key(conn, org_id, key, session_id, writer_scope_path)

    async def pushed(self, org_id: str, event_id: str) -> MemoryVersion | None:
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            return await sessions.memory_by_event_id(conn, org_id, event_id)
