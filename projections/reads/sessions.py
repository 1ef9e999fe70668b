"""Reads of the session read models, for the gRPC layer. SQL only, no protobuf.

Every function takes a connection on which the caller has already set `app.org_id` for this
transaction (`projections.store.pool.org_transaction`), and ALSO filters on org_id itself: row-level
security is the backstop, the explicit predicate keeps the indexes in use and the intent visible.
jsonb values come back as Python objects whether or not the connection has the jsonb codec.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from context_engine.events import Event, decode
from context_engine.visibility import Visibility
from projections.reads.share_grants import held_sql


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


class _Row:
    """Rows read like objects (`row.version`) and, for handler code written against records,
    like mappings (`row["version"]`)."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None


@dataclass(frozen=True, slots=True)
class Session(_Row):
    org_id: str
    session_id: str
    scope_path: str
    genesis: str
    version: str
    seq: int
    max_seq: int
    item_count: int
    active_count: int
    created_at: dt.datetime
    updated_at: dt.datetime
    last_event_id: str


@dataclass(frozen=True, slots=True)
class SessionItem(_Row):
    seq: int
    event_id: str
    kind: str
    content_hash: str
    prev_seq: int
    version: str
    active: bool
    rolled_back_by: str | None
    occurred_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SessionEvent(_Row):
    event_id: str
    org_id: str
    session_id: str
    seq: int
    scope_path: str
    event_type: str
    content: bytes
    metadata: dict[str, str]
    content_sha256: str
    token_count: int
    version: str
    occurred_at: dt.datetime
    active: bool
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class MemoryVersion(_Row):
    event_id: str
    org_id: str
    scope_path: str
    agent_id: str
    session_id: str | None
    seq: int | None
    memory_type: str
    content: bytes
    metadata: dict[str, str]
    content_sha256: str
    session_version: str | None
    created_at: dt.datetime
    active: bool
    pii_status: str = "clear"  # pending | clear | quarantined (docs/pii.md)


@dataclass(frozen=True, slots=True)
class Snapshot(_Row):
    snapshot_id: str
    org_id: str
    session_id: str
    name: str
    version: str
    seq: int
    state: dict[str, Any]
    event_id: str
    created_at: dt.datetime
    created_by: str
    scope_path: str  # the creator's scope: names are per creator


@dataclass(frozen=True, slots=True)
class ArchivedEvent(_Row):
    event_id: str
    org_id: str
    topic: str
    partition: int
    offset: int
    aggregate: str
    type: str
    schema_version: int
    occurred_at: dt.datetime
    actor: str
    content_hash: str
    raw: bytes
    archived_at: dt.datetime

    def decode(self) -> Event:
        """The event upcast to the current schema of its type."""
        return decode(self.raw)


def _session(r: asyncpg.Record) -> Session:
    return Session(r["org_id"], r["session_id"], r["scope_path"], r["genesis"], r["version"], r["seq"],
                   r["max_seq"], r["item_count"], r["active_count"], r["created_at"], r["updated_at"],
                   str(r["last_event_id"]))


def _memory(r: asyncpg.Record) -> MemoryVersion:
    return MemoryVersion(str(r["event_id"]), r["org_id"], r["scope_path"], r["agent_id"], r["session_id"],
                         r["seq"], r["memory_type"], bytes(r["content"]), _json(r["metadata"]),
                         r["content_sha256"], r["session_version"], r["created_at"], r["active"],
                         r["pii_status"])


def _snapshot(r: asyncpg.Record) -> Snapshot:
    return Snapshot(str(r["snapshot_id"]), r["org_id"], r["session_id"], r["name"], r["version"], r["seq"],
                    _json(r["state"]), str(r["event_id"]), r["created_at"], r["created_by"], r["scope_path"])


async def get_session(conn: asyncpg.Connection, org_id: str, session_id: str) -> Session | None:
    r = await conn.fetchrow("SELECT * FROM sessions WHERE org_id = $1 AND session_id = $2",
                            org_id, session_id)
    return _session(r) if r else None


async def session_has_version(conn: asyncpg.Connection, org_id: str, session_id: str,
                              version: str) -> int | None:
    """The seq of the item that produced `version` (0 = genesis), or None if the session never
    had it: RollbackContext answers NOT_FOUND on None."""
    return await conn.fetchval(
        "SELECT seq FROM session_versions WHERE org_id = $1 AND session_id = $2 AND version = $3",
        org_id, session_id, version)


