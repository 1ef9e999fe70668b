"""RollbackContext (clearance L3+, and only the session's owner scope: visibility.may_rewrite): the
session's state and version become those of a version it has had. Later items stay in the log
and the audit view; new items chain from the target."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from commands.session_access import refused_write, require_rewritable, visible_session
from context_engine import clearance, validation
from context_engine.auth import Principal
from context_engine.errors import NotFound
from context_engine.events import Event, SessionRef, SessionRolledBack
from projections.projector.outcome import ProjectionOutcome
from projections.reads import sessions
from streams.acknowledgement import RetryAdvice


@dataclass(frozen=True)
class RollbackContext:
    session_id: str
    target_version_hash: str


@dataclass(frozen=True)
class RolledBack:
    restored_version_hash: str
    rolled_back_at: dt.datetime


def retry_advice(target_version_hash: str) -> RetryAdvice:
    return RetryAdvice(f"a retry rolls the session back to {target_version_hash} again: if this rollback was "
                       "applied and nothing was written to the session since, the state stays the same (one "
                       "more rollback is recorded); anything written since is rolled back too",
                       {"target_version_hash": target_version_hash})


def version_not_found(org_id: str, command: RollbackContext) -> NotFound:
    """The session never had the target version: which hashes are targets, and where to find them."""
    return NotFound(f"session {command.session_id!r} never had version {command.target_version_hash}; a rollback "
                    "target is a version of the session's chain (CreateSnapshot's or Compact's version_hash, "
                    "RollbackContext's restored_version_hash, or any version "
                    f"`context-engine history --org {org_id} --session {command.session_id}` lists), not "
                    "IngestEvent's or PushContext's version_hash, which is the SHA-256 of their content",
                    reason="VERSION_NOT_FOUND", metadata={"field": "target_version_hash"})


async def rollback_context(deps: Deps, principal: Principal, command: RollbackContext) -> RolledBack:
    access_audit.require_clearance(deps, principal, clearance.Action.ROLLBACK, "session", command.session_id,
                                   "rollback")
    validation.session_id(command.session_id)
    validation.version_hash(command.target_version_hash, "target_version_hash")
    org = principal.scope.org_id
    async with visible_session(deps, principal, command.session_id, "rollback",
                               require=require_rewritable) as (conn, _):
        if await sessions.session_has_version(conn, org, command.session_id,
                                             command.target_version_hash) is None:
            raise version_not_found(org, command)

    session = SessionRef(org, command.session_id)
    event = Event.of(SessionRolledBack(command.session_id, command.target_version_hash),
                     scope=principal.scope, actor=principal.subject, aggregate=session.aggregate)
    outcome = await deps.append(event, session, retry=retry_advice(command.target_version_hash))
    if outcome == ProjectionOutcome.OUT_OF_SCOPE:  # the projector applies the same rule
        raise refused_write(deps, principal, command.session_id, "rollback")
    if outcome == ProjectionOutcome.UNKNOWN_TARGET:
        raise version_not_found(org, command)
    return RolledBack(command.target_version_hash, event.occurred)
