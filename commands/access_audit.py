"""What the commands tell the audit trail (streams/audit.py): an access through a grant, a
grant created or revoked, and every refused cross-scope attempt (another scope's session or
resource, a revoked grant, a grant without the permission, too low a clearance). Recording
never blocks or fails the call; the trail publishes asynchronously."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from context_engine.auth import Principal
from context_engine.visibility import Visibility
from projections.reads import share_grants
from projections.store.pool import org_transaction
from streams.access_attempts import AccessAttempt

if TYPE_CHECKING:
    from commands.deps import Deps


def allowed(deps: Deps, principal: Principal, resource_type: str, resource_id: str, operation: str, *,
            share_id: str = "") -> None:
    deps.audit.record(AccessAttempt(principal.scope, resource_type, resource_id, operation, True, share_id=share_id))


def denied(deps: Deps, principal: Principal, resource_type: str, resource_id: str, operation: str, reason: str, *,
           share_id: str = "") -> None:
    deps.audit.record(AccessAttempt(principal.scope, resource_type, resource_id, operation, False,
                                    share_id=share_id, denial_reason=reason))


async def denied_resources(deps: Deps, principal: Principal, resource_type: str, resource_ids: Sequence[str],
                           operation: str) -> None:
    """A denied attempt for each of `resource_ids` the org holds (an id nobody has crossed no scope)."""
    org, viewer = principal.scope.org_id, Visibility.of(principal.scope)
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        reasons = {i: await share_grants.denial_reason(conn, org, viewer, resource_type, i, operation)
                   for i in resource_ids}
    for resource_id, reason in reasons.items():
        if reason is not None:
            denied(deps, principal, resource_type, resource_id, operation, reason)
