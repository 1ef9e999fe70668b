"""IngestEvent: persist one conversation event of a session.

Idempotency (docs/architecture.md, "Retries and idempotency"). Every call has a key a retry can
send in the `idempotency-key` header:
- the caller's own key: stored with the event; per session, the first event with a key wins it
  (the projector settles a race), and a later call with that key answers with that event, or is
  refused (FAILED_PRECONDITION, IDEMPOTENCY_KEY_REUSED) when its content, event_type or metadata
  differ from what the first stored;
- otherwise the server's, `event_key(event_id)`: it names the event itself and is not stored. A
  retry with it appends the same event id again; the archive keeps one event per id, so the
  retry returns the event if it was applied and writes it once otherwise.
Client keys may not start with SERVER_KEY_PREFIX except in exactly the form the server issues.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from commands.deps import Deps
from commands.session_access import refused_write, require_writable
from commands.session_owners import session_claimed_elsewhere
from commands.write_budget import write_bytes
from context_engine import validation
from context_engine.auth import Principal
from context_engine.errors import FailedPrecondition, InvalidArgument
from context_engine.events import Event, EventIngested, SessionRef, content_b64
from context_engine.hashing import sha256_hex
from inference.tokens import count_tokens
from projections.projector.outcome import ProjectionOutcome
from projections.reads import sessions
from projections.store.pool import org_transaction

EVENT_TYPES = ("message", "tool_output", "workflow_event")
IDEMPOTENCY_HEADER = "idempotency-key"
# Keys the server issues (`event_key`), in a namespace client keys may not use.
SERVER_KEY_PREFIX = "ce-event:"


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


def event_key(event_id: str) -> str:
    """The idempotency key the server gives an event whose caller sent none."""
    return f"{SERVER_KEY_PREFIX}{event_id}"


def idempotency_key(value: str) -> tuple[str, str | None]:
    """Check a client's `idempotency-key`: (the key, None) for a key of the client's own, ("", event
    id) for a key the server issued (`event_key`). Shared by IngestEvent and PushContext."""
    if len(value) > validation.MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument(IDEMPOTENCY_HEADER, f"is longer than {validation.MAX_IDEMPOTENCY_KEY} characters")
    if not value.startswith(SERVER_KEY_PREFIX):
        return value, None
    event_id = value[len(SERVER_KEY_PREFIX):]
    if not validation.is_canonical_uuid(event_id):
        raise InvalidArgument(IDEMPOTENCY_HEADER, f"keys starting with {SERVER_KEY_PREFIX!r} are the server's: "
                              f"send one only as an UNAVAILABLE answer gave it ({SERVER_KEY_PREFIX}<event id>)")
    return "", event_id


def key_reused(key: str, first_event_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"idempotency-key {key!r} was used by event {first_event_id} with other content: a key names "
        "one request; send this one with a new key", reason="IDEMPOTENCY_KEY_REUSED",
        metadata={"field": IDEMPOTENCY_HEADER, "idempotency_key": key, "event_id": first_event_id})


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
    client_key, retried_id = idempotency_key(command.idempotency_key)
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

    outcome = await deps.append(event, session, idempotency_key=command.idempotency_key
                                or event_key(event.event_id))
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
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        if body.idempotency_key:
            row = await sessions.event_by_idempotency_key(conn, org, body.idempotency_key, command.session_id,
                                                         event.scope.path)
            if row is None:
                return None
            if (row.event_type, row.content_sha256, row.metadata) != \
                    (body.event_type, body.content_sha256, body.metadata):
                raise key_reused(command.idempotency_key, row.event_id)
            return Ingested(row.event_id, row.content_sha256, row.token_count)
        row = await first_with_id(conn, org, event, command.idempotency_key, command.session_id,
                                  sessions.event_by_id)  # a server key: the event id
        return None if row is None else Ingested(row.event_id, row.content_sha256, row.token_count)


async def first_with_id(conn, org: str, event: Event, key: str, session_id: str, projected):
    """The row `projected(conn, org, event_id)` wrote for the first event with this call's event
    id (IngestEvent's server key, every PushContext key), None if none is archived yet. Refused
    as IDEMPOTENCY_KEY_REUSED when that was another request (other bytes, or another scope's:
    never an answer to this caller), as SESSION_OUT_OF_SCOPE when it was archived, not applied."""
    archived = await sessions.archived_event(conn, org, event.event_id)
    if archived is None:
        return None
    if (archived.type, archived.aggregate, archived.content_hash) != \
            (event.type, event.aggregate, event.content_hash):
        raise key_reused(key, archived.event_id)
    if (row := await projected(conn, org, event.event_id)) is None:
        raise session_claimed_elsewhere(session_id)  # archived, not applied: OUT_OF_SCOPE
    if row.scope_path != event.scope.path:
        raise key_reused(key, archived.event_id)
    return row
