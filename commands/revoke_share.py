"""RevokeShare: ends a grant (a share.revoked event). Allowed to the grant's creator (the same
token subject) at any clearance, and at L3+ to a caller whose scope is the grantor's or one of
its ancestors' (the scopes that see what was shared by ownership). A grant the caller neither
created, granted nor holds is NOT_FOUND, as is an unknown id; its grantee and other scopes that
can name it are PERMISSION_DENIED. A revoked grant answers with its revocation's time and
writes nothing: revoking is idempotent."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from context_engine import clearance, validation
from context_engine.auth import Principal
from context_engine.errors import ClearanceTooLow, NotFound, PermissionDenied
from context_engine.events import MAX_SHARE_REASON, Event, ShareRevoked, share_aggregate
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from projections.reads import share_grants
from projections.store.pool import org_transaction
from streams.acknowledgement import RetryAdvice


@dataclass(frozen=True)
class RevokeShare:
    share_id: str
    reason: str = ""


@dataclass(frozen=True)
class Revoked:
    revoked_at: dt.datetime


def may_revoke(grant: share_grants.Grant, principal: Principal) -> bool:
    """The creator, or (at L3+, checked by the caller) the grantor's scope or an ancestor's."""
    grantor = Scope.from_path(grant.grantor_path)
    return principal.subject == grant.created_by or grantor.is_within(principal.scope)


def retry_advice(share_id: str) -> RetryAdvice:
    return RetryAdvice(f"a retry of the revocation of share {share_id} answers with the first revocation's "
                       "time if this one was applied", {"share_id": share_id})


async def revoke_share(deps: Deps, principal: Principal, command: RevokeShare) -> Revoked:
    share_id = validation.uuid_text(command.share_id, "share_id", "share id").lower()
    reason = validation.label(command.reason, "reason", MAX_SHARE_REASON)
    org = principal.scope.org_id
    viewer = Visibility.of(principal.scope)
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        grant = await share_grants.grant_by_id(conn, org, share_id)
    if grant is None or not (may_revoke(grant, principal) or viewer.holds(grant.grantee_path)):
        if grant is not None:
            access_audit.denied(deps, principal, "share", share_id, "revoke_share", "not_visible")
        raise NotFound(f"share_id: no share {share_id} the caller created, granted or holds",
                       reason="SHARE_NOT_FOUND", metadata={"field": "share_id"})
    try:
        if not may_revoke(grant, principal):
            raise PermissionDenied(f"share {share_id} was granted by {grant.grantor_path!r}: only its creator, or an "
                                   "L3+ caller at that scope or above it, may revoke it",
                                   reason="NOT_SHARE_GRANTOR", metadata={"field": "share_id"})
        clearance.require_revoke(principal.clearance, caller_subject=principal.subject,
                                 grant_creator=grant.created_by)
    except (ClearanceTooLow, PermissionDenied) as exc:
        access_audit.denied(deps, principal, "share", share_id, "revoke_share", exc.reason.lower(), share_id=share_id)
        raise
    if grant.revoked_at is not None:
        return Revoked(grant.revoked_at)

    event = Event.of(ShareRevoked(share_id, reason), scope=principal.scope, actor=principal.subject,
                     aggregate=share_aggregate(org, share_id))
    await deps.append(event, None, retry=retry_advice(share_id))
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        ended = await share_grants.grant_by_id(conn, org, share_id)
    assert ended is not None and ended.revoked_at is not None, share_id
    access_audit.allowed(deps, principal, grant.resource_type, grant.resource_id, "revoke_share", share_id=share_id)
    return Revoked(ended.revoked_at)
