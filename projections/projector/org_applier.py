"""One org's fresh events of a batch, applied in log order by the applier of each type."""

from __future__ import annotations

import asyncpg

from context_engine.events import Event
from projections.projector.chunks import BulkLoad, ChunkProjection
from projections.projector.records import LogRecord
from projections.store.statement_batch import NOTHING, StatementBatch

from .appliers import APPLIERS, PRELOADS, SESSION_TYPES
from .outcome import Applied, ProjectionOutcome, applied, session_id_of
from .rows import PendingRows, columns
from .session_rows import INSERT_MEMORY_VERSIONS, INSERT_SESSION_EVENTS, MemoryVersionRow, SessionEventRow
from .version_chain import VersionChain


class OrgApplier:
    """Chain state lives in memory and rows are written in bulk; appliers that read rows back
    (rollbacks, snapshots, scans) flush first.

    Session ownership: a session belongs to the scope of the event that created it (its first
    ingested event or pushed memory; sessions.scope_path). An event of a session type whose scope
    is not that owner scope or below it changes nothing (OUT_OF_SCOPE): the handlers check this
    before appending, and this is the guard for two scopes racing to create the same session
    (the handler then finds no row for its event_id)."""

    def __init__(self, conn: asyncpg.Connection, org_id: str, bulk: BulkLoad | None = None) -> None:
        self.conn = conn
        self.org_id = org_id
        self.chain = VersionChain(conn, org_id)
        self.used_keys: set[tuple[str, str, str]] = set()  # (session_id, writer scope path, idempotency_key)
        self.session_events = PendingRows(INSERT_SESSION_EVENTS, SessionEventRow)
        self.memory_versions = PendingRows(INSERT_MEMORY_VERSIONS, MemoryVersionRow)
        self.chunks = ChunkProjection(conn, org_id, bulk=bulk)

    async def preload(self, events: list[Event]) -> None:
        """Before the first of `events` applies: their sessions' chain state, and the idempotency
        keys their appliers claim (appliers.PRELOADS), each read once for the batch."""
        await self.chain.load({sid for ev in events if (sid := session_id_of(ev))})
        await self._load_idempotency_keys(
            {claim for ev in events if (pre := PRELOADS.get(ev.type)) and (claim := pre(ev))})

    async def _load_idempotency_keys(self, keys: set[tuple[str, str, str]]) -> None:
        if keys:
            sessions, writers, values = columns(sorted(keys), 3)
            rows = await self.conn.fetch(
                "SELECT e.session_id, e.scope_path, e.idempotency_key FROM session_events e "
                "JOIN unnest($2::text[], $3::text[], $4::text[]) AS u(session_id, scope_path, k) "
                "  ON e.session_id = u.session_id AND e.scope_path = u.scope_path AND e.idempotency_key = u.k "
                "WHERE e.org_id = $1",
                self.org_id, sessions, writers, values)
            self.used_keys.update((r["session_id"], r["scope_path"], r["idempotency_key"]) for r in rows)

    async def apply(self, rec: LogRecord, ev: Event) -> Applied:
        sid = session_id_of(ev)
        if ev.type in SESSION_TYPES and sid in self.chain.sessions and not self.chain.sessions[sid].admits(ev.scope):
            return applied(rec, ev, ProjectionOutcome.OUT_OF_SCOPE)
        if (applier := APPLIERS.get(ev.type)) is None:
            return applied(rec, ev, ProjectionOutcome.IGNORED)  # another projector's event: archived, nothing more
        return await applier(self, rec, ev)

    async def finish(self) -> None:
        await self.flush(sessions=True)

    async def flush(self, *, sessions: bool = False) -> None:
        """Write the pending rows, and with `sessions` the sessions' chain state, in one round trip."""
        batch = StatementBatch()
        self.chain.stage_items(batch)
        self.session_events.stage(batch, self.org_id)
        self.memory_versions.stage(batch, self.org_id)
        if sessions:
            self.chain.stage_sessions(batch)
        chunks = self.chunks.stage(batch)
        rows = await batch.run(self.conn, chunks or NOTHING)
        if chunks:
            await self.chunks.written(rows)
