"""The names an event's aggregate goes by: log partition keys and the session's own key."""

from __future__ import annotations

from dataclasses import dataclass

from context_engine.hashing import genesis_version


@dataclass(frozen=True, slots=True)
class SessionRef:
    """One session of one org. Its spellings are persisted (partition keys, the genesis version's
    input), so they never change."""

    org_id: str
    session_id: str

    @property
    def key(self) -> str:
        """"org/session": the input of the session's genesis version."""
        return f"{self.org_id}/{self.session_id}"

    @property
    def aggregate(self) -> str:
        """"session/org/session": the partition key of every event of the session, so that their
        log order is total."""
        return f"session/{self.org_id}/{self.session_id}"

    @property
    def genesis(self) -> str:
        """v0 of the session's version chain."""
        return genesis_version(self.key)


def session_aggregate(org_id: str, session_id: str) -> str:
    """The partition key of every event of one session: their log order is total."""
    return SessionRef(org_id, session_id).aggregate


def embedding_aggregate(org_id: str) -> str:
    """The partition key of an org's embedding.recorded events."""
    return f"embedding/{org_id}"


def share_aggregate(org_id: str, share_id: str) -> str:
    """The partition key of one grant's events: its revocation follows its creation."""
    return f"share/{org_id}/{share_id}"
