"""Who may touch a session: its owner scope (the scope of its first event) and the scopes
below it may read and write it; only the owner scope may rewrite it (context_engine.visibility).
Siblings and other branches may not, whatever ids they send."""

from __future__ import annotations

import contextlib

from commands import access_audit
from commands.session_owners import owner_scope, session_claimed_elsewhere
from context_engine.errors import NotFound, PermissionDenied
from context_engine.events import SessionRef
from context_engine.scope import Scope
from context_engine.visibility import Visibility, may_rewrite
from projections.reads import sessions
from projections.store.pool import org_transaction


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
