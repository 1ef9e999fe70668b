"""Who may touch a session: its owner scope (the scope of its first event) and the scopes
below it. Siblings and other branches may not, whatever ids they send."""

from __future__ import annotations

from context_engine.errors import NotFound, PermissionDenied
from context_engine.scope import Scope


def owner_scope(session) -> Scope:
    return Scope(*session.scope_path.split("/"))


def require_readable(session_row, caller: Scope, session_id: str):
    """A session the caller may not see is reported as absent, not as forbidden."""
    if session_row is None or not caller.is_within(owner_scope(session_row)):
        raise NotFound(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND",
                       metadata={"field": "session_id"})
    return session_row


def session_claimed_elsewhere(session_id: str) -> PermissionDenied:
    return PermissionDenied(f"session {session_id!r} belongs to another scope",
                            reason="SESSION_OUT_OF_SCOPE", metadata={"field": "session_id"})


def require_writable(session_row, caller: Scope, session_id: str) -> None:
    if session_row is not None and not caller.is_within(owner_scope(session_row)):
        raise session_claimed_elsewhere(session_id)
