"""Search: hybrid retrieval over the caller's visible corpus (projections/reads/search.py) and the
chunks shared with it for `read`, with the caller's tenant floor when the request sends none.
Each result that came through a grant is an audited read (commands/access_audit.py)."""

from __future__ import annotations

from commands import access_audit
from commands.deps import Deps
from context_engine.auth import Principal
from projections.reads.search import SearchOutcome, SearchQuery
from projections.reads.search import search as hybrid_search
from projections.retrieval.recipes import SEARCH


async def search(deps: Deps, principal: Principal, query: SearchQuery) -> SearchOutcome:
    scope = principal.scope
    outcome = await hybrid_search(deps.pool, deps.query_vectors, scope, query,
                                  deps.settings.tenant_min_score(scope.org_id), recipe=SEARCH)
    for chunk_id, share_id in outcome.shared.items():
        access_audit.allowed(deps, principal, "chunk", chunk_id, "read", share_id=share_id)
    return outcome
