"""ResolveGuardrailLayers: the caller's current L1-L4 (its chain: platform, org, team, agent),
each signed by a key trusted now (projections/reads/guardrail_layers.py)."""

from __future__ import annotations

from commands.deps import Deps
from context_engine.auth import Principal
from context_engine.guardrails.trust import trusted_fingerprints
from projections.reads.guardrail_layers import GuardrailLayerRow, current_layers
from projections.store.pool import org_transaction


async def resolve_guardrail_layers(deps: Deps, principal: Principal) -> list[GuardrailLayerRow]:
    """Ascending by level; a level with no layer is absent. UNAVAILABLE without a trust set."""
    scope = principal.scope
    trusted = trusted_fingerprints(deps.settings)  # before a connection is taken
    async with org_transaction(deps.pool, scope.org_id, readonly=True) as conn:
        return await current_layers(conn, scope, trusted=trusted)
