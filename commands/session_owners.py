"""A session's owner scope (the scope of its first event), remembered per API process: the write
path checks a writer against it without a database round trip."""

from __future__ import annotations

from collections import OrderedDict

import asyncpg

from context_engine.errors import PermissionDenied
from context_engine.events import SessionRef
from context_engine.scope import Scope
from projections.reads import sessions
from projections.store.pool import org_transaction


def owner_scope(session) -> Scope:
    return Scope.from_path(session.scope_path)


def session_claimed_elsewhere(session_id: str) -> PermissionDenied:
    return PermissionDenied(f"session {session_id!r} belongs to another scope",
                            reason="SESSION_OUT_OF_SCOPE", metadata={"field": "session_id"})


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
