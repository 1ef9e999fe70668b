"""PullContext: an agent's latest memory, or the memory a named snapshot holds. Always read from
PostgreSQL (the primary), never from a cache.

Pushed memory is returned only after its PII scan (docs/pii.md): a version still 'pending' is
waited for (bounded by `pii_scan_wait_seconds`, then UNAVAILABLE), so raw content never leaves
the engine; a quarantined version comes back as the regex fallback redacted it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from context_engine import validation
from context_engine.auth import Principal
from context_engine.errors import InvalidArgument, NotFound, Unavailable
from projections import queries
from projections.database import org_transaction
from streams.freshness import SessionFreshness
from context_engine.visibility import Visibility


@dataclass(frozen=True)
class PullContext:
    agent_id: str
    session_id: str = ""
    snapshot_name: str = ""


@dataclass(frozen=True)
class Pulled:
    version_hash: str
    memory: queries.MemoryVersion


async def pull_context(pool, freshness: SessionFreshness, principal: Principal, query: PullContext,
                       *, pii_scan_wait_seconds: float = 5.0) -> Pulled:
    pulled = await _pull(pool, freshness, principal, query)
    if pulled.memory.pii_status == "pending":
        pulled = dataclasses.replace(pulled, memory=await await_scan(pool, pulled.memory, pii_scan_wait_seconds))
    return pulled


async def await_scan(pool, memory: queries.MemoryVersion, timeout: float) -> queries.MemoryVersion:
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


async def _pull(pool, freshness: SessionFreshness, principal: Principal, query: PullContext) -> Pulled:
    if query.agent_id:
        validation.agent_id(query.agent_id)
    if query.session_id:
        validation.session_id(query.session_id)
    if query.snapshot_name:
        validation.name(query.snapshot_name, "snapshot_name")
    if query.snapshot_name and not query.session_id:
        raise InvalidArgument("session_id", "is required with snapshot_name (snapshots belong to a session)")
    org = principal.scope.org_id
    agent_id = query.agent_id or principal.scope.agent_id
    if query.session_id:
        await freshness.wait(f"{org}/{query.session_id}")
    visible = Visibility.of(principal.scope)
    async with org_transaction(pool, org, readonly=True) as conn:
        if query.snapshot_name:
            snapshot = await queries.snapshot_by_name(conn, org, query.session_id, query.snapshot_name, visible)
            memory = snapshot and await queries.snapshot_memory(conn, org, snapshot, agent_id, visible)
            if memory is None:
                raise NotFound(f"no snapshot {query.snapshot_name!r} holding memory of agent "
                               f"{agent_id!r} in session {query.session_id!r}",
                               reason="SNAPSHOT_NOT_FOUND", metadata={"field": "snapshot_name"})
            return Pulled(snapshot.version, memory)
        memory = await queries.latest_memory(conn, org, agent_id, query.session_id or None, visible)
    if memory is None:
        where = f" in session {query.session_id!r}" if query.session_id else ""
        raise NotFound(f"no memory for agent {agent_id!r}{where}", reason="MEMORY_NOT_FOUND")
    return Pulled(memory.content_sha256, memory)
