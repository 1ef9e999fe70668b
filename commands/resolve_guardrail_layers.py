"""ResolveGuardrailLayers: the caller's current L1-L4 (its chain: platform, org, team, agent),
each signed by a key trusted now (projections/guardrail_queries.py)."""

from __future__ import annotations

from commands.deps import Deps
from context_engine.auth import Principal
from context_engine.guardrails.trust import trusted_fingerprints
from projections.database import org_transaction
from projections.guardrail_queries import GuardrailLayerRow, current_layers


async def resolve_guardrail_layers(deps: Deps, principal: Principal) -> list[GuardrailLayerRow]:
    """Ascending by level; a level with no layer is absent. UNAVAILABLE without a trust set."""
    scope = principal.scope
    trusted = trusted_fingerprints(deps.settings)  # before a connection is taken
    async with org_transaction(deps.pool, scope.org_id, readonly=True) as conn:
        return await current_layers(conn, scope, trusted=trusted)
