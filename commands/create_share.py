"""CreateShare (clearance L3+; L4+ when the grantee is in another pillar): grants a grantee
scope `read` and/or `use_in_assembly` on one chunk, snapshot or guardrail layer the caller owns
(wrote at its own scope), or, at L4, one a scope below it owns: an ancestor acting for the owner,
audited as `create_share_for_owner`. A scope below the owner sees the resource and may not publish
it (PERMISSION_DENIED `NOT_RESOURCE_OWNER`); anything else is NOT_FOUND, as an unknown id is. The
grant is a share.created event; the reads check the resource again whenever a grant is read
(projections/reads/share_grants.py).

`grantee_scope_id` is the grantee's scope path ("acme/sales/apac" for a team): ids are unique
only within their parent, so the path is what names one scope. It must be in the caller's org
and as deep as `grantee_scope` says. A grantee in another pillar than the grantor's — also the
org itself, whose grant reaches every pillar, or any scope when the grantor is the org — makes
the share cross-pillar."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from context_engine import clearance, validation
from context_engine.auth import Principal
from context_engine.errors import ClearanceTooLow, InvalidArgument, NotFound, PermissionDenied
from context_engine.events import (
    MAX_SHARE_REASON,
    SHARE_PERMISSIONS,
    SHARED_RESOURCE_TYPES,
    Event,
    ShareCreated,
    share_aggregate,
)
from context_engine.scope import LEVELS, Scope
from context_engine.visibility import Visibility
from projections.reads import share_grants
from projections.store.pool import org_transaction
from streams.acknowledgement import RetryAdvice


@dataclass(frozen=True)
class CreateShare:
    resource_id: str
    resource_type: str
    grantee_scope: str
    grantee_scope_id: str
    permissions: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Created:
    share_id: str
    created_at: dt.datetime


def example_path(level: str, org_id: str) -> str:
    """A scope path of `level` in `org_id`, for messages: 'acme/sales/apac' for a team of acme."""
    return "/".join([org_id or "acme", "sales", "apac", "bot-7"][: LEVELS.index(level) + 1])


def grantee(level: str, scope_id: str, org_id: str) -> Scope:
    """The grantee named by its level and path, in `org_id`. Each refusal says the field is a
    scope path (the spec calls it the grantee entity's UUID) and gives one of `level`."""
    field = "grantee_scope_id"
    article = "an" if level[0] in "aeiou" else "a"
    example = f"{org_id!r} for the org itself" if level == "org" else \
        f"{example_path(level, org_id)!r} for {article} {level} in org {org_id!r}"
    form = f"grantee_scope_id is the grantee's scope path, not an id: its ids from the org down, '/'-separated, " \
           f"e.g. {example}"
    if not scope_id:
        raise InvalidArgument(field, f"is required: {form}")
    parts = scope_id.split("/")
    for part in parts:
        try:
            validation.identifier(part, field)
        except InvalidArgument as exc:
            raise InvalidArgument(field, f"{exc.message.removeprefix(field + ': ')} (each part of the path); "
                                         f"{form}") from None
    if len(parts) != LEVELS.index(level) + 1:
        raise InvalidArgument(field, f"names a scope {len(parts)} level(s) deep; {article} {level} is "
                                     f"{LEVELS.index(level) + 1}: {form}")
    if parts[0] != org_id:
        raise PermissionDenied(f"grantee_scope_id: {scope_id[:80]!r} is not in the caller's org {org_id!r}; "
                               f"grants stay within an org ({form})", reason="GRANTEE_OUTSIDE_ORG",
                               metadata={"field": field})
    return Scope(*parts)


def permissions(values: tuple[str, ...]) -> tuple[str, ...]:
    if not values:
        raise InvalidArgument("permissions", f"is required: one or more of {', '.join(SHARE_PERMISSIONS)}")
    for value in values:
        validation.one_of(value, SHARE_PERMISSIONS, "permissions")
    return tuple(sorted(set(values)))


def is_cross_pillar(grantor: Scope, grantee_scope: Scope) -> bool:
    return grantee_scope.pillar_id != grantor.pillar_id


async def create_share(deps: Deps, principal: Principal, command: CreateShare) -> Created:
    resource_type = validation.one_of(command.resource_type, SHARED_RESOURCE_TYPES, "resource_type")
    resource_id = validation.uuid_text(command.resource_id, "resource_id", f"{resource_type} id").lower()
    level = validation.one_of(command.grantee_scope, LEVELS, "grantee_scope")
    granted = permissions(command.permissions)
    reason = validation.label(command.reason, "reason", MAX_SHARE_REASON)
    org = principal.scope.org_id
    try:
        to = grantee(level, command.grantee_scope_id, org)
        clearance.require(principal.clearance, clearance.Action.CREATE_SHARE)
        if is_cross_pillar(principal.scope, to):
            clearance.require(principal.clearance, clearance.Action.CREATE_CROSS_PILLAR_SHARE)
    except (ClearanceTooLow, PermissionDenied) as exc:
        access_audit.denied(deps, principal, resource_type, resource_id, "create_share", exc.reason.lower())
        raise
    grantor = principal.scope.path
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        owner = await share_grants.owner(conn, org, resource_type, resource_id)
        if owner is None:  # no such resource in the org: it crossed no scope
            raise _not_found(resource_type, resource_id)
        acting_for_owner = owner.startswith(grantor + "/")
        if owner != grantor and not (acting_for_owner and clearance.allows(principal.clearance,
                                                                             clearance.Action.SHARE_FOR_OWNER)):
            refused = await _refusal(conn, principal, resource_type, resource_id, owner)
            access_audit.denied(deps, principal, resource_type, resource_id, "create_share", refused)
            if refused == "not_owner":
                raise PermissionDenied(
                    f"resource_id: {resource_type} {resource_id} belongs to {owner!r}; a scope shares what it "
                    f"owns (and, at L4, what the scopes below it own), not what it sees of the scopes above it",
                    reason="NOT_RESOURCE_OWNER", metadata={"field": "resource_id"})
            raise _not_found(resource_type, resource_id)
        if acting_for_owner and Visibility.of(principal.scope).holds(to.path):
            # A scope does not see what the scopes below it own; sharing it with itself would.
            access_audit.denied(deps, principal, resource_type, resource_id, "create_share_for_owner",
                                "grantee_is_grantor_or_above")
            raise PermissionDenied(
                f"grantee_scope_id: {to.path!r} is the caller's scope or above it: a scope shares what the scopes "
                f"below it own with other scopes, never with itself", reason="GRANTEE_IS_GRANTOR_OR_ABOVE",
                metadata={"field": "grantee_scope_id"})

    share_id = str(uuid.uuid4())
    event = Event.of(ShareCreated(share_id, resource_type, resource_id, level, to.path, granted, reason),
                     scope=principal.scope, actor=principal.subject, aggregate=share_aggregate(org, share_id))
    await deps.append(event, None, retry=retry_advice(share_id))
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        grant = await share_grants.grant_by_id(conn, org, share_id)
    if grant is None:  # the projector stored none (OUT_OF_SCOPE)
        raise _not_found(resource_type, resource_id)
    access_audit.allowed(deps, principal, resource_type, resource_id,
                         "create_share_for_owner" if acting_for_owner else "create_share", share_id=share_id)
    return Created(share_id, grant.created_at)


async def _refusal(conn, principal: Principal, resource_type: str, resource_id: str, owner: str) -> str:
    """The audit's reason for refusing a share of another scope's resource: `not_owner` for one the
    caller sees by ownership (an ancestor's), `clearance_too_low` for one below it without L4, else
    why it does not see it (`not_visible`, or `not_grantable` when it sees it only through a grant)."""
    viewer = Visibility.of(principal.scope)
    if viewer.sees(owner):
        return "not_owner"
    if owner.startswith(principal.scope.path + "/"):
        return "clearance_too_low"
    refusal = await share_grants.denial_reason(conn, principal.scope.org_id, viewer, resource_type, resource_id,
                                               "read")
    return "not_visible" if refusal in (None, "not_visible") else "not_grantable"


def retry_advice(share_id: str) -> RetryAdvice:
    return RetryAdvice(f"ListShares shows whether share {share_id} was created; a retry creates a second grant "
                       "of the same resource", {"share_id": share_id})


def _not_found(resource_type: str, resource_id: str) -> NotFound:
    """One answer for absent, another scope's, and seen only through a grant: no existence oracle."""
    return NotFound(f"resource_id: no {resource_type} {resource_id} the caller may share (a scope shares what "
                    "it owns, and at L4 what the scopes below it own)", reason="RESOURCE_NOT_FOUND",
                    metadata={"field": "resource_id"})
