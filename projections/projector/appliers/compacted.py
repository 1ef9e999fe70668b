"""session.compacted: older turns leave the session's history for a summary, one line per kept turn.

Applied only from the session's owner scope itself (visibility.may_rewrite, as a rollback), only
while the session is at the event's base_version (else STALE: another write came first, and the
summary would drop it), and only when every replaced id is an active item of the session written
at the owner scope (else UNKNOWN_TARGET): a turn written below the owner is not the owner's to
summarise, and a summary at the owner scope would show it to scopes that do not see it.

The event is a chain item (kind 'event') whose session_items row lists the items it replaced
(`replaces`; the rollback's state query leaves them out of every version on its chain). Its
summary is one session_events row per line (event_type 'compaction', id `summary_line_id`),
at the position of the turn the line stands for and dated by it (its time metadata and
occurred_at), each with one chunk that is shown but never retrieved (source_kind 'summary').
The replaced turns leave the history (session_events.active) but keep their chunks: Search and
AssembleContext's retrieval still find them (recall storage), under every visibility, share
and rollback rule a chunk has. The compaction is recorded in `compactions` and closes the
session's open compaction request.

A v1 event (before lines stood for turns) maps each line to the first replaced turn, from the
one the previous line stood for on, that holds its text (after the speaker); and it may replace
an earlier summary, whose lines then count as the turns they stand for.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from context_engine.events import Event, SessionCompacted
from context_engine.hashing import sha256_hex
from context_engine.visibility import may_rewrite
from inference.tokens import count_tokens
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied
from ..rows import json_text
from ..session_rows import SessionEventRow
from .compaction import close_request

if TYPE_CHECKING:
    import asyncpg

    from ..org_state import OrgState

SUMMARY_LINES = uuid.UUID("6f9d3b62-4f0e-5c55-9a53-6b1c0d5f8e21")  # UUIDv5 namespace of summary line ids
TOKEN_MODEL = "gpt-4"  # stored token counts are cl100k, as at ingest

# The items to replace (active, kind 'event') and the rows that are the turns they hold: a turn's
# own row, or the lines of an earlier summary (a v1 event could replace one).
_REPLACED = """
SELECT i.event_id AS item, i.seq AS item_seq, e.event_id, e.seq AS position, e.content, e.metadata::text AS metadata,
       e.occurred_at, coalesce(e.stands_for, e.event_id) AS stands_for
FROM session_items i
JOIN session_events e ON e.org_id = i.org_id AND (e.event_id = i.event_id OR e.summary_of = i.event_id)
WHERE i.org_id = $1 AND i.session_id = $2 AND i.event_id = ANY($3::uuid[]) AND i.kind = 'event' AND i.active
  AND e.active AND e.scope_path = $4
ORDER BY e.seq, e.occurred_at
"""


def summary_line_id(compaction_id: str, line: int) -> str:
    """The id of a summary's line (its session_events row, the source of its chunk)."""
    return str(uuid.uuid5(SUMMARY_LINES, f"{compaction_id}#{line}"))


@dataclass(frozen=True)
class _Line:
    text: str
    tokens: int
    turn: asyncpg.Record  # the replaced row it stands for


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    body = SessionCompacted.from_payload(ev.payload)
    sid = body.session_id
    s = org.chain.sessions.get(sid) if isinstance(sid, str) else None
    if s is None:
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    if not may_rewrite(s.owner(org.org_id), ev.scope):
        return applied(rec, ev, ProjectionOutcome.OUT_OF_SCOPE)
    if s.version != body.base_version:
        return applied(rec, ev, ProjectionOutcome.STALE, sid)
    try:
        ids = sorted({uuid.UUID(i) for i in body.replaced})
    except ValueError:
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    await org.flush()
    rows = await org.conn.fetch(_REPLACED, org.org_id, sid, ids, s.scope_path)
    items = {r["item"]: r["item_seq"] for r in rows}
    lines = _lines(body, rows)
    if not ids or len(items) != len(ids) or lines is None:
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    seq, version = org.chain.append(s, ev, "event", replacing=len(items))
    for i, line in enumerate(lines):
        line_id = summary_line_id(ev.event_id, i)
        turn = line.turn
        metadata = _line_metadata(turn["metadata"])
        content = line.text.encode()
        org.session_events.append(SessionEventRow(
            line_id, sid, turn["position"], s.scope_path, s.pillar_id, s.team_id, s.scope_agent_id,
            "compaction", content, json_text(metadata), sha256_hex(content), line.tokens, version,
            turn["occurred_at"], summary_of=ev.event_id, stands_for=turn["stands_for"]))
        org.chunks.add_summary_line(event_id=line_id, session_id=sid, scope_path=s.scope_path, text=line.text,
                                    tokens=line.tokens, metadata=metadata, created_at=turn["occurred_at"])
    await org.flush()
    replaced_seqs = sorted(items.values())
    await org.conn.execute(
        "UPDATE session_items SET replaces = CASE WHEN seq = $4 THEN $3 ELSE replaces END, active = (seq = $4) "
        "WHERE org_id = $1 AND session_id = $2 AND (seq = $4 OR seq = ANY($3::bigint[]))",
        org.org_id, sid, replaced_seqs, seq)
    await org.conn.execute("UPDATE session_events SET active = false "
                           "WHERE org_id = $1 AND (event_id = ANY($2::uuid[]) OR summary_of = ANY($2::uuid[]))",
                           org.org_id, ids)
    await org.conn.execute(
        "INSERT INTO compactions (org_id, event_id, session_id, actor, strategy, summarizer, replaced_turns, "
        "original_tokens, compacted_tokens, fact_retention_score, occurred_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
        org.org_id, ev.event_id, sid, ev.actor, body.strategy, body.summarizer, len(items), body.original_tokens,
        body.compacted_tokens, body.fact_retention_score, ev.occurred)
    await close_request(org, sid, ev, "compacted")
    return applied(rec, ev, ProjectionOutcome.APPLIED, sid, seq, version)


def _lines(body: SessionCompacted, rows: list[asyncpg.Record]) -> list[_Line] | None:
    """The summary's lines with the replaced row each stands for; None when a line names a turn
    the event does not replace, or the lists disagree."""
    text = body.summary.decode("utf-8", errors="replace")
    if not body.stands_for:  # v1
        return _mapped_lines([line for line in text.split("\n") if line.strip()], rows)
    lines = text.split("\n")
    turns = {str(r["event_id"]): r for r in rows}
    if not len(lines) == len(body.stands_for) == len(body.line_tokens) or any(t not in turns for t in body.stands_for):
        return None
    return [_Line(line, n, turns[t]) for line, n, t in zip(lines, body.line_tokens, body.stands_for)]


def _mapped_lines(lines: list[str], rows: list[asyncpg.Record]) -> list[_Line] | None:
    if lines and not rows:
        return None
    out, at = [], 0
    contents = [bytes(r["content"]).decode("utf-8", errors="replace") for r in rows]
    for line in lines:
        said = line.split(": ", 1)[-1][:80]
        at = next((j for j in range(at, len(rows)) if said in contents[j]), at)
        out.append(_Line(line, count_tokens(line, TOKEN_MODEL), rows[at]))
    return out


def _line_metadata(turn_metadata: str | None) -> dict[str, str]:
    """A line keeps the time its turn was given, so it is dated as the turn was said; its
    speaker is in its text."""
    value = orjson.loads(turn_metadata) if turn_metadata else {}
    time = value.get("time") if isinstance(value, dict) else None
    return {"time": time} if isinstance(time, str) and time else {}
