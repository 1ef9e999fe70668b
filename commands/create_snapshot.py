"""CreateSnapshot (clearance L2+): name → the session's current version and state, immutable."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from commands.session_access import visible_session
from context_engine import clearance, events, validation
from context_engine.auth import Principal
from context_engine.errors import AlreadyExists
from context_engine.events import Event, SessionRef
from context_engine.visibility import Visibility
from projections.reads import sessions
from projections.store.pool import org_transaction
from streams.acknowledgement import RetryAdvice


@dataclass(frozen=True)
class CreateSnapshot:
    session_id: str
    snapshot_name: str


@dataclass(frozen=True)
class SnapshotCreated:
    snapshot_id: str
    version_hash: str
    created_at: dt.datetime


def retry_advice(name: str, snapshot_id: str) -> RetryAdvice:
    return RetryAdvice(f"a retry with snapshot_name {name!r} creates the snapshot if this one was not applied, "
                       "and answers ALREADY_EXISTS (SNAPSHOT_NAME_TAKEN) if it was (or if another create of "
                       "that name won)", {"snapshot_name": name, "snapshot_id": snapshot_id})


def _taken(session_id: str, name: str) -> AlreadyExists:
    return AlreadyExists(f"session {session_id!r} already has a snapshot named {name!r} by this scope",
                         reason="SNAPSHOT_NAME_TAKEN", metadata={"field": "snapshot_name"})


async def create_snapshot(deps: Deps, principal: Principal, command: CreateSnapshot) -> SnapshotCreated:
    access_audit.require_clearance(deps, principal, clearance.Action.CREATE_SNAPSHOT, "session", command.session_id,
                                   "create_snapshot")
    validation.session_id(command.session_id)
    validation.name(command.snapshot_name, "snapshot_name")
    org = principal.scope.org_id
    own = Visibility.of(principal.scope)  # the name is taken only by this scope's own snapshot
    async with visible_session(deps, principal, command.session_id, "create_snapshot") as (conn, _):
        found = await sessions.snapshot_by_name(conn, org, command.session_id, command.snapshot_name, own)
        if found is not None and found.scope_path == principal.scope.path:
            raise _taken(command.session_id, command.snapshot_name)

    snapshot_id = str(uuid.uuid4())
    session = SessionRef(org, command.session_id)
    # events.SnapshotCreated is the event; SnapshotCreated, this command's answer.
    event = Event.of(events.SnapshotCreated(command.session_id, snapshot_id, command.snapshot_name),
                     scope=principal.scope, actor=principal.subject, aggregate=session.aggregate)
    await deps.append(event, session, retry=retry_advice(command.snapshot_name, snapshot_id))
    async with org_transaction(deps.pool, org) as conn:
        snapshot = await sessions.snapshot_by_id(conn, org, snapshot_id)
    if snapshot is None:  # a concurrent create of this name by this scope won
        raise _taken(command.session_id, command.snapshot_name)
    return SnapshotCreated(snapshot_id, snapshot["version"], snapshot["created_at"])
