"""PushContext: a new version of an agent's memory in a session.

Idempotency (docs/architecture.md, "Retries and idempotency"): the `idempotency-key` header names
the event id. A key the server issued (idempotency.event_key) is that id; a key of the caller's
own is mapped to one, per writer scope and session (`pushed_event_id`). A retry appends the same event id
again, and the archive keeps one event per id: it returns the first version if that was applied
(refused with IDEMPOTENCY_KEY_REUSED if that was another request), and writes it once otherwise.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from commands.deps import Deps
from commands.idempotency import event_key, first_with_id, key_reused, parse_key, retry_with_key
from commands.session_access import refused_write, require_writable
from commands.write_budget import write_bytes
from context_engine import validation
from context_engine.auth import Principal
from context_engine.events import Event, MemoryPushed, SessionRef, content_b64
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from projections.projector.outcome import ProjectionOutcome

MEMORY_TYPES = ("episodic", "semantic", "working")
# The event ids of pushes with a caller's key: uuid5 in this namespace of the writer's scope path,
# the session and the key, one per line (none of them holds a newline). Per writer: a sibling's
# push with the same key is another request, never a retry of this one.
PUSH_KEY_NAMESPACE = uuid.UUID("3f4c1a52-8d0e-4b7a-9c61-2e5d7f0b9a13")


@dataclass(frozen=True)
class PushContext:
    session_id: str
    memory_type: str
    content: bytes
    metadata: dict[str, str]
    idempotency_key: str = ""


@dataclass(frozen=True)
class Pushed:
    version_hash: str
    created_at: dt.datetime


def pushed_event_id(writer: Scope, session_id: str, key: str) -> str:
    return str(uuid.uuid5(PUSH_KEY_NAMESPACE, f"{writer.path}\n{session_id}\n{key}"))


async def push_context(deps: Deps, principal: Principal, command: PushContext) -> Pushed:
    validation.session_id(command.session_id)
    validation.one_of(command.memory_type, MEMORY_TYPES, "memory_type")
    validation.content(command.content, deps.settings.max_content_bytes)
    metadata = validation.metadata(command.metadata)
    # Before any work for the call: a tenant over its budget costs the others nothing more.
    await deps.write_budget.charge(principal.scope.org_id, write_bytes(command.content, metadata))
    client_key, retried_id = parse_key(command.idempotency_key)
    org = principal.scope.org_id
    session = SessionRef(org, command.session_id)
    if client_key:
        retried_id = pushed_event_id(principal.scope, command.session_id, client_key)
    body = MemoryPushed(session_id=command.session_id, agent_id=principal.scope.agent_id,
                        memory_type=command.memory_type, content_b64=content_b64(command.content),
                        metadata=metadata, content_sha256=sha256_hex(command.content))
    event = Event.of(body, scope=principal.scope, actor=principal.subject, aggregate=session.aggregate,
                     **({"event_id": retried_id} if retried_id else {}))

    if retried_id:  # a retry, or a first call with a key: answer with the first result, if it has landed
        await deps.freshness.wait(session)
        if (first := await _first(deps, org, command, event)) is not None:
            return first
    await require_writable(deps, principal, command.session_id, "write")

    retry = retry_with_key(command.idempotency_key or event_key(event.event_id), "memory version")
    outcome = await deps.append(event, session, retry=retry)
    if outcome == ProjectionOutcome.OUT_OF_SCOPE:
        raise refused_write(deps, principal, command.session_id, "write")
    # DUPLICATE, or heard the first record's APPLIED, or read back
    if outcome != ProjectionOutcome.APPLIED or retried_id:
        if (first := await _first(deps, org, command, event)) is not None:
            return first
        if retried_id:  # archived, but not in this org: the id is another's
            raise key_reused(command.idempotency_key, retried_id)
        raise refused_write(deps, principal, command.session_id, "write")
    return Pushed(body.content_sha256, event.occurred)


async def _first(deps: Deps, org: str, command: PushContext, event: Event) -> Pushed | None:
    """The version the first push with this event id wrote, if it has landed; refused if that
    was another request (other content, memory_type, metadata, agent or session)."""
    row = await first_with_id(deps.read_back, org, event, command.idempotency_key, command.session_id,
                              deps.read_back.pushed)
    return None if row is None else Pushed(row.content_sha256, row.created_at)
