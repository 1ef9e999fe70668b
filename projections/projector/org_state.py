"""What an applier may use of the org it applies an event to (OrgApplier is the one that has
it): the batch's connection and org, the version chain, the rows pending for session_events and
memory_versions, the chunk projection, the idempotency keys of the batch's sessions, and `flush`
before a read-back. Appliers name this, never OrgApplier, which dispatches to them."""

from __future__ import annotations

from typing import Protocol

import asyncpg

from projections.projector.chunks import ChunkProjection

from .rows import PendingRows
from .session_rows import MemoryVersionRow, SessionEventRow
from .version_chain import VersionChain


class OrgState(Protocol):
    conn: asyncpg.Connection
    org_id: str
    chain: VersionChain
    used_keys: set[tuple[str, str, str]]  # (session_id, writer scope path, idempotency_key)
    session_events: PendingRows[SessionEventRow]
    memory_versions: PendingRows[MemoryVersionRow]
    chunks: ChunkProjection

    async def flush(self) -> None: ...
