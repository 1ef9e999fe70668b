"""The projection of `guardrail.published` into guardrail_layers (docs/guardrails.md).

`apply_guardrail_published(conn, org_id, event)` is called by the session projector's per-org
applier for every fresh `guardrail.published` event, inside the batch's transaction, with
`app.org_id` = org_id = the event's owner org ('_platform' for L1). It returns an outcome string
(the projector reports it like its own outcomes):

- APPLIED: a new version of the (scope, level) layer, version = previous + 1 (1 for the first).
- DUPLICATE: this event_id was already applied or rejected; nothing changes.
- REJECTED_MALFORMED: the payload is not a well-formed schema-1 layer (missing or mistyped
  field, content over 64 KiB, or an aggregate other than guardrail/<scope path>/L<level>, which
  would break the per-(scope, level) order).
- REJECTED_SCOPE: the level does not match the depth of the owner scope (L1 platform, L2 org,
  L3 team, L4 agent), or the signed scope path is not the event's scope.
- REJECTED_BAD_SIGNATURE: the content does not hash to the signed content_sha256, the fingerprint
  is not the key's, or the Ed25519 signature does not verify.
- REJECTED_UNTRUSTED_KEY: a set of trusted key fingerprints was given and the key is not in it.
- REJECTED_STALE: signed_at_ms is not later than the current version's; an old signed layer
  re-appended (a replay meant to roll a layer back) is refused this way.

A rejected event is recorded in guardrail_rejections (why, with its hashes) and never served:
only guardrail_layers is read by the queries. Every decision depends only on the event and the
history of its own (scope, level), which lives in one partition, so replay decides the same.

Re-publishing identical content is a new version (the operator signed it again, at a later
time); the operator command refuses that unless asked (`--force`), so a double run does not
bump a version by accident.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

import asyncpg

from context_engine.events import GUARDRAIL_PUBLISHED, Event
from context_engine.guardrails.signing import (
    LEVEL_NAMES,
    MAX_LAYER_BYTES,
    LayerFormatError,
    SignedLayer,
    guardrail_aggregate,
    owner_level,
    verify_layer,
)

# Same strings as the session projector's outcomes (not imported: it imports this module).
APPLIED = "APPLIED"
DUPLICATE = "DUPLICATE"
REJECTED_MALFORMED = "REJECTED_MALFORMED"
REJECTED_SCOPE = "REJECTED_SCOPE"
REJECTED_BAD_SIGNATURE = "REJECTED_BAD_SIGNATURE"
REJECTED_UNTRUSTED_KEY = "REJECTED_UNTRUSTED_KEY"
REJECTED_STALE = "REJECTED_STALE"
REJECTED = frozenset({REJECTED_MALFORMED, REJECTED_SCOPE, REJECTED_BAD_SIGNATURE,
                      REJECTED_UNTRUSTED_KEY, REJECTED_STALE})

_SEEN = """
SELECT EXISTS (SELECT 1 FROM guardrail_layers WHERE org_id = $1 AND event_id = $2)
    OR EXISTS (SELECT 1 FROM guardrail_rejections WHERE org_id = $1 AND event_id = $2)
"""
_CURRENT = """
SELECT version, effective_at_ms FROM guardrail_layers
WHERE org_id = $1 AND scope_path = $2 AND level = $3
ORDER BY version DESC LIMIT 1
FOR UPDATE
"""
_INSERT = """
INSERT INTO guardrail_layers (org_id, scope_path, level, version, event_id, content, content_hash,
                              effective_at_ms, signature, public_key, key_fingerprint,
                              published_by, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
"""
_REJECT = """
INSERT INTO guardrail_rejections (event_id, org_id, scope_path, level, outcome, detail, content_hash,
                                  key_fingerprint, published_by, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (event_id) DO NOTHING
"""


async def apply_guardrail_published(conn: asyncpg.Connection, org_id: str, event: Event, *,
                                    trusted_fingerprints: Collection[str] | None = None) -> str:
    """Project one guardrail.published event (see the module docstring for the outcomes).

    `trusted_fingerprints`: when given, only layers signed by one of these keys are accepted.
    Replay must then be given the same set, or it decides differently."""
    if event.type != GUARDRAIL_PUBLISHED:
        raise ValueError(f"not a {GUARDRAIL_PUBLISHED} event: {event.type}")
    if event.scope.org_id != org_id:
        raise ValueError(f"event of org {event.scope.org_id!r} applied under org {org_id!r}")
    event_id = uuid.UUID(event.event_id)
    if await conn.fetchval(_SEEN, org_id, event_id):
        return DUPLICATE

    async def reject(outcome: str, detail: str, layer: SignedLayer | None = None) -> str:
        raw_level = event.payload.get("level") if isinstance(event.payload, dict) else None
        level = layer.level if layer else (raw_level if type(raw_level) is int and 1 <= raw_level <= 4 else None)
        await conn.execute(_REJECT, event_id, org_id, event.scope.path, level, outcome, detail,
                           layer.content_sha256 if layer else None,
                           layer.key_fingerprint if layer else None, event.actor, event.occurred)
        return outcome

    try:
        layer = SignedLayer.from_payload(event.payload)
    except LayerFormatError as exc:
        return await reject(REJECTED_MALFORMED, str(exc))
    if len(layer.content.encode("utf-8")) > MAX_LAYER_BYTES:
        return await reject(REJECTED_MALFORMED, f"content is over {MAX_LAYER_BYTES} bytes", layer)
    if owner_level(event.scope) != layer.level:
        return await reject(REJECTED_SCOPE, f"an L{layer.level} ({LEVEL_NAMES[layer.level]}) layer "
                                            f"cannot be owned by scope {event.scope.path!r}", layer)
    if layer.scope_path != event.scope.path:
        return await reject(REJECTED_SCOPE, f"signed for scope {layer.scope_path!r} but published "
                                            f"under {event.scope.path!r}", layer)
    if event.aggregate != (want := guardrail_aggregate(layer.scope_path, layer.level)):
        return await reject(REJECTED_MALFORMED, f"aggregate {event.aggregate!r} is not {want!r}", layer)
    if (reason := verify_layer(layer)) is not None:
        return await reject(REJECTED_BAD_SIGNATURE, reason, layer)
    if trusted_fingerprints is not None and layer.key_fingerprint not in trusted_fingerprints:
        return await reject(REJECTED_UNTRUSTED_KEY,
                            f"key {layer.key_fingerprint[:16]}… is not a trusted guardrail key", layer)
    current = await conn.fetchrow(_CURRENT, org_id, layer.scope_path, layer.level)
    if current is not None and layer.signed_at_ms <= current["effective_at_ms"]:
        return await reject(REJECTED_STALE, f"signed_at_ms {layer.signed_at_ms} is not later than "
                                            f"version {current['version']}'s {current['effective_at_ms']}",
                            layer)
    version = 1 if current is None else current["version"] + 1
    await conn.execute(_INSERT, org_id, layer.scope_path, layer.level, version, event_id, layer.content,
                       layer.content_sha256, layer.signed_at_ms, layer.signature, layer.public_key,
                       layer.key_fingerprint, event.actor, event.occurred)
    return APPLIED
