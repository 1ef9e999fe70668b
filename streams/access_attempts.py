"""What the handlers tell the audit trail: one cross-scope access attempt, allowed or denied, and
the trail that takes it (`AuditTrail`: the API's AuditPublisher, streams/audit.py, or
`RecordedAudit`, which keeps what it is given)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol

from context_engine.scope import Scope


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class AccessAttempt:
    """One cross-scope access, allowed or denied. operation: read (Search / PullContext through a
    grant), use_in_assembly (AssembleContext through a grant), create_share, revoke_share;
    resource_type: chunk, snapshot, layer, session, share."""

    actor: Scope
    resource_type: str
    resource_id: str
    operation: str
    allowed: bool
    share_id: str = ""
    denial_reason: str = ""
    occurred_at: dt.datetime = field(default_factory=_now)


class AuditTrail(Protocol):
    def record(self, attempt: AccessAttempt) -> None:
        """Take the attempt; never blocks and never raises."""


@dataclass
class RecordedAudit:
    """An AuditTrail that keeps what it is given: unit tests, and a Deps built without a log."""

    attempts: list[AccessAttempt] = field(default_factory=list)

    def record(self, attempt: AccessAttempt) -> None:
        self.attempts.append(attempt)
