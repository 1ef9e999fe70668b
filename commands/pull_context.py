"""PullContext: an agent's latest memory, or the memory a named snapshot holds (the caller's, or
one shared with it for `read`: an audited read), read from
PostgreSQL (the primary) once the session's writes are visible (projections/reads/pull_context.py).

Pushed memory is returned only after its PII scan (docs/pii.md): a version still 'pending' is
waited for (bounded by `pii_scan_wait_seconds`, then UNAVAILABLE), so raw content never leaves
the engine; a quarantined version comes back as the regex fallback redacted it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from context_engine import validation
from context_engine.auth import Principal
from context_engine.errors import InvalidArgument, NotFound
from context_engine.events import SessionRef
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from projections.reads import sessions, share_grants
from projections.reads.pull_context import Pulled, await_scan, read_memory
from projections.reads.share_grants import GRANT_DENIALS
from projections.store.pool import org_transaction


@dataclass(frozen=True)
class PullContext:
    agent_id: str
    session_id: str = ""
    snapshot_name: str = ""


def validate(query: PullContext) -> None:
    if query.agent_id:
        validation.agent_id(query.agent_id)
    if query.session_id:
        validation.session_id(query.session_id)
    if query.snapshot_name:
        validation.name(query.snapshot_name, "snapshot_name")
    if query.snapshot_name and not query.session_id:
        raise InvalidArgument("session_id", "is required with snapshot_name (snapshots belong to a session)")


async def pull_context(deps: Deps, principal: Principal, query: PullContext) -> Pulled:
    validate(query)
    org = principal.scope.org_id
    agent_id = query.agent_id or principal.scope.agent_id
    if query.session_id:
        await deps.freshness.wait(SessionRef(org, query.session_id))
    try:
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            pulled = await read_memory(conn, org, agent_id, query.session_id, query.snapshot_name,
                                       Visibility.of(principal.scope))
    except NotFound:
        await _audit_refusal(deps, principal, query, agent_id)
        raise
    if pulled.share_id:
        access_audit.allowed(deps, principal, "snapshot", pulled.snapshot_id, "read", share_id=pulled.share_id)
    if pulled.memory.pii_status == "pending":
        memory = await await_scan(deps.pool, pulled.memory, deps.settings.pii_scan_wait_seconds)
        pulled = dataclasses.replace(pulled, memory=memory)
    return pulled


async def _audit_refusal(deps: Deps, principal: Principal, query: PullContext, agent_id: str) -> None:
    """One denied row when the refusal crossed a scope, for what the caller reached for:
    - another scope's session it does not see: the session (`not_visible`), or the snapshot of
      that name it was granted once (`grant_revoked`, `permission_missing`);
    - an agent's memory held where the caller does not see it, beside or below a scope it sees (a
      sibling agent's, an agent's of the caller's team): in the snapshot it reads by that name (its
      own scope's, or one shared with it, as its creator sees it), else the agent's latest;
    - else a snapshot of that name that another scope holds in the session.
    Nothing when nothing was there to cross to, nor for the caller's own agent id (its memory is
    simply not there yet)."""
    org, viewer = principal.scope.org_id, Visibility.of(principal.scope)
    another_agent = agent_id != principal.scope.agent_id
    hidden: str | None = None
    named: list[str] = []
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        session = await sessions.get_session(conn, org, query.session_id) if query.session_id else None
        shared = (await sessions.shared_snapshot_by_name(conn, org, query.session_id, query.snapshot_name, viewer)
                  if query.snapshot_name else None)
        if session is not None and not viewer.sees(session.scope_path) and shared is None:
            for snapshot_id in (await sessions.snapshot_ids_named(conn, org, query.session_id, query.snapshot_name)
                                if query.snapshot_name else []):
                reason = await share_grants.denial_reason(conn, org, viewer, "snapshot", snapshot_id, "read")
                if reason in GRANT_DENIALS:
                    access_audit.denied(deps, principal, "snapshot", snapshot_id, "read", reason)
                    return
            access_audit.denied(deps, principal, "session", query.session_id, "read", "not_visible")
            return
        if query.snapshot_name:
            seen, reader = await sessions.snapshot_by_name(conn, org, query.session_id, query.snapshot_name,
                                                           viewer), viewer
            if seen is None and shared is not None:
                seen, reader = shared[0], Visibility.of(Scope.from_path(shared[0].scope_path))
            if seen is None:
                named = await sessions.snapshot_ids_named(conn, org, query.session_id, query.snapshot_name)
            elif another_agent:
                hidden = await sessions.hidden_memory(conn, org, agent_id, reader, snapshot=seen)
        elif another_agent:
            hidden = await sessions.hidden_memory(conn, org, agent_id, viewer, session_id=query.session_id or None)
    if hidden is not None:
        access_audit.denied(deps, principal, "memory", hidden, "read", "not_visible")
    elif named:
        await access_audit.denied_resources(deps, principal, "snapshot", named, "read", first_only=True)
