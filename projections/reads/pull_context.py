"""PullContext's reads (commands/pull_context.py): an agent's latest memory, or the memory a
named snapshot holds, and the wait for a pending version's PII scan. SQL through
projections.reads.sessions, no protobuf."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from context_engine.errors import NotFound, Unavailable
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from projections.reads import sessions as queries
from projections.store.pool import org_transaction


@dataclass(frozen=True)
class Pulled:
    version_hash: str
    memory: queries.MemoryVersion
    share_id: str = ""  # the grant a shared snapshot was read through
    snapshot_id: str = ""


async def read_memory(conn: asyncpg.Connection, org: str, agent_id: str, session_id: str, snapshot_name: str,
                      visible: Visibility) -> Pulled:
    """The memory `snapshot_name` of `session_id` holds of the agent, or the agent's latest
    (within `session_id` when given); NotFound when there is none the caller sees. A snapshot
    shared with the caller (a live `read` grant) reads as its creator sees it."""
    if snapshot_name:
        share_id = ""
        snapshot = await queries.snapshot_by_name(conn, org, session_id, snapshot_name, visible)
        if snapshot is None and (shared := await queries.shared_snapshot_by_name(conn, org, session_id,
                                                                                  snapshot_name, visible)):
            snapshot, share_id = shared
            visible = Visibility.of(Scope.from_path(snapshot.scope_path))  # as its creator saw it
        memory = None if snapshot is None else await queries.snapshot_memory(conn, org, snapshot, agent_id, visible)
        if snapshot is None or memory is None:
            raise NotFound(f"no snapshot {snapshot_name!r} holding memory of agent "
                           f"{agent_id!r} in session {session_id!r}",
                           reason="SNAPSHOT_NOT_FOUND", metadata={"field": "snapshot_name"})
        return Pulled(snapshot.version, memory, share_id, snapshot.snapshot_id)
    memory = await queries.latest_memory(conn, org, agent_id, session_id or None, visible)
    if memory is None:
        where = f" in session {session_id!r}" if session_id else ""
        raise NotFound(f"no memory for agent {agent_id!r}{where}", reason="MEMORY_NOT_FOUND")
    return Pulled(memory.content_sha256, memory)


async def await_scan(pool: asyncpg.Pool, memory: queries.MemoryVersion, timeout: float) -> queries.MemoryVersion:
    """The version once its PII scan is applied (bounded wait, then UNAVAILABLE)."""
    deadline = time.monotonic() + timeout
    while True:
        await asyncio.sleep(0.02)
        async with org_transaction(pool, memory.org_id, readonly=True) as conn:
            current = await queries.memory_by_event_id(conn, memory.org_id, memory.event_id)
        if current is not None and current.pii_status != "pending":
            return current
        if time.monotonic() > deadline:
            raise Unavailable(f"memory version {memory.content_sha256} is still being scanned for PII after "
                              f"{timeout:.1f}s; retry shortly", reason="PII_SCAN_PENDING")