async def session_items(conn: asyncpg.Connection, org_id: str, session_id: str, *,
                        active_only: bool = False) -> list[SessionItem]:
    """The session's chain in seq order; with active_only=False the audit view (rolled-back
    items included, with the rollback event that removed them)."""
    rows = await conn.fetch(
        "SELECT seq, event_id, kind, content_hash, prev_seq, version, active, rolled_back_by, occurred_at "
        "FROM session_items WHERE org_id = $1 AND session_id = $2 AND (active OR NOT $3) ORDER BY seq",
        org_id, session_id, active_only)
    return [SessionItem(r["seq"], str(r["event_id"]), r["kind"], r["content_hash"], r["prev_seq"],
                        r["version"], r["active"],
                        str(r["rolled_back_by"]) if r["rolled_back_by"] else None, r["occurred_at"])
            for r in rows]


def _session_event(r: asyncpg.Record) -> SessionEvent:
    return SessionEvent(str(r["event_id"]), r["org_id"], r["session_id"], r["seq"], r["scope_path"],
                        r["event_type"], bytes(r["content"]), _json(r["metadata"]), r["content_sha256"],
                        r["token_count"], r["version"], r["occurred_at"], r["active"], r["idempotency_key"])


async def event_by_id(conn: asyncpg.Connection, org_id: str, event_id: str) -> SessionEvent | None:
    """The projected IngestEvent row. None when the event is unknown, or archived but not
    projected (OUT_OF_SCOPE or IDEMPOTENCY_KEY_TAKEN): after its append is acknowledged, a
    handler reads None as "my event lost a race"."""
    if (eid := _uuid(event_id)) is None:
        return None
    r = await conn.fetchrow("SELECT * FROM session_events WHERE org_id = $1 AND event_id = $2",
                            org_id, eid)
    return _session_event(r) if r else None


async def event_by_idempotency_key(conn: asyncpg.Connection, org_id: str, key: str,
                                   session_id: str | None = None,
                                   writer_scope_path: str | None = None) -> SessionEvent | None:
    """The event that won an idempotency key (rolled back or not). Keys are unique per session
    and writer scope (see projections/projector/appliers/ingested.py); pass the request's
    session_id and the caller's scope path. Without them, the earliest event of the org with that
    key. Only clients' keys are stored: a key the server issued (`ce-event:<event id>`,
    commands/ingest_event.py) names the event id instead."""
    if not key:
        return None
    r = await conn.fetchrow(
        "SELECT * FROM session_events WHERE org_id = $1 AND idempotency_key = $2 "
        "AND ($3::text IS NULL OR session_id = $3) AND ($4::text IS NULL OR scope_path = $4) "
        "ORDER BY occurred_at, event_id LIMIT 1",
        org_id, key, session_id, writer_scope_path)
    return _session_event(r) if r else None


async def memory_by_event_id(conn: asyncpg.Connection, org_id: str, event_id: str) -> MemoryVersion | None:
    """The projected PushContext row; None when unknown or not projected (OUT_OF_SCOPE)."""
    if (eid := _uuid(event_id)) is None:
        return None
    r = await conn.fetchrow("SELECT * FROM memory_versions WHERE org_id = $1 AND event_id = $2", org_id, eid)
    return _memory(r) if r else None


async def latest_memory(conn: asyncpg.Connection, org_id: str, agent_id: str, session_id: str | None,
                        visible: Visibility, *, memory_type: str | None = None) -> MemoryVersion | None:
    """PullContext without a snapshot: the newest ACTIVE memory of `agent_id` (in `session_id`
    when given: newest by chain seq; otherwise across sessions: newest by created_at), owned at
    where the caller sees it (`visible`)."""
    if session_id:
        r = await conn.fetchrow(
            "SELECT * FROM memory_versions WHERE org_id = $1 AND agent_id = $2 AND session_id = $3 "
            "AND active AND scope_path = ANY($4::text[]) AND ($5::text IS NULL OR memory_type = $5) "
            "ORDER BY seq DESC LIMIT 1",
            org_id, agent_id, session_id, visible.sql_paths, memory_type)
    else:
        r = await conn.fetchrow(
            "SELECT * FROM memory_versions WHERE org_id = $1 AND agent_id = $2 "
            "AND active AND scope_path = ANY($3::text[]) AND ($4::text IS NULL OR memory_type = $4) "
            "ORDER BY created_at DESC, event_id DESC LIMIT 1",
            org_id, agent_id, visible.sql_paths, memory_type)
    return _memory(r) if r else None


