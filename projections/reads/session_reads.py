"""AssembleContext's reads of a session: its guardrail layers, the pinned chunks and required
items the hints name, the recent history window, the session's token totals and whether a
compaction request is open (`read_session`, one read-only transaction the caller holds), the
whole window again when the turns read did not fill the budget (`read_history`), and the chunks
of the turns a prompt includes (`chunk_ids_by_source`).

Every item read is one the caller sees (`Visibility`): a sibling's turn in a shared session is
neither history nor a must_include target. SQL only, no protobuf.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import asyncpg
import orjson

from context_engine.errors import FailedPrecondition, InvalidArgument, NotFound
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from projections.assembly import turn_labels
from projections.assembly.packing import Block
from projections.reads import sessions
from projections.reads.guardrail_layers import current_layers
from projections.reads.pull_context import await_scan
from projections.reads.share_grants import held_sql

PINNED_HINT = "pinned_chunk_ids"
MUST_INCLUDE_HINT = "must_include"


@dataclass(frozen=True)
class ScanWait:
    """A pending memory's PII scan is waited for on `pool` (another connection: the scan's
    commit is not in this transaction's snapshot) for up to `timeout` seconds."""

    pool: asyncpg.Pool
    timeout: float


@dataclass(frozen=True)
class SessionReads:
    layers: list[Block]
    pinned: list[Block]
    required: list[Block]
    history_newest_first: list[Block]
    session_tokens: int  # every active turn's: the compaction threshold is the session's, never shown
    visible_session_tokens: int  # the turns the caller sees: its naive prompt (baseline_tokens)
    compaction_open: bool
    compaction_refused: bool  # a request was refused at the session's current version: none is opened again
    history_truncated: bool  # older turns within the window were not read (`read_tokens`)
    pinned_shares: dict[str, str] = field(default_factory=dict)  # pinned chunk id -> share, if seen by a grant
    owner_path: str | None = None  # the session's owner scope, None for a session not written yet


async def read_session(conn: asyncpg.Connection, scope: Scope, session_id: str, session: sessions.Session | None,
                       *, trusted: Collection[str], pinned_ids: Sequence[str], required_keys: Sequence[str],
                       window: int, read_tokens: int, scans: ScanWait) -> SessionReads:
    """Layers, pinned and required blocks, the history window (newest first, only the turns whose
    newer turns hold at most `read_tokens` stored tokens), the session's active tokens (all, and
    those the caller sees) and whether a compaction request is open, on `conn`'s transaction.

    `session`: the session's row (`sessions.get_session` on this transaction, None when it does
    not exist), which the caller has authorized; `trusted` are the guardrail key fingerprints
    trusted now; `scans`: how a pending memory's PII scan is waited for."""
    org, visible = scope.org_id, Visibility.of(scope)
    layers = [Block("layer", r.content, key=f"L{r.level}") for r in await current_layers(conn, scope, trusted=trusted)]
    pinned, pinned_shares = await _pinned(conn, org, visible, pinned_ids)
    required = [await _required(conn, org, scope.agent_id, session_id, visible, key, scans) for key in required_keys]
    history_rows = await _history_rows(conn, org, session_id, visible, window, read_tokens)
    totals = await conn.fetchrow(
        "SELECT coalesce(sum(token_count), 0) AS tokens,"
        "       coalesce(sum(token_count) FILTER (WHERE scope_path = ANY($3::text[])), 0) AS visible_tokens,"
        "       EXISTS (SELECT 1 FROM compaction_requests"
        "               WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL) AS compaction_open,"
        "       EXISTS (SELECT 1 FROM compaction_requests WHERE org_id = $1 AND session_id = $2"
        "               AND closed_reason = 'refused' AND closed_version = $4) AS compaction_refused "
        "FROM session_events WHERE org_id = $1 AND session_id = $2 AND active",
        org, session_id, visible.sql_paths, session.version if session is not None else "")
    truncated = bool(history_rows) and len(history_rows) < history_rows[0]["window_rows"]
    return SessionReads(layers, pinned, required, _history_blocks(history_rows), int(totals["tokens"]),
                        int(totals["visible_tokens"]), totals["compaction_open"], totals["compaction_refused"],
                        truncated, pinned_shares, session.scope_path if session is not None else None)


