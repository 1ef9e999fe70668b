"""Who may touch a session: its owner scope (the scope of its first event) and the scopes
below it may read and write it; only the owner scope may rewrite it (context_engine.visibility).
Siblings and other branches may not, whatever ids they send."""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import asyncpg

from commands import access_audit
from context_engine.errors import NotFound, PermissionDenied
from context_engine.events import SessionRef
from context_engine.scope import Scope
from context_engine.visibility import Visibility, may_rewrite
from projections.reads import sessions
from projections.store.pool import org_transaction


def owner_scope(session) -> Scope:
    return Scope.from_path(session.scope_path)


def require_readable(session, caller: Scope, session_id: str):
    """A session the caller may not see is reported as absent, not as forbidden."""
    if session is None or not Visibility.of(caller).sees(session.scope_path):
        raise NotFound(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND",
                       metadata={"field": "session_id"})
    return session


def require_rewritable(session, caller: Scope, session_id: str):
    """A rewrite (rollback, compaction) of a session by any scope but its owner's is refused.
    Existence is no secret here: writes from a sibling are refused as SESSION_OUT_OF_SCOPE already."""
    if session is None:
        raise NotFound(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND",
                       metadata={"field": "session_id"})
    if not may_rewrite(owner_scope(session), caller):
        raise PermissionDenied(
            f"session {session_id!r} is not owned by scope {caller.path!r}: only the session's owner scope may "
            "roll it back or compact it (either changes what every scope in the session sees)",
            reason="NOT_SESSION_OWNER", metadata={"field": "session_id"})
    return session


def session_claimed_elsewhere(session_id: str) -> PermissionDenied:
    return PermissionDenied(f"session {session_id!r} belongs to another scope",
                            reason="SESSION_OUT_OF_SCOPE", metadata={"field": "session_id"})


def refused_write(deps, principal, session_id: str, operation: str) -> PermissionDenied:
    """The refusal of a write to another scope's session, audited."""
    access_audit.denied(deps, principal, "session", session_id, operation, "session_out_of_scope")
    return session_claimed_elsewhere(session_id)


async def require_writable(deps, principal, session_id: str, operation: str) -> None:
    """PERMISSION_DENIED (audited) unless the caller is the session's owner scope or below it."""
    try:
        await deps.owners.require_writable(principal.scope, session_id)
    except PermissionDenied:
        raise refused_write(deps, principal, session_id, operation) from None


@contextlib.asynccontextmanager
async def visible_session(deps, principal, session_id: str, operation: str, *, require=require_readable):
    """For commands about an existing session: wait for this process's writes to it, then yield
    a read-only transaction (app.org_id set) and the session, or NOT_FOUND if the caller may not see
    it. `require=require_rewritable` for commands that rewrite it (PERMISSION_DENIED unless the
    caller is its owner scope). Refusing an existing session is an audited `operation` attempt."""
    org = principal.scope.org_id
    await deps.freshness.wait(SessionRef(org, session_id))
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        session = await sessions.get_session(conn, org, session_id)
        try:
            checked = require(session, principal.scope, session_id)
        except (NotFound, PermissionDenied) as exc:
            if session is not None:
                access_audit.denied(deps, principal, "session", session_id, operation,
                                    "not_visible" if isinstance(exc, NotFound) else exc.reason.lower())
            raise
        yield conn, checked


class SessionOwners:
    """Owner scope per session, remembered: a session's owner never changes once its first
    event is projected, so the write path checks it without a database round trip."""

    def __init__(self, pool: asyncpg.Pool, capacity: int = 100_000) -> None:
        self._pool = pool
        self._capacity = capacity
        self._known: OrderedDict[SessionRef, Scope] = OrderedDict()

    async def owner(self, org_id: str, session_id: str) -> Scope | None:
        key = SessionRef(org_id, session_id)
        if (scope := self._known.get(key)) is not None:
            self._known.move_to_end(key)
            return scope
        async with org_transaction(self._pool, org_id, readonly=True) as conn:
            session = await sessions.get_session(conn, org_id, session_id)
        if session is None:  # not created yet: the projector settles who creates it
            return None
        scope = self._known[key] = owner_scope(session)
        if len(self._known) > self._capacity:
            self._known.popitem(last=False)
        return scope

    async def require_writable(self, caller: Scope, session_id: str) -> None:
        owner = await self.owner(caller.org_id, session_id)
        if owner is not None and not caller.is_within(owner):
            raise session_claimed_elsewhere(session_id)
