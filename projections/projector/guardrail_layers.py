"""The projection of `guardrail.published` into guardrail_layers (docs/guardrails.md).

Two steps, both inside the projector's batch transaction with `app.org_id` = the event's owner org
('_platform' for L1):

1. `refuse_layers(conn, org_id, events)`, before anything of the batch is written: which of an
   org's guardrail.published events must be refused. A refused event is neither archived nor
   applied, so a refusal writes no row anywhere; it is logged, counted
   (`context_engine_guardrail_layers_refused_total{outcome}` on the worker's metrics) and
   announced to the waiting publish command with the projector's NOTIFY, under its outcome.
2. `apply_guardrail_published(conn, org_id, event)`, for an event that was archived now: the
   checks again (against the rows as they are now), then the new version.

Outcomes (the session projector reports them like its own):

- APPLIED: a new version of the (scope, level) layer, version = previous + 1 (1 for the first).
- DUPLICATE: this event_id was already applied; nothing changes.
- REJECTED_MALFORMED: the payload is not a well-formed schema-1 layer (missing or mistyped
  field, content over 64 KiB, or an aggregate other than guardrail/<scope path>/L<level>, which
  would break the per-(scope, level) order).
- REJECTED_SCOPE: the level does not match the depth of the owner scope (L1 platform, L2 org,
  L3 team, L4 agent), or the signed scope path is not the event's scope.
- REJECTED_BAD_SIGNATURE: the content does not hash to the signed content_sha256, the fingerprint
  is not the key's, or the Ed25519 signature does not verify.
- REJECTED_UNTRUSTED_KEY: the key is not in the trust set (context_engine/guardrails/trust.py;
  by default only the home's operator key, read from its public half). A trust set that cannot
  be read refuses nothing: the batch waits and is tried again (GuardrailTrustUnavailable).
- REJECTED_STALE: signed_at_ms is not later than the current version's; an old signed layer
  re-appended (a replay meant to roll a layer back) is refused this way.

Every decision depends only on the event, the trust set and the history of its own (scope,
level), which lives in one partition, so a replay with the same trust set decides the same. A
refusal is final: a later trust set that would take the key does not bring the event back (it was
never archived); publish the layer again.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import asyncpg
import structlog

from context_engine.events import GUARDRAIL_PUBLISHED, Event, EventDecodeError, decode
from context_engine.guardrails.signing import (
    LEVEL_NAMES,
    MAX_LAYER_BYTES,
    LayerFormatError,
    SignedLayer,
    guardrail_aggregate,
    owner_level,
    verify_layer,
)
from context_engine.guardrails.trust import configured_trusted_fingerprints
from context_engine.metrics import GUARDRAIL_LAYERS_REFUSED
from projections.projector.outcome import ProjectionOutcome
from projections.reads.guardrail_layers import GuardrailLayerRow, published_layer
from projections.store.pool import set_config_sql

log = structlog.get_logger("context_engine.guardrails")

APPLIED = ProjectionOutcome.APPLIED
DUPLICATE = ProjectionOutcome.DUPLICATE
REJECTED_MALFORMED = ProjectionOutcome.REJECTED_MALFORMED
REJECTED_SCOPE = ProjectionOutcome.REJECTED_SCOPE
REJECTED_BAD_SIGNATURE = ProjectionOutcome.REJECTED_BAD_SIGNATURE
REJECTED_UNTRUSTED_KEY = ProjectionOutcome.REJECTED_UNTRUSTED_KEY
REJECTED_STALE = ProjectionOutcome.REJECTED_STALE
REJECTED = frozenset({REJECTED_MALFORMED, REJECTED_SCOPE, REJECTED_BAD_SIGNATURE,
                      REJECTED_UNTRUSTED_KEY, REJECTED_STALE})

_APPLIED_IDS = "SELECT event_id FROM guardrail_layers WHERE org_id = $1 AND event_id = ANY($2::uuid[])"
_CURRENT = """
SELECT version, effective_at_ms FROM guardrail_layers
WHERE org_id = $1 AND scope_path = $2 AND level = $3
ORDER BY version DESC LIMIT 1
"""
_INSERT = """
INSERT INTO guardrail_layers (org_id, scope_path, level, version, event_id, content, content_hash,
                              effective_at_ms, signature, public_key, key_fingerprint,
                              published_by, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
"""


@dataclass(frozen=True, slots=True)
class Refusal:
    outcome: ProjectionOutcome  # one of REJECTED
    detail: str


def check_layer(event: Event, trusted: Collection[str]) -> SignedLayer | Refusal:
    """The checks that need only the event and the trust set: the layer, or why it is refused."""
    try:
        layer = SignedLayer.from_payload(event.payload)
    except LayerFormatError as exc:
        return Refusal(REJECTED_MALFORMED, str(exc))
    if len(layer.content.encode("utf-8")) > MAX_LAYER_BYTES:
        return Refusal(REJECTED_MALFORMED, f"content is over {MAX_LAYER_BYTES} bytes")
    if owner_level(event.scope) != layer.level:
        return Refusal(REJECTED_SCOPE, f"an L{layer.level} ({LEVEL_NAMES[layer.level]}) layer "
                                       f"cannot be owned by scope {event.scope.path!r}")
    if layer.scope_path != event.scope.path:
        return Refusal(REJECTED_SCOPE, f"signed for scope {layer.scope_path!r} but published "
                                       f"under {event.scope.path!r}")
    if event.aggregate != (want := guardrail_aggregate(layer.scope_path, layer.level)):
        return Refusal(REJECTED_MALFORMED, f"aggregate {event.aggregate!r} is not {want!r}")
    if (reason := verify_layer(layer)) is not None:
        return Refusal(REJECTED_BAD_SIGNATURE, reason)
    if layer.key_fingerprint not in trusted:
        return Refusal(REJECTED_UNTRUSTED_KEY, f"key {layer.key_fingerprint[:16]}… is not a trusted guardrail key")
    return layer


async def refuse_layers(conn: asyncpg.Connection, org_id: str, events: Sequence[Event], *,
                        trusted: Collection[str] | None = None, report: bool = True) -> dict[str, Refusal]:
    """Which guardrail.published events among `events` (one org's, in log order; other types are
    passed over) must be refused, by event_id. An event already applied is not looked at (the
    archive makes it a DUPLICATE), nor a repeat of one accepted earlier in `events`; a layer is
    stale against the current version or against one accepted earlier in `events`.

    `trusted`: the trust set; None = this process's configured one, looked at again before a key
    it does not hold is refused for good (a key file made a moment ago counts). Without any
    (its files never read), GuardrailTrustUnavailable, an OSError: the batch is tried again.
    `report`: log and count each refusal (off for verify, which only asks)."""
    layers = [e for e in events if e.type == GUARDRAIL_PUBLISHED]
    if not layers:
        return {}
    if trusted is None:
        trusted = configured_trusted_fingerprints()
        if any(_claimed_fingerprint(e) not in trusted for e in layers):
            trusted = configured_trusted_fingerprints(recheck=True)  # a stat per such layer
    applied = {str(r["event_id"]) for r in await conn.fetch(
        _APPLIED_IDS, org_id, [uuid.UUID(e.event_id) for e in layers])}
    latest: dict[tuple[str, int], tuple[int, int] | None] = {}  # (scope, level) -> (version, signed_at)
    refused: dict[str, Refusal] = {}
    for event in layers:
        if event.event_id in applied or event.event_id in refused:
            continue
        decided = check_layer(event, trusted)
        if isinstance(decided, SignedLayer):
            key = (decided.scope_path, decided.level)
            if key not in latest:
                row = await conn.fetchrow(_CURRENT, org_id, *key)
                latest[key] = (row["version"], row["effective_at_ms"]) if row is not None else None
            current = latest[key]
            if current is None or decided.signed_at_ms > current[1]:
                latest[key] = ((current[0] if current else 0) + 1, decided.signed_at_ms)
                applied.add(event.event_id)  # a repeat later in `events` is a duplicate
                continue
            decided = Refusal(REJECTED_STALE, f"signed_at_ms {decided.signed_at_ms} is not later than "
                                              f"version {current[0]}'s {current[1]}")
        refused[event.event_id] = decided
        if report:
            GUARDRAIL_LAYERS_REFUSED.labels(decided.outcome).inc()
            log.warning("guardrail layer refused", outcome=decided.outcome, detail=decided.detail,
                        org_id=org_id, scope_path=event.scope.path, event_id=event.event_id,
                        key_fingerprint=_claimed_fingerprint(event))
    return refused


async def apply_guardrail_published(conn: asyncpg.Connection, org_id: str, event: Event, *,
                                    trusted: Collection[str] | None = None) -> ProjectionOutcome:
    """Project one guardrail.published event (see the module docstring for the outcomes). A
    refused event writes nothing here either. `trusted`: as for refuse_layers."""
    if event.type != GUARDRAIL_PUBLISHED:
        raise ValueError(f"not a {GUARDRAIL_PUBLISHED} event: {event.type}")
    if event.scope.org_id != org_id:
        raise ValueError(f"event of org {event.scope.org_id!r} applied under org {org_id!r}")
    event_id = uuid.UUID(event.event_id)
    if await conn.fetchval("SELECT EXISTS (" + _APPLIED_IDS + ")", org_id, [event_id]):
        return DUPLICATE
    # One (scope, level) is one partition, hence one projector at a time; the primary key
    # (org, scope, level, version) would refuse a second writer of the same version anyway.
    refused = await refuse_layers(conn, org_id, [event], trusted=trusted)
    if (why := refused.get(event.event_id)) is not None:
        return why.outcome
    layer = SignedLayer.from_payload(event.payload)
    current = await conn.fetchrow(_CURRENT, org_id, layer.scope_path, layer.level)
    version = 1 if current is None else current["version"] + 1
    await conn.execute(_INSERT, org_id, layer.scope_path, layer.level, version, event_id, layer.content,
                       layer.content_sha256, layer.signed_at_ms, layer.signature, layer.public_key,
                       layer.key_fingerprint, event.actor, event.occurred)
    return APPLIED


async def refused_on_the_log(conn: asyncpg.Connection, raw: bytes, *,
                             trusted: Collection[str] | None = None) -> bool:
    """Whether a log record is a guardrail layer the projector refuses now (so it is rightly
    neither archived nor set aside): verify's question. `conn` may read the record's org."""
    try:
        event = decode(raw)
    except (EventDecodeError, ValueError, TypeError, AttributeError, RecursionError):
        return False
    if event.type != GUARDRAIL_PUBLISHED:
        return False
    async with conn.transaction(readonly=True):
        await conn.execute("SELECT set_config('app.org_id', $1, true)", event.scope.org_id)
        return bool(await refuse_layers(conn, event.scope.org_id, [event], trusted=trusted, report=False))


async def projected_layer(conn: asyncpg.Connection, org_id: str, event_id: str) -> GuardrailLayerRow | None:
    """The layer the event became, if projected yet: read in a read-only transaction of its org."""
    async with conn.transaction(readonly=True):
        await conn.execute(set_config_sql({"app.org_id": org_id}))
        return await published_layer(conn, org_id, event_id)


def _claimed_fingerprint(event: Event) -> str | None:
    value = event.payload.get("key_fingerprint") if isinstance(event.payload, dict) else None
    return value[:64] if isinstance(value, str) else None
