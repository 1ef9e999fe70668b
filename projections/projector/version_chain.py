"""The sessions' version chains (context_engine.hashing), kept in memory for one org's batch.

v0 = SessionRef(org_id, session_id).genesis; a new item gets seq = max_seq + 1 (seq is monotonic
and never reused) and version = next_version(current version, Event.content_hash); after a
rollback the next item chains from the target version. The chain is a pure function of log
order, so the live worker and replay produce the same versions.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from context_engine.events import Event, SessionRef
from context_engine.hashing import next_version
from context_engine.scope import Scope
from projections.store.statement_batch import StatementBatch

from .rows import PendingRows, columns
from .session_rows import ChainItemRow


@dataclass(slots=True)
class SessionState:
    """A session's row: its owner scope and where its chain stands."""

    session_id: str
    scope_path: str
    pillar_id: str
    team_id: str
    scope_agent_id: str
    genesis: str
    version: str
    seq: int
    max_seq: int
    item_count: int
    active_count: int
    created_at: dt.datetime
    updated_at: dt.datetime
    last_event_id: str
    dirty: bool = False

    def owner(self, org_id: str) -> Scope:
        return Scope(org_id, self.pillar_id, self.team_id, self.scope_agent_id)

    def admits(self, scope: Scope) -> bool:
        """Whether an event written at `scope` may change this session: owner scope or below."""
        return scope.is_within(self.owner(scope.org_id))


class VersionChain:
    """One org's sessions touched by a batch, their new items and versions, written in bulk."""

    def __init__(self, conn: asyncpg.Connection, org_id: str) -> None:
        self.conn = conn
        self.org_id = org_id
        self.sessions: dict[str, SessionState] = {}
        self._items = PendingRows(_INSERT_ITEMS, ChainItemRow)
        self._versions: dict[tuple[str, str], tuple[Any, ...]] = {}  # one row per (session, version)

    async def load(self, session_ids: set[str]) -> None:
        """Read (and lock) the sessions the batch's events name."""
        if not session_ids:
            return
        rows = await self.conn.fetch(
            "SELECT * FROM sessions WHERE org_id = $1 AND session_id = ANY($2::text[]) FOR UPDATE",
            self.org_id, sorted(session_ids))
        for r in rows:
            self.sessions[r["session_id"]] = SessionState(
                r["session_id"], r["scope_path"], r["pillar_id"], r["team_id"], r["scope_agent_id"],
                r["genesis"], r["version"], r["seq"], r["max_seq"], r["item_count"],
                r["active_count"], r["created_at"], r["updated_at"], str(r["last_event_id"]))

    def session(self, session_id: str, ev: Event) -> SessionState:
        """The session, created at its genesis version (owned by `ev`'s scope) if it is new."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("payload.session_id is empty")
        s = self.sessions.get(session_id)
        if s is None:
            v0 = SessionRef(self.org_id, session_id).genesis
            sc = ev.scope
            s = SessionState(session_id, sc.path, sc.pillar_id, sc.team_id, sc.agent_id, v0, v0, 0, 0,
                             0, 0, ev.occurred, ev.occurred, ev.event_id, dirty=True)
            self.sessions[session_id] = s
            self._versions[(session_id, v0)] = (session_id, v0, 0, 0, ev.event_id, ev.occurred)
        return s

    def append(self, s: SessionState, ev: Event, kind: str, *, replacing: int = 0) -> tuple[int, str]:
        """A new item (`kind` 'event' or 'memory') on the session's chain: its (seq, version).
        `replacing`: how many active items it replaces (a compaction's summary)."""
        seq = s.max_seq + 1
        version = next_version(s.version, ev.content_hash)
        active = s.active_count + 1 - replacing
        self._items.append(ChainItemRow(s.session_id, seq, ev.event_id, kind, ev.content_hash, s.seq, version,
                                        ev.occurred))
        self._versions[(s.session_id, version)] = (s.session_id, version, seq, active, ev.event_id, ev.occurred)
        s.version, s.seq, s.max_seq = version, seq, seq
        s.item_count += 1
        s.active_count = active
        s.updated_at, s.last_event_id, s.dirty = ev.occurred, ev.event_id, True
        return seq, version

    def rolled_back(self, s: SessionState, ev: Event, target: str, seq: int, depth: int) -> None:
        """The session's state became version `target` (item `seq`, `depth` active items)."""
        s.version, s.seq, s.active_count = target, seq, depth
        s.updated_at, s.last_event_id, s.dirty = ev.occurred, ev.event_id, True

    def stage_items(self, batch: StatementBatch) -> None:
        """Queue the new items and versions in `batch`."""
        self._items.stage(batch, self.org_id)
        if self._versions:
            batch.add(_INSERT_VERSIONS, self.org_id, *columns(self._versions.values(), 6))
            self._versions = {}

    def stage_sessions(self, batch: StatementBatch) -> None:
        """Queue the changed sessions' rows in `batch`."""
        dirty = [s for s in self.sessions.values() if s.dirty]
        if dirty:
            batch.add(_UPSERT_SESSIONS, self.org_id, *columns(
                ((s.session_id, s.scope_path, s.pillar_id, s.team_id, s.scope_agent_id, s.genesis,
                  s.version, s.seq, s.max_seq, s.item_count, s.active_count, s.created_at,
                  s.updated_at, s.last_event_id) for s in dirty), 14))


_INSERT_ITEMS = """
INSERT INTO session_items (org_id, session_id, seq, event_id, kind, content_hash, prev_seq,
                           version, occurred_at)
SELECT $1, u.* FROM unnest($2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::text[],
                           $7::bigint[], $8::text[], $9::timestamptz[]) AS u
"""
_INSERT_VERSIONS = """
INSERT INTO session_versions (org_id, session_id, version, seq, depth, introduced_by, at)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::uuid[],
                           $7::timestamptz[]) AS u
ON CONFLICT (org_id, session_id, version) DO UPDATE
SET seq = EXCLUDED.seq, depth = EXCLUDED.depth, introduced_by = EXCLUDED.introduced_by, at = EXCLUDED.at
"""
_UPSERT_SESSIONS = """
INSERT INTO sessions (org_id, session_id, scope_path, pillar_id, team_id, scope_agent_id, genesis,
                      version, seq, max_seq, item_count, active_count, created_at, updated_at,
                      last_event_id)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                           $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[],
                           $13::timestamptz[], $14::timestamptz[], $15::uuid[]) AS u
ON CONFLICT (org_id, session_id) DO UPDATE
SET version = EXCLUDED.version, seq = EXCLUDED.seq, max_seq = EXCLUDED.max_seq,
    item_count = EXCLUDED.item_count, active_count = EXCLUDED.active_count,
    updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id
"""