async def read_history(conn: asyncpg.Connection, org: str, session_id: str, visible: Visibility,
                       window: int) -> list[Block]:
    """Every turn of the history window the caller sees, newest first."""
    return _history_blocks(await _history_rows(conn, org, session_id, visible, window, None))


async def chunk_ids_by_source(conn: asyncpg.Connection, org: str, visible: Visibility,
                              source_event_ids: Sequence[str]) -> dict[str, list[str]]:
    """The chunk ids of each source event the caller sees, in chunk order."""
    by_source: dict[str, list[str]] = {}
    for r in await conn.fetch(
            "SELECT source_event_id, chunk_id FROM chunks WHERE org_id = $1 AND source_event_id = ANY($2::uuid[]) "
            "AND scope_path = ANY($3::text[]) ORDER BY source_event_id, chunk_index", org, list(source_event_ids),
            visible.sql_paths):
        by_source.setdefault(str(r["source_event_id"]), []).append(str(r["chunk_id"]))
    return by_source


async def _history_rows(conn: asyncpg.Connection, org: str, session_id: str, visible: Visibility, window: int,
                        read_tokens: int | None) -> list:
    """The session's active turns the caller sees, newest first, within the last `window`: only those whose newer
    turns hold at most `read_tokens` stored (cl100k) tokens when it is given. Each row carries
    how many turns the window holds, so the caller knows whether older ones were left unread."""
    return await conn.fetch(
        "SELECT event_id, content, metadata, event_type, occurred_at, stands_for, window_rows FROM ("
        "  SELECT event_id, content, metadata::text AS metadata, event_type, occurred_at, stands_for, seq,"
        "         count(*) OVER () AS window_rows,"
        "         sum(token_count) OVER (ORDER BY seq DESC, occurred_at DESC ROWS UNBOUNDED PRECEDING) - token_count"
        "           AS newer_tokens"
        "  FROM (SELECT event_id, content, metadata, event_type, occurred_at, stands_for, seq, token_count"
        "        FROM session_events"
        "        WHERE org_id = $1 AND session_id = $2 AND active AND scope_path = ANY($5::text[])"
        "        ORDER BY seq DESC, occurred_at DESC LIMIT $3) AS w"
        ") AS h WHERE $4::bigint IS NULL OR newer_tokens <= $4 ORDER BY seq DESC, occurred_at DESC",
        org, session_id, window, read_tokens, visible.sql_paths)


def _text(content: bytes) -> str:
    return bytes(content).decode("utf-8", errors="replace").strip()


def _history_blocks(rows) -> list[Block]:
    history = [_turn("history", r, key=str(r["event_id"])) for r in rows]
    return [b for b in history if b.text]


def _turn(kind: str, row, key: str) -> Block:
    """A session event as a prompt block: its speaker and time (projections/assembly/turn_labels.py). A
    compaction summary's line is dated as the turn it stands for, and says it is a summary."""
    metadata = _metadata(row["metadata"])
    time = turn_labels.turn_time(metadata, row["occurred_at"])
    stands_for = row["stands_for"]
    if row["event_type"] == "compaction":
        time = turn_labels.summary_time(time)
    return Block(kind, turn_labels.with_speaker(_text(row["content"]), metadata), key=key,
                 source=str(row["event_id"]), time=time, stands_for=str(stands_for) if stands_for else "")


def _metadata(text: str | None) -> dict:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


# A must_include event: an active turn or summary line of the session the caller sees, or a turn a
# compaction on the session's chain replaced (it left the history, not the session).
_REQUIRED_EVENT = """
SELECT e.event_id, e.content, e.metadata::text AS metadata, e.event_type, e.occurred_at, e.stands_for
FROM session_events e
WHERE e.org_id = $1 AND e.session_id = $2 AND e.event_id = $3 AND e.scope_path = ANY($4::text[])
  AND (e.active OR EXISTS (
      SELECT 1 FROM session_items i JOIN session_items k
        ON k.org_id = i.org_id AND k.session_id = i.session_id AND k.active AND i.seq = ANY(k.replaces)
      WHERE i.org_id = e.org_id AND i.session_id = e.session_id AND i.event_id = e.event_id))
"""

