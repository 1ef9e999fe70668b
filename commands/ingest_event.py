"""IngestEvent: persist one conversation event of a session.

Idempotency (docs/architecture.md, "Retries and idempotency"; commands/idempotency.py). Every
call has a key a retry can send in the `idempotency-key` header:
- the caller's own key: stored with the event; per session, the first event with a key wins it
  (the projector settles a race), and a later call with that key answers with that event, or is
  refused (FAILED_PRECONDITION, IDEMPOTENCY_KEY_REUSED) when its content, event_type or metadata
  differ from what the first stored;
- otherwise the server's, `event_key(event_id)`: it names the event itself and is not stored. A
  retry with it appends the same event id again; the archive keeps one event per id, so the
  retry returns the event if it was applied and writes it once otherwise.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from commands.deps import Deps
from commands.idempotency import event_key, first_with_id, key_reused, parse_key, retry_with_key
from commands.session_access import refused_write, require_writable
from commands.write_budget import write_bytes
from context_engine import validation
from context_engine.auth import Principal
from context_engine.events import Event, EventIngested, SessionRef, content_b64
from context_engine.hashing import sha256_hex
from inference.tokens import count_tokens
from projections.projector.outcome import ProjectionOutcome

EVENT_TYPES = ("message", "tool_output", "workflow_event")


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


# Counting a megabyte takes ~0.2 s: off the event loop that serves every other caller meanwhile.
COUNT_OFF_LOOP_BYTES = 64 * 1024


async def _token_count(content: bytes) -> int:
    text = content.decode("utf-8", errors="replace")
    if len(content) > COUNT_OFF_LOOP_BYTES:
        return await asyncio.to_thread(count_tokens, text)
    return count_tokens(text)


async def ingest_event(deps: Deps, principal: Principal, command: IngestEvent) -> Ingested:
    validation.session_id(command.session_id)
    validation.one_of(command.event_type, EVENT_TYPES, "event_type")
    validation.content(command.content, deps.settings.max_content_bytes)
    metadata = validation.metadata(command.metadata)
    # Before any work for the call: a tenant over its budget costs the others nothing more.
    await deps.write_budget.charge(principal.scope.org_id, write_bytes(command.content, metadata))
    client_key, retried_id = parse_key(command.idempotency_key)
    org = principal.scope.org_id
    session = SessionRef(org, command.session_id)
    body = EventIngested(session_id=command.session_id, event_type=command.event_type,
                         content_b64=content_b64(command.content), metadata=metadata,
                         content_sha256=sha256_hex(command.content),
                         token_count=await _token_count(command.content), idempotency_key=client_key)
    event = Event.of(body, scope=principal.scope, actor=principal.subject, aggregate=session.aggregate,
                     **({"event_id": retried_id} if retried_id else {}))

    if command.idempotency_key:  # a retry: answer with the first result, if it has landed
        await deps.freshness.wait(session)
        if (first := await _first(deps, org, command, event, body)) is not None:
            return first
    await require_writable(deps, principal, command.session_id, "write")

    retry = retry_with_key(command.idempotency_key or event_key(event.event_id), "event")
    outcome = await deps.append(event, session, retry=retry)
    if outcome == ProjectionOutcome.OUT_OF_SCOPE:  # another scope created the session first
        raise refused_write(deps, principal, command.session_id, "write")
    if outcome != ProjectionOutcome.APPLIED or retried_id:
        # A concurrent call won the key or the id (IDEMPOTENCY_KEY_TAKEN, DUPLICATE; an APPLIED
        # heard for a retried id may be the first record's), or the outcome must be read back.
        if (first := await _first(deps, org, command, event, body)) is not None:
            return first
        if retried_id:  # archived, but not in this org: the id is another's
            raise key_reused(command.idempotency_key, retried_id)
        raise refused_write(deps, principal, command.session_id, "write")  # archived, not applied: OUT_OF_SCOPE
    return Ingested(event.event_id, body.content_sha256, body.token_count)


async def _first(deps: Deps, org: str, command: IngestEvent, event: Event,
                 body: EventIngested) -> Ingested | None:
    """The answer of the request that first used this call's key, if it has landed; refused if
    that request was another one."""
    if body.idempotency_key:
        row = await deps.read_back.ingested_with_key(org, body.idempotency_key, command.session_id,
                                                     event.scope.path)
        if row is None:
            return None
        if (row.event_type, row.content_sha256, row.metadata) != \
                (body.event_type, body.content_sha256, body.metadata):
            raise key_reused(command.idempotency_key, row.event_id)
        return Ingested(row.event_id, row.content_sha256, row.token_count)
    row = await first_with_id(deps.read_back, org, event, command.idempotency_key, command.session_id,
                              deps.read_back.ingested)  # a server key: the event id
    return None if row is None else Ingested(row.event_id, row.content_sha256, row.token_count)

