"""What the commands tell the audit trail (streams/audit.py): an access through a grant, a
grant created or revoked, and every refused cross-scope or under-clearance attempt (another
scope's session, event or resource, a revoked grant, a grant without the permission, too low a
clearance), one row each. Recording never blocks the call; the trail publishes asynchronously. A
token over its refused-call budget is answered before any of this (commands/refusal_budget.py),
its calls counted into summary rows (`record_unrecorded`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from commands.refusal_budget import SUMMARY_OPERATION, SUMMARY_REASON
from context_engine import clearance
from context_engine.auth import Principal
from context_engine.errors import ClearanceTooLow
from context_engine.visibility import Visibility
from projections.reads import share_grants
from projections.store.pool import org_transaction
from streams.access_attempts import AccessAttempt

if TYPE_CHECKING:
    from commands.deps import Deps

MAX_RESOURCE_ID = 256  # a refused request may name anything; the row keeps this much of it


def allowed(deps: Deps, principal: Principal, resource_type: str, resource_id: str, operation: str, *,
            share_id: str = "") -> None:
    deps.audit.record(AccessAttempt(principal.scope, resource_type, resource_id, operation, True, share_id=share_id))


def denied(deps: Deps, principal: Principal, resource_type: str, resource_id: str, operation: str, reason: str, *,
           share_id: str = "") -> None:
    """One denied row."""
    deps.audit.record(AccessAttempt(principal.scope, resource_type, resource_id[:MAX_RESOURCE_ID], operation, False,
                                    share_id=share_id, denial_reason=reason))


def require_clearance(deps: Deps, principal: Principal, action: clearance.Action, resource_type: str,
                      resource_id: str, operation: str) -> None:
    """ClearanceTooLow, with its denied row, unless the principal's clearance allows `action`."""
    try:
        clearance.require(principal.clearance, action)
    except ClearanceTooLow as exc:
        denied(deps, principal, resource_type, resource_id, operation, exc.reason.lower())
        raise


def record_unrecorded(deps: Deps) -> int:
    """One summary row per principal whose refusals were over budget since the last call: how many
    attempts the trail did not get a row for, and from when to when. Returns the rows written."""
    summaries = deps.refusals.flush()
    for d in summaries:
        first, last = (dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")
                       for t in (d.first, d.last))
        deps.audit.record(AccessAttempt(d.scope, "refused_calls", f"{d.count} refused attempts from {first} to {last}",
                                        SUMMARY_OPERATION, False, denial_reason=SUMMARY_REASON,
                                        occurred_at=dt.datetime.fromtimestamp(d.last, dt.UTC)))
    return len(summaries)


async def denied_resources(deps: Deps, principal: Principal, resource_type: str, resource_ids: Sequence[str],
                           operation: str, *, first_only: bool = False) -> None:
    """A denied attempt for each of `resource_ids` the org holds (an id nobody has crossed no scope);
    `first_only`: for the first of them only (one request, one row)."""
    org, viewer = principal.scope.org_id, Visibility.of(principal.scope)
    reasons = {}
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        for i in resource_ids:
            if (reason := await share_grants.denial_reason(conn, org, viewer, resource_type, i, operation)) is not None:
                reasons[i] = reason
                if first_only:
                    break
    for resource_id, reason in reasons.items():
        denied(deps, principal, resource_type, resource_id, operation, reason)
