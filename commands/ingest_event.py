"""IngestEvent: persist one conversation event of a session."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from context_engine.auth import Principal
from context_engine import validation
from context_engine.commands.deps import Deps
from context_engine.commands.session_access import session_claimed_elsewhere
from context_engine.errors import InvalidArgument
from context_engine.events import EVENT_INGESTED, Event, session_aggregate
from context_engine.hashing import sha256_hex
from context_engine.inference.tokens import count_tokens
from context_engine.projections import queries
from context_engine.projections.database import org_transaction
from context_engine.projections.session_projector import APPLIED, OUT_OF_SCOPE

EVENT_TYPES = ("message", "tool_output", "workflow_event")
MAX_IDEMPOTENCY_KEY = 128


@dataclass(frozen=True)
class IngestEvent:
    session_id: str
    event_type: str
    content: bytes
    metadata: dict[str, str]
    idempotency_key: str = ""


@dataclass(frozen=True)
class Ingested:
    event_id: str
    version_hash: str
    token_count: int


async def ingest_event(deps: Deps, principal: Principal, command: IngestEvent) -> Ingested:
    validation.session_id(command.session_id)
    validation.one_of(command.event_type, EVENT_TYPES, "event_type")
    validation.content(command.content, deps.settings.max_content_bytes)
    metadata = validation.metadata(command.metadata)
    if len(command.idempotency_key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument("idempotency-key", f"is longer than {MAX_IDEMPOTENCY_KEY} characters")
    org = principal.scope.org_id
    session_key = f"{org}/{command.session_id}"

    if command.idempotency_key:  # a retry: answer with the first result, if it has landed
        await deps.freshness.wait(session_key)
        if (first := await _first_with_key(deps, org, command)) is not None:
            return _result(first)
    await deps.owners.require_writable(principal.scope, command.session_id)

    text = command.content.decode("utf-8", errors="replace")
    event = Event(
        type=EVENT_INGESTED, scope=principal.scope, actor=principal.subject,
        aggregate=session_aggregate(org, command.session_id),
        payload={
            "session_id": command.session_id,
            "event_type": command.event_type,
            "content_b64": base64.b64encode(command.content).decode(),
            "metadata": metadata,
            "content_sha256": sha256_hex(command.content),
            "token_count": count_tokens(text),
            "idempotency_key": command.idempotency_key,
        },
    )
    outcome = await deps.append(event, session_key)
    if outcome == OUT_OF_SCOPE:  # another scope created the session first
        raise session_claimed_elsewhere(command.session_id)
    if outcome != APPLIED:  # a concurrent retry won the key, or the outcome must be read back
        if command.idempotency_key and (first := await _first_with_key(deps, org, command)) is not None:
            return _result(first)
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            if await queries.event_by_id(conn, org, event.event_id) is None:
                raise session_claimed_elsewhere(command.session_id)
    return Ingested(event.event_id, event.payload["content_sha256"], event.payload["token_count"])


async def _first_with_key(deps: Deps, org: str, command: IngestEvent):
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        return await queries.event_by_idempotency_key(conn, org, command.idempotency_key, command.session_id)


def _result(row) -> Ingested:
    return Ingested(str(row["event_id"]), row["content_sha256"], row["token_count"])