async def hidden_memory(conn: asyncpg.Connection, org_id: str, agent_id: str, visible: Visibility, *,
                        session_id: str | None = None, snapshot: Snapshot | None = None) -> str | None:
    """The event id of the newest memory of `agent_id` owned where the caller does not see it but
    beside or below a scope it sees (its parent scope visible: an agent id names an agent of the
    caller's own team, not another team's of the same name): what a refused PullContext reached
    for (its audit row). In `snapshot`'s state when given, else the newest active one (in
    `session_id` when given)."""
    hidden = "NOT m.scope_path = ANY($4::text[]) AND regexp_replace(m.scope_path, '/[^/]*$', '') = ANY($4::text[])"
    if snapshot is not None:
        event_id = await conn.fetchval(
            "SELECT m.event_id FROM snapshots s "
            "CROSS JOIN LATERAL jsonb_to_recordset(s.state -> 'items') AS i(event_id uuid, kind text, seq bigint) "
            "JOIN memory_versions m ON m.org_id = s.org_id AND m.event_id = i.event_id "
            f"WHERE s.org_id = $1 AND s.snapshot_id = $2 AND i.kind = 'memory' AND m.agent_id = $3 AND {hidden} "
            "ORDER BY i.seq DESC LIMIT 1",
            org_id, uuid.UUID(snapshot.snapshot_id), agent_id, visible.sql_paths)
    else:
        event_id = await conn.fetchval(
            "SELECT m.event_id FROM memory_versions m WHERE m.org_id = $1 AND m.agent_id = $2 "
            f"AND ($3::text IS NULL OR m.session_id = $3) AND m.active AND {hidden} "
            "ORDER BY m.created_at DESC, m.event_id DESC LIMIT 1",
            org_id, agent_id, session_id, visible.sql_paths)
    return None if event_id is None else str(event_id)


async def snapshot_memory(conn: asyncpg.Connection, org_id: str, snapshot: Snapshot, agent_id: str,
                          visible: Visibility, *, memory_type: str | None = None) -> MemoryVersion | None:
    """PullContext with snapshot_name: the newest memory of `agent_id` in the snapshot's state
    (whatever happened to the session since; `active` reports the row's present flag)."""
    r = await conn.fetchrow(
        "SELECT m.* FROM snapshots s "
        "CROSS JOIN LATERAL jsonb_to_recordset(s.state -> 'items') AS i(event_id uuid, kind text, seq bigint) "
        "JOIN memory_versions m ON m.org_id = s.org_id AND m.event_id = i.event_id "
        "WHERE s.org_id = $1 AND s.snapshot_id = $2 AND i.kind = 'memory' "
        "AND m.agent_id = $3 AND m.scope_path = ANY($4::text[]) "
        "AND ($5::text IS NULL OR m.memory_type = $5) "
        "ORDER BY i.seq DESC LIMIT 1",
        org_id, uuid.UUID(snapshot.snapshot_id), agent_id, visible.sql_paths, memory_type)
    return _memory(r) if r else None


async def snapshot_by_name(conn: asyncpg.Connection, org_id: str, session_id: str, name: str,
                           visible: Visibility) -> Snapshot | None:
    """The snapshot named `name` in the session by the nearest scope the caller sees: its own
    first, then its parent's, up to the org's. Names are per creator scope, so a scope below
    (or beside) the caller never decides which state the caller's name means."""
    r = await conn.fetchrow(
        "SELECT * FROM snapshots WHERE org_id = $1 AND session_id = $2 AND name = $3 "
        "AND scope_path = ANY($4::text[]) ORDER BY length(scope_path) DESC LIMIT 1",
        org_id, session_id, name, visible.sql_paths)
    return _snapshot(r) if r else None


_SHARED_SNAPSHOT = f"""
SELECT s.*, h.share_id FROM snapshots s
JOIN ({held_sql("snapshot", org="$1", paths="$4::text[]", permission="'read'")}) AS h ON h.resource_id = s.snapshot_id
WHERE s.org_id = $1 AND s.session_id = $2 AND s.name = $3
ORDER BY length(s.scope_path), s.scope_path LIMIT 1
"""


