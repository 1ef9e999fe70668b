"""share.created and share.revoked: a grant of one resource to a grantee scope, and its end
(commands/create_share.py, commands/revoke_share.py; projections/projector/appliers/share.py
projects them, projections/reads/share_grants.py reads the grants).

The grantor is the event's scope and the creator its actor; a grant is created at the event's
`occurred_at` and revoked at the revocation's."""

from __future__ import annotations

from dataclasses import dataclass

from .registry import EventBody, Payload, event_type

SHARED_RESOURCE_TYPES = ("chunk", "snapshot", "layer")
SHARE_PERMISSIONS = ("read", "use_in_assembly")
MAX_SHARE_REASON = 1024  # characters of a grant's or a revocation's audit annotation


@event_type
@dataclass(frozen=True, slots=True)
class ShareCreated(EventBody):
    TYPE = "share.created"
    SCHEMA_VERSION = 1

    share_id: str          # a uuid chosen by the handler
    resource_type: str     # 'chunk' | 'snapshot' | 'layer'
    resource_id: str       # a uuid
    grantee_scope: str     # 'org' | 'pillar' | 'team' | 'agent'
    grantee_path: str      # the grantee's scope path, e.g. "acme/sales/apac"
    permissions: tuple[str, ...]  # sorted, distinct: 'read', 'use_in_assembly'
    reason: str = ""

    def to_payload(self) -> Payload:
        return {"share_id": self.share_id, "resource_type": self.resource_type, "resource_id": self.resource_id,
                "grantee_scope": self.grantee_scope, "grantee_path": self.grantee_path,
                "permissions": list(self.permissions), "reason": self.reason}

    @classmethod
    def from_payload(cls, p: Payload) -> ShareCreated:
        return cls(share_id=str(p["share_id"]), resource_type=str(p["resource_type"]),
                   resource_id=str(p["resource_id"]), grantee_scope=str(p["grantee_scope"]),
                   grantee_path=str(p["grantee_path"]), permissions=tuple(str(x) for x in p["permissions"]),
                   reason=str(p.get("reason") or ""))


@event_type
@dataclass(frozen=True, slots=True)
class ShareRevoked(EventBody):
    TYPE = "share.revoked"
    SCHEMA_VERSION = 1

    share_id: str
    reason: str = ""

    def to_payload(self) -> Payload:
        return {"share_id": self.share_id, "reason": self.reason}

    @classmethod
    def from_payload(cls, p: Payload) -> ShareRevoked:
        return cls(share_id=str(p["share_id"]), reason=str(p.get("reason") or ""))
