"""Search: hybrid retrieval over the caller's visible corpus (projections/search.py), with the
caller's tenant floor when the request sends none."""

from __future__ import annotations

from commands.deps import Deps
from context_engine.auth import Principal
from projections.search import SearchOutcome, SearchQuery
from projections.search import search as hybrid_search


async def search(deps: Deps, principal: Principal, query: SearchQuery) -> SearchOutcome:
    scope = principal.scope
    return await hybrid_search(deps.pool, deps.query_vectors, scope, query,
                               deps.settings.tenant_min_score(scope.org_id))
