"""PushContext: a new version of an agent's memory in a session."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass

from context_engine.auth import Principal
from context_engine import validation
from context_engine.commands.deps import Deps
from context_engine.commands.session_access import session_claimed_elsewhere
from context_engine.events import MEMORY_PUSHED, Event, session_aggregate
from context_engine.hashing import sha256_hex
from context_engine.projections import queries
from context_engine.projections.database import org_transaction
from context_engine.projections.session_projector import OUT_OF_SCOPE

MEMORY_TYPES = ("episodic", "semantic", "working")


@dataclass(frozen=True)
class PushContext:
    session_id: str
    memory_type: str
    content: bytes
    metadata: dict[str, str]


@dataclass(frozen=True)
class Pushed:
    version_hash: str
    created_at: dt.datetime


async def push_context(deps: Deps, principal: Principal, command: PushContext) -> Pushed:
    validation.session_id(command.session_id)
    validation.one_of(command.memory_type, MEMORY_TYPES, "memory_type")
    validation.content(command.content, deps.settings.max_content_bytes)
    metadata = validation.metadata(command.metadata)
    org = principal.scope.org_id
    session_key = f"{org}/{command.session_id}"

    await deps.owners.require_writable(principal.scope, command.session_id)

    event = Event(
        type=MEMORY_PUSHED, scope=principal.scope, actor=principal.subject,
        aggregate=session_aggregate(org, command.session_id),
        payload={
            "session_id": command.session_id,
            "agent_id": principal.scope.agent_id,
            "memory_type": command.memory_type,
            "content_b64": base64.b64encode(command.content).decode(),
            "metadata": metadata,
            "content_sha256": sha256_hex(command.content),
        },
    )
    outcome = await deps.append(event, session_key)
    if outcome == OUT_OF_SCOPE:
        raise session_claimed_elsewhere(command.session_id)
    if outcome is None:  # the outcome was not announced: read it back
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            if await queries.memory_by_event_id(conn, org, event.event_id) is None:
                raise session_claimed_elsewhere(command.session_id)
    return Pushed(event.payload["content_sha256"], event.occurred)
