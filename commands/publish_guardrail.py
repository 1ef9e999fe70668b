"""`context-engine guardrail publish`: sign a guardrail layer with the operator key, append it to
the domain-event log, and wait until the projection has decided about it (docs/guardrails.md).

Operator-only: this runs beside the stack with the admin database URL and the broker address
(like `reindex`), never through the API. Every check that can fail is made before anything is
appended: the level against the owner scope, the file (readable, UTF-8, not blank, at most
64 KiB, no NUL), the signing key, and (given the trust set, as the CLI does) that the key is one
the projection accepts. The event is keyed by `guardrail/<scope path>/L<level>`, so the versions
of one (scope, level) are totally ordered in one partition.

It appends and waits as every command does (streams/acknowledgement.py `append_and_wait`): the
projection's decision comes back as the projector's NOTIFY (`event_archived`, the event id with
its outcome); a refused layer leaves no row to read back.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import time
from collections.abc import Collection
from dataclasses import dataclass

import asyncpg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from context_engine.errors import InvalidArgument, Unavailable
from context_engine.events import Event, GuardrailPublished
from context_engine.guardrails.signing import (
    LEVEL_NAMES,
    MAX_LAYER_BYTES,
    content_sha256,
    fingerprint,
    guardrail_aggregate,
    owner_level,
    sign_layer,
)
from context_engine.scope import Scope
from projections.projector.guardrail_layers import REJECTED_UNTRUSTED_KEY, projected_layer
from projections.reads.guardrail_layers import (
    GuardrailLayerRow,
    current_layer,
    current_layers,
)
from projections.store.pool import org_transaction
from streams.acknowledgement import ArchiveWatch, EventRejected, RetryAdvice, append_and_wait
from streams.log import EventLog

DEFAULT_TIMEOUT_SECONDS = 30.0
NOT_DURABLE_YET = "NOT_DURABLE_YET"
# What an operator whose publish was not acknowledged in time is told.
RETRY = RetryAdvice("the worker projects it when it reaches it; a publish of the same file answers unchanged "
                    "once it is current, and appends it again until then")


class GuardrailPublishError(RuntimeError):
    """The layer was appended but not accepted (rejected, or not projected in time)."""


@dataclass(frozen=True)
class PublishGuardrail:
    level: int
    scope: Scope      # the owner scope: guardrails.signing.layer_scope(level, ...)
    content: str
    force: bool = False  # publish even when the content is already the current version's


@dataclass(frozen=True)
class Published:
    level: int
    scope_path: str
    version: int
    content_hash: str
    effective_at_ms: int
    fingerprint: str
    event_id: str = ""      # "" when nothing was appended (unchanged)
    unchanged: bool = False  # the content already was the current version's; nothing appended


def read_layer_file(path: pathlib.Path) -> str:
    """The layer text, exactly as in the file (its SHA-256 is the content hash)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgument("file", f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_LAYER_BYTES:
        raise InvalidArgument("file", f"{path} has {len(data)} bytes; a layer is at most {MAX_LAYER_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument("file", f"{path} is not UTF-8 text (byte {exc.start})") from exc
    if not text.strip():
        raise InvalidArgument("file", f"{path} is empty")
    if "\x00" in text:
        raise InvalidArgument("file", f"{path} contains a NUL character")
    return text


def build_event(key: Ed25519PrivateKey, command: PublishGuardrail, *, actor: str, now_ms: int,
                current: GuardrailLayerRow | None) -> Event:
    """The signed guardrail.published event. signed_at is now, or 1 ms after the current
    version's when the clock has not passed it (the projection requires it to increase)."""
    if owner_level(command.scope) != command.level:
        raise InvalidArgument("scope", f"{command.scope.path!r} cannot own an L{command.level} layer")
    signed_at = max(now_ms, current.effective_at_ms + 1) if current is not None else now_ms
    layer = sign_layer(key, level=command.level, scope_path=command.scope.path,
                       content=command.content, signed_at_ms=signed_at)
    return Event.of(GuardrailPublished(layer), scope=command.scope,
                    aggregate=guardrail_aggregate(command.scope.path, command.level), actor=actor)


def require_trusted(key: Ed25519PrivateKey, trusted: Collection[str]) -> None:
    """InvalidArgument unless the projection would accept layers signed by `key`."""
    if (fp := fingerprint(key)) not in trusted:
        raise InvalidArgument("key", f"the key {fp[:16]}… is not a trusted guardrail key, so the worker would "
                                     "refuse its layers: sign with a trusted key, or add its fingerprint or "
                                     "public key file to CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS of the worker "
                                     "and the API")


async def publish_guardrail(command: PublishGuardrail, *, key: Ed25519PrivateKey, pool: asyncpg.Pool,
                            log: EventLog, watch: ArchiveWatch, actor: str,
                            timeout: float = DEFAULT_TIMEOUT_SECONDS,
                            trusted: Collection[str] | None = None) -> Published:
    """Sign, append and wait until the projection has decided, as every command appends
    (streams/acknowledgement.py; `log` signs the record, streams/record_auth.py). Raises
    GuardrailPublishError when it refused the layer or did not decide within `timeout`, and
    InvalidArgument before appending anything when `trusted` is given and the key is not in it."""
    if trusted is not None:
        require_trusted(key, trusted)
    org = command.scope.org_id
    async with org_transaction(pool, org, readonly=True) as conn:
        current = await current_layer(conn, command.scope, command.level)
    if current is not None and current.content_hash == content_sha256(command.content) and not command.force:
        return Published(command.level, current.scope_path, current.version, current.content_hash,
                         current.effective_at_ms, current.fingerprint, unchanged=True)
    event = build_event(key, command, actor=actor, now_ms=time.time_ns() // 1_000_000, current=current)
    row = await append_layer(event, pool=pool, log=log, watch=watch, timeout=timeout)
    return Published(row.level, row.scope_path, row.version, row.content_hash, row.effective_at_ms,
                     row.fingerprint, event_id=event.event_id)


async def append_layer(event: Event, *, pool: asyncpg.Pool, log: EventLog, watch: ArchiveWatch,
                       timeout: float = DEFAULT_TIMEOUT_SECONDS) -> GuardrailLayerRow:
    """Append a guardrail.published event and wait for the projection's decision: the version it
    became, or GuardrailPublishError when the projection refused it or did not decide within
    `timeout`. A refused layer is neither archived nor set aside: only the projector's
    announcement says so, and a missed one reads as "not projected in time"."""
    try:
        outcome = await append_and_wait(log, watch, None, event, None, timeout=timeout, retry=RETRY)
    except EventRejected as exc:
        raise GuardrailPublishError(f"the projector set event {event.event_id} aside "
                                    "(rejected_events says why)") from exc
    except Unavailable as exc:
        if exc.reason != NOT_DURABLE_YET:
            raise GuardrailPublishError(f"the log did not accept the layer: {exc.message}") from exc
        raise GuardrailPublishError(f"appended, but not projected within {timeout:g}s: is the worker running? "
                                    f"({exc.message})") from exc
    async with pool.acquire() as conn:
        if (row := await projected_layer(conn, event.scope.org_id, event.event_id)) is not None:
            return row
    why = ("the worker does not trust the signing key " + event.payload["key_fingerprint"][:16] + "…"
           if outcome == REJECTED_UNTRUSTED_KEY else "the worker's log says why")
    raise GuardrailPublishError(f"the projection refused the layer ({outcome or 'not applied'}): {why}; "
                                f"event {event.event_id} was neither stored nor applied")


async def list_layers(pool: asyncpg.Pool, caller: Scope, *, trusted: Collection[str]) -> list[GuardrailLayerRow]:
    """The current layers a caller at `caller` gets (what ResolveGuardrailLayers answers)."""
    async with org_transaction(pool, caller.org_id, readonly=True) as conn:
        return await current_layers(conn, caller, trusted=trusted)


def format_ms(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe(row: Published | GuardrailLayerRow) -> str:
    return (f"L{row.level} ({LEVEL_NAMES[row.level]}) {row.scope_path}: version {row.version}, "
            f"content_hash {row.content_hash}, effective_at {format_ms(row.effective_at_ms)}, "
            f"key {row.fingerprint[:16]}" + (f", layer id {row.event_id}"
                                             if isinstance(row, Published) and row.event_id else ""))
