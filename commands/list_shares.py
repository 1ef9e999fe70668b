"""ListShares: the live grants the caller's scope created or holds (granted to its scope or an
ancestor's), oldest first and ties by share id, so pages are stable; `page` is 1-based (0 means
1), `page_size` 1-100 (0 means 100); `total_count` counts every page's grants."""

from __future__ import annotations

from dataclasses import dataclass

from commands.deps import Deps
from context_engine.auth import Principal
from context_engine.errors import InvalidArgument
from context_engine.visibility import Visibility
from projections.reads import share_grants
from projections.store.pool import org_transaction

MAX_PAGE_SIZE = 100


@dataclass(frozen=True)
class ListShares:
    page: int = 0
    page_size: int = 0


@dataclass(frozen=True)
class Listed:
    grants: list[share_grants.Grant]
    total_count: int


def page_window(page: int, page_size: int) -> tuple[int, int]:
    """(offset, limit) of the page asked for."""
    if page < 0:
        raise InvalidArgument("page", f"must be 1 or more (0 means 1), got {page}")
    if not 0 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be between 1 and {MAX_PAGE_SIZE} (0 means {MAX_PAGE_SIZE}), "
                                           f"got {page_size}")
    size = page_size or MAX_PAGE_SIZE
    return (max(page, 1) - 1) * size, size


async def list_shares(deps: Deps, principal: Principal, query: ListShares) -> Listed:
    offset, limit = page_window(query.page, query.page_size)
    org = principal.scope.org_id
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        grants, total = await share_grants.listed_grants(conn, org, Visibility.of(principal.scope),
                                                         offset=offset, limit=limit)
    return Listed(grants, total)
