"""Clearance rules, all in one place (spec: snapshot L2+, rollback L3+, share L3+,
cross-pillar share L4+, revoke L3+ or the grant's creator)."""

from __future__ import annotations

import enum

from context_engine.errors import ClearanceTooLow

MIN_CLEARANCE, MAX_CLEARANCE = 1, 4


class Action(enum.Enum):
    CREATE_SNAPSHOT = ("create a snapshot", 2)
    ROLLBACK = ("roll back a session", 3)
    COMPACT = ("compact a session", 3)
    CREATE_SHARE = ("create a share", 3)
    CREATE_CROSS_PILLAR_SHARE = ("create a cross-pillar share", 4)
    # An ancestor of a resource's owning scope shares it for the owner (docs/security.md, *chosen*).
    SHARE_FOR_OWNER = ("share a resource for the scope below it that owns it", 4)
    REVOKE_SHARE = ("revoke a share", 3)

    def __init__(self, description: str, level: int) -> None:
        self.description = description
        self.level = level


def require(clearance: int, action: Action) -> None:
    if clearance < action.level:
        raise ClearanceTooLow(
            f"clearance L{clearance} may not {action.description}: L{action.level}+ required",
            metadata={"required": str(action.level), "actual": str(clearance)},
        )


def allows(clearance: int, action: Action) -> bool:
    return clearance >= action.level


def require_revoke(clearance: int, *, caller_subject: str, grant_creator: str) -> None:
    """Revoking needs L3+, unless the caller created the grant."""
    if caller_subject and caller_subject == grant_creator:
        return
    require(clearance, Action.REVOKE_SHARE)
