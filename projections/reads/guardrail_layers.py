"""Reads of the guardrail layers, for ResolveGuardrailLayers, ValidatePrompt, AssembleContext and
the operator command. SQL only, no protobuf.

Every function takes a connection inside a transaction whose `app.org_id` is the caller's org
(`projections.store.pool.org_transaction(pool, scope.org_id)`). A caller's layers are those of its
chain (`guardrails.signing.chain_scopes`): L1 of the platform (readable by every org through the
platform_layers_readable policy), L2 of its org, L3 of its team, L4 of itself. The queries name
exactly those owners, so another team's or agent's layer is never returned even though RLS, which
is per org, would let the org's connection read it.

What callers get is checked against the trust set again at read (`trusted`, from
`guardrails.trust.trusted_fingerprints(settings)`, taken before the transaction: it raises
GuardrailTrustUnavailable, UNAVAILABLE, when there is none): a version signed by a key that is no
longer trusted is never served, and a (scope, level)'s current layer is its highest version signed
by a key trusted now. So a key taken out of the trust set takes its layers out of every prompt
within a second (the key files' next look), without a rebuild.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import asyncpg

from context_engine.guardrails.signing import chain_scopes
from context_engine.hashing import is_sha256_hex
from context_engine.scope import Scope

MAX_HASHES = 16  # more than any valid request carries (4); bounds the query


@dataclass(frozen=True, slots=True)
class GuardrailLayerRow:
    level: int
    scope_path: str
    version: int
    content: str
    content_hash: str
    effective_at_ms: int
    fingerprint: str       # SHA-256 of the signing key's raw public key
    current: bool = True   # the highest version of its (scope, level)


def _chain(scope: Scope) -> tuple[list[str], list[str], list[int]]:
    owners = chain_scopes(scope)
    return [s.org_id for _, s in owners], [s.path for _, s in owners], [lvl for lvl, _ in owners]


def _row(r: asyncpg.Record) -> GuardrailLayerRow:
    return GuardrailLayerRow(level=r["level"], scope_path=r["scope_path"], version=r["version"],
                             content=r["content"], content_hash=r["content_hash"],
                             effective_at_ms=r["effective_at_ms"], fingerprint=r["key_fingerprint"],
                             current=r["current"])


_CURRENT = """
SELECT g.level, g.scope_path, g.version, g.content, g.content_hash, g.effective_at_ms,
       g.key_fingerprint, true AS current
FROM unnest($1::text[], $2::text[], $3::smallint[]) AS w(org_id, scope_path, level)
CROSS JOIN LATERAL (
    SELECT * FROM guardrail_layers g
    WHERE g.org_id = w.org_id AND g.scope_path = w.scope_path AND g.level = w.level
      AND g.key_fingerprint = ANY($4::text[])
    ORDER BY g.version DESC LIMIT 1
) g
ORDER BY g.level
"""


async def current_layers(conn: asyncpg.Connection, scope: Scope, *,
                         trusted: Collection[str]) -> list[GuardrailLayerRow]:
    """The caller's current L1-L4, ascending by level; a level with no layer is absent. Only
    layers signed by a `trusted` key count."""
    return [_row(r) for r in await conn.fetch(_CURRENT, *_chain(scope), sorted(trusted))]


_BY_HASH = """
SELECT DISTINCT ON (g.content_hash)
       g.level, g.scope_path, g.version, g.content, g.content_hash, g.effective_at_ms,
       g.key_fingerprint,
       g.version = (SELECT max(c.version) FROM guardrail_layers c
                    WHERE c.org_id = g.org_id AND c.scope_path = g.scope_path AND c.level = g.level
                      AND c.key_fingerprint = ANY($5::text[]))
           AS current
FROM unnest($1::text[], $2::text[], $3::smallint[]) AS w(org_id, scope_path, level)
JOIN guardrail_layers g ON g.org_id = w.org_id AND g.scope_path = w.scope_path AND g.level = w.level
WHERE g.content_hash = ANY($4::text[]) AND g.key_fingerprint = ANY($5::text[])
ORDER BY g.content_hash, current DESC, g.level, g.version DESC
"""


async def layers_by_hash(conn: asyncpg.Connection, scope: Scope, hashes: Iterable[str], *,
                         trusted: Collection[str]) -> dict[str, GuardrailLayerRow]:
    """The caller's layers (any version, current or earlier, signed by a `trusted` key) whose
    content hash is one of `hashes`. Malformed hashes are ignored (validate_prompt reports them). An earlier version is
    returned because an orchestrator may still hold a pinned layer until its next turn boundary;
    `row.current` says whether it is the current one. When one content is at several versions or
    levels, the current one wins, then the lower level, then the higher version."""
    wanted = sorted({h for h in hashes if isinstance(h, str) and is_sha256_hex(h)})[:MAX_HASHES]
    if not wanted:
        return {}
    return {r["content_hash"]: _row(r) for r in await conn.fetch(_BY_HASH, *_chain(scope), wanted, sorted(trusted))}


async def current_layer(conn: asyncpg.Connection, owner: Scope, level: int) -> GuardrailLayerRow | None:
    """The highest version owned by `owner` at `level`, whatever its key (the operator command's
    view, which a new version must be signed later than; the transaction's app.org_id must be
    owner.org_id)."""
    r = await conn.fetchrow(
        "SELECT level, scope_path, version, content, content_hash, effective_at_ms, key_fingerprint, "
        "       true AS current "
        "FROM guardrail_layers WHERE org_id = $1 AND scope_path = $2 AND level = $3 "
        "ORDER BY version DESC LIMIT 1", owner.org_id, owner.path, level)
    return _row(r) if r is not None else None


async def published_layer(conn: asyncpg.Connection, org_id: str, event_id: str) -> GuardrailLayerRow | None:
    """The version a guardrail.published event became; None while it is not projected, and for
    good when the projection refused it (a refusal writes no row: the publish command hears of it
    from the projector's NOTIFY). The transaction's app.org_id must be org_id ('_platform' for L1)."""
    r = await conn.fetchrow(
        "SELECT level, scope_path, version, content, content_hash, effective_at_ms, key_fingerprint, "
        "       version = (SELECT max(c.version) FROM guardrail_layers c WHERE c.org_id = g.org_id "
        "                  AND c.scope_path = g.scope_path AND c.level = g.level) AS current "
        "FROM guardrail_layers g WHERE org_id = $1 AND event_id = $2::uuid", org_id, event_id)
    return _row(r) if r is not None else None
