"""The rows a session's events become, each modelled once: a `session_items` row (an item of the
version chain), a `session_events` row (a turn, or a line of a compaction's summary) and a
`memory_versions` row; the INSERTs that write a batch of the last two (projections/projector/rows.py
PendingRows; the chain's own is projections/projector/version_chain.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import astuple, dataclass


@dataclass(frozen=True, slots=True)
class ChainItemRow:
    session_id: str
    seq: int
    event_id: str
    kind: str  # 'event' | 'memory'
    content_hash: str  # the event's: the chain input
    prev_seq: int
    version: str
    occurred_at: dt.datetime

    def values(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True, slots=True)
class SessionEventRow:
    event_id: str
    session_id: str
    seq: int  # the turn's position (a summary line: the position of the turn it stands for)
    scope_path: str
    pillar_id: str
    team_id: str
    scope_agent_id: str
    event_type: str  # message | tool_output | workflow_event | compaction (a summary line)
    content: bytes
    metadata: str  # JSON text
    content_sha256: str
    token_count: int
    version: str  # the session's version after the item that wrote the row
    occurred_at: dt.datetime
    idempotency_key: str | None = None
    summary_of: str | None = None  # a summary line: its compaction's event
    stands_for: object = None  # a summary line: the turn it stands for (uuid)

    def values(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True, slots=True)
class MemoryVersionRow:
    event_id: str
    scope_path: str
    pillar_id: str
    team_id: str
    scope_agent_id: str
    agent_id: str
    session_id: str | None
    seq: int | None
    memory_type: str
    content: bytes
    metadata: str  # JSON text
    content_sha256: str
    session_version: str | None
    created_at: dt.datetime

    def values(self) -> tuple:
        return astuple(self)


INSERT_SESSION_EVENTS = """
INSERT INTO session_events (event_id, org_id, session_id, seq, scope_path, pillar_id, team_id,
                            scope_agent_id, event_type, content, metadata, content_sha256,
                            token_count, version, occurred_at, idempotency_key, summary_of, stands_for)
SELECT u.event_id, $1, u.session_id, u.seq, u.scope_path, u.pillar_id, u.team_id,
       u.scope_agent_id, u.event_type, u.content, u.metadata::jsonb, u.content_sha256,
       u.token_count, u.version, u.occurred_at, u.idempotency_key, u.summary_of, u.stands_for
FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::text[], $10::bytea[], $11::text[], $12::text[], $13::int[], $14::text[],
            $15::timestamptz[], $16::text[], $17::uuid[], $18::uuid[])
     AS u(event_id, session_id, seq, scope_path, pillar_id, team_id, scope_agent_id, event_type,
          content, metadata, content_sha256, token_count, version, occurred_at, idempotency_key,
          summary_of, stands_for)
"""


INSERT_MEMORY_VERSIONS = """
INSERT INTO memory_versions (event_id, org_id, scope_path, pillar_id, team_id, scope_agent_id,
                             agent_id, session_id, seq, memory_type, content, metadata,
                             content_sha256, session_version, created_at, pii_status)
SELECT u.event_id, $1, u.scope_path, u.pillar_id, u.team_id, u.scope_agent_id, u.agent_id,
       u.session_id, u.seq, u.memory_type, u.content, u.metadata::jsonb, u.content_sha256,
       u.session_version, u.created_at, 'pending'
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::bigint[], $10::text[], $11::bytea[], $12::text[], $13::text[], $14::text[],
            $15::timestamptz[])
     AS u(event_id, scope_path, pillar_id, team_id, scope_agent_id, agent_id, session_id, seq,
          memory_type, content, metadata, content_sha256, session_version, created_at)
"""