# The pinned chunks the caller sees by ownership or through a live use_in_assembly grant (then
# with the share it came through): active and cleared by the PII scan. A summary line's chunk is
# never retrieved but may be pinned (it is in chunk_ids), as a turn a compaction replaced may be.
_PINNED = f"""
SELECT c.chunk_id, c.content, c.source_event_id, c.source_kind, c.metadata::text AS metadata, c.created_at,
       CASE WHEN c.scope_path = ANY($3::text[]) THEN NULL ELSE h.share_id END AS share_id
FROM chunks c
LEFT JOIN ({held_sql("chunk", org="$1", paths="$3::text[]", permission="'use_in_assembly'")}) AS h
  ON h.resource_id = c.chunk_id
WHERE c.org_id = $1 AND c.chunk_id = ANY($2::uuid[]) AND c.active AND c.pii_status = 'clear'
  AND (c.scope_path = ANY($3::text[]) OR h.share_id IS NOT NULL)
"""


async def _pinned(conn: asyncpg.Connection, org: str, visible: Visibility,
                  ids: Sequence[str]) -> tuple[list[Block], dict[str, str]]:
    """The pinned blocks in the order asked, and the shares those seen only by a grant came through."""
    if not ids:
        return [], {}
    ids = [str(uuid.UUID(i)) for i in ids]  # canonical form, as the database returns them
    rows = await conn.fetch(_PINNED, org, ids, visible.sql_paths)
    found = {str(r["chunk_id"]): r for r in rows}
    missing = [i for i in ids if i not in found]
    if missing:  # absent, rolled back, quarantined or not the caller's: one answer for all
        raise NotFound(f"hints.{PINNED_HINT}: chunk(s) {', '.join(missing)} not found in the caller's corpus",
                       reason="PINNED_CHUNK_NOT_FOUND",
                       metadata={"field": f"hints.{PINNED_HINT}", "chunk_ids": ",".join(missing)})
    pinned = [_pinned_block(found[i]) for i in ids]
    return pinned, {str(r["chunk_id"]): str(r["share_id"]) for r in rows if r["share_id"]}


def _pinned_block(row) -> Block:
    """A pinned chunk as it was written; a summary line's says it is one, dated as its turn (the
    pinned section is in the stable prefix: the label is the chunk's, the same every call)."""
    text = row["content"]
    if row["source_kind"] == "summary":
        time = turn_labels.turn_time(_metadata(row["metadata"]), row["created_at"])
        text = f"{turn_labels.header(turn_labels.summary_time(time))}\n{text}"
    return Block("pinned", text, key=str(row["chunk_id"]), source=str(row["source_event_id"]))


async def _required(conn: asyncpg.Connection, org: str, agent_id: str, session_id: str, visible: Visibility,
                    key: str, scans: ScanWait) -> Block:
    field_name = f"hints.{MUST_INCLUDE_HINT}"
    if key.startswith("event:"):
        event_id = key.split(":", 1)[1]
        try:
            eid = uuid.UUID(event_id)
        except ValueError:
            raise InvalidArgument(field_name, f"{key!r}: {event_id!r} is not an event id (UUID)") from None
        row = await conn.fetchrow(_REQUIRED_EVENT, org, session_id, eid, visible.sql_paths)
        if row is None:
            raise NotFound(f"{field_name}: {key!r}: no such active event in session {session_id!r}",
                           reason="MUST_INCLUDE_NOT_FOUND", metadata={"field": field_name, "event_id": str(eid)})
        return _turn("required", row, key)
    memory = await sessions.latest_memory(conn, org, agent_id, session_id, visible, memory_type=key)
    if memory is None:
        raise NotFound(f"{field_name}: {key!r}: agent {agent_id!r} has no {key} memory in session {session_id!r}",
                       reason="MUST_INCLUDE_NOT_FOUND", metadata={"field": field_name})
    if memory.pii_status == "pending":  # just pushed: its scan is moments away
        memory = await await_scan(scans.pool, memory, scans.timeout)
    if memory.pii_status != "clear":
        raise FailedPrecondition(
            f"{field_name}: {key!r}: the latest {key} memory is {memory.pii_status} by the PII scan "
            "(quarantined memory is not assembled until `context-engine pii rescan` clears it)",
            reason="MEMORY_NOT_CLEARED", metadata={"field": field_name})
    return Block("required", _text(memory.content), key=key, source=memory.event_id)