async def shared_snapshot_by_name(conn: asyncpg.Connection, org_id: str, session_id: str, name: str,
                                  visible: Visibility) -> tuple[Snapshot, str] | None:
    """The snapshot named `name` in the session shared with the caller by a live `read` grant,
    and that grant's id (when several creators' snapshots of the name are shared, the nearest
    creator's to the org, then by creator path)."""
    r = await conn.fetchrow(_SHARED_SNAPSHOT, org_id, session_id, name, visible.sql_paths)
    return (_snapshot(r), str(r["share_id"])) if r else None


async def event_owner(conn: asyncpg.Connection, org_id: str, event_id: str) -> str | None:
    """The scope path that wrote a session event of the org, or None (for auditing a refusal)."""
    return await conn.fetchval("SELECT scope_path FROM session_events WHERE org_id = $1 AND event_id = $2 LIMIT 1",
                               org_id, uuid.UUID(event_id))


async def snapshot_ids_named(conn: asyncpg.Connection, org_id: str, session_id: str, name: str) -> list[str]:
    """Every snapshot of that name in the session, whoever created it (for auditing a refusal)."""
    return [str(r["snapshot_id"]) for r in await conn.fetch(
        "SELECT snapshot_id FROM snapshots WHERE org_id = $1 AND session_id = $2 AND name = $3",
        org_id, session_id, name)]


async def snapshot_by_id(conn: asyncpg.Connection, org_id: str, snapshot_id: str) -> Snapshot | None:
    if (sid := _uuid(snapshot_id)) is None:
        return None
    r = await conn.fetchrow("SELECT * FROM snapshots WHERE org_id = $1 AND snapshot_id = $2", org_id, sid)
    return _snapshot(r) if r else None


async def archived_event(conn: asyncpg.Connection, org_id: str, event_id: str) -> ArchivedEvent | None:
    """The archived event (verbatim bytes and log position), projected or not."""
    if (eid := _uuid(event_id)) is None:
        return None
    r = await conn.fetchrow("SELECT * FROM event_archive WHERE org_id = $1 AND event_id = $2", org_id, eid)
    if r is None:
        return None
    return ArchivedEvent(str(r["event_id"]), r["org_id"], r["topic"], r["partition"], r["offset"],
                         r["aggregate"], r["type"], r["schema_version"], r["occurred_at"], r["actor"],
                         r["content_hash"], bytes(r["raw"]), r["archived_at"])


async def applied_event_ids(conn: asyncpg.Connection, org_id: str, event_ids: Iterable[str]) -> set[str]:
    """Which of these events are archived. Archive and projection commit in one transaction, so
    archived = projected: read-your-writes and ack-after-archive can both poll this."""
    ids = [u for e in event_ids if (u := _uuid(e)) is not None]
    if not ids:
        return set()
    rows = await conn.fetch("SELECT event_id FROM event_archive WHERE org_id = $1 AND event_id = ANY($2::uuid[])",
                            org_id, ids)
    return {str(r["event_id"]) for r in rows}


@dataclass(frozen=True)
class OwnerTurn:
    """An active turn of a session written at its owner scope (or a line of a compaction's
    summary, `summary`): what Compact may replace."""

    event_id: str
    content: bytes
    role: str
    token_count: int
    summary: bool = False


async def owner_turns(conn: asyncpg.Connection, org_id: str, session_id: str, owner_path: str) -> list[OwnerTurn]:
    """The session's active turns written at `owner_path`, in conversation order."""
    rows = await conn.fetch(
        "SELECT event_id, content, metadata ->> 'role' AS role, token_count, summary_of IS NOT NULL AS summary "
        "FROM session_events "
        "WHERE org_id = $1 AND session_id = $2 AND active AND scope_path = $3 ORDER BY seq, occurred_at",
        org_id, session_id, owner_path)
    return [OwnerTurn(str(r["event_id"]), bytes(r["content"]), r["role"] or "", r["token_count"], r["summary"])
            for r in rows]


async def active_tokens(conn: asyncpg.Connection, org_id: str, session_id: str) -> int:
    """The stored (cl100k) tokens of the session's history: its active turns, every scope's."""
    return int(await conn.fetchval(
        "SELECT coalesce(sum(token_count), 0) FROM session_events WHERE org_id = $1 AND session_id = $2 AND active",
        org_id, session_id))
