"""Idempotency keys of the writes a caller may retry (IngestEvent, PushContext).

docs/architecture.md, "Retries and idempotency". Every such call has a key a retry can send in
the `idempotency-key` header: the caller's own, or, when it sent none, the server's `event_key`,
which names the event itself. Client keys may not start with SERVER_KEY_PREFIX except in exactly
the form the server issues. A retry that finds the first request's result answers with it
(`first_with_id`), and a key sent with other content is refused (`key_reused`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from commands.read_back import ReadBack
from commands.session_owners import session_claimed_elsewhere
from context_engine import validation
from context_engine.errors import FailedPrecondition, InvalidArgument
from context_engine.events import Event
from streams.acknowledgement import RetryAdvice

IDEMPOTENCY_HEADER = "idempotency-key"
# Keys the server issues (`event_key`), in a namespace client keys may not use.
SERVER_KEY_PREFIX = "ce-event:"


def event_key(event_id: str) -> str:
    """The idempotency key the server gives an event whose caller sent none."""
    return f"{SERVER_KEY_PREFIX}{event_id}"


def parse_key(value: str) -> tuple[str, str | None]:
    """Check a client's `idempotency-key`: (the key, None) for a key of the client's own, ("", event
    id) for a key the server issued (`event_key`)."""
    if len(value) > validation.MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument(IDEMPOTENCY_HEADER, f"is longer than {validation.MAX_IDEMPOTENCY_KEY} characters")
    if not value.startswith(SERVER_KEY_PREFIX):
        return value, None
    event_id = value[len(SERVER_KEY_PREFIX):]
    if not validation.is_canonical_uuid(event_id):
        raise InvalidArgument(IDEMPOTENCY_HEADER, f"keys starting with {SERVER_KEY_PREFIX!r} are the server's: "
                              f"send one only as an UNAVAILABLE answer gave it ({SERVER_KEY_PREFIX}<event id>)")
    return "", event_id


def retry_with_key(key: str, what: str) -> RetryAdvice:
    """What an unacknowledged keyed write's caller is told: retrying with `key` is safe."""
    return RetryAdvice(f"retry with idempotency-key {key}: a retry returns this {what} if it was applied, "
                       "and writes it once otherwise", {"idempotency_key": key})


def key_reused(key: str, first_event_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"idempotency-key {key!r} was used by event {first_event_id} with other content: a key names "
        "one request; send this one with a new key", reason="IDEMPOTENCY_KEY_REUSED",
        metadata={"field": IDEMPOTENCY_HEADER, "idempotency_key": key, "event_id": first_event_id})


class _Projected(Protocol):
    @property
    def scope_path(self) -> str: ...


Row = TypeVar("Row", bound=_Projected)


async def first_with_id(read_back: ReadBack, org: str, event: Event, key: str, session_id: str,
                        projected: Callable[[str, str], Awaitable[Row | None]]) -> Row | None:
    """The row `projected(org, event_id)` wrote for the first event with this call's event
    id (IngestEvent's server key, every PushContext key), None if none is archived yet. Refused
    as IDEMPOTENCY_KEY_REUSED when that was another request (other bytes, or another scope's:
    never an answer to this caller), as SESSION_OUT_OF_SCOPE when it was archived, not applied."""
    archived = await read_back.archived(org, event.event_id)
    if archived is None:
        return None
    if (archived.type, archived.aggregate, archived.content_hash) != \
            (event.type, event.aggregate, event.content_hash):
        raise key_reused(key, archived.event_id)
    if (row := await projected(org, event.event_id)) is None:
        raise session_claimed_elsewhere(session_id)  # archived, not applied: OUT_OF_SCOPE
    if row.scope_path != event.scope.path:
        raise key_reused(key, archived.event_id)
    return row
