"""What a call returns: the response message, and the engine's trailing metadata beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

R = TypeVar("R", bound=Message)


@dataclass(frozen=True)
class Reply(Generic[R]):
    """`response` is the RPC's response message (its fields are also readable on the reply:
    `reply.assembled_prompt`); `trailers` the engine's trailing metadata (`engine.*`)."""

    response: R
    trailers: Mapping[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.response, name)

    @property
    def text(self) -> str:
        """A `content` bytes field as UTF-8 text (PullContext's memory); undecodable bytes are
        replaced, never raised: the bytes themselves are `response.content`."""
        content = getattr(self.response, "content", None)
        if not isinstance(content, bytes):
            raise AttributeError(f"{type(self.response).__name__} has no bytes content")
        return content.decode("utf-8", errors="replace")

    @property
    def quarantined_matches(self) -> int:
        """Results the caller may see that were held back because their PII scan is pending or failed."""
        return int(self.trailers.get("engine.quarantined_matches", "0"))

    @property
    def quarantine_reason(self) -> str:
        return self.trailers.get("engine.quarantine_reason", "")

    @property
    def compaction_requested(self) -> str:
        """AssembleContext: the compaction this call asked for (its id), or empty."""
        return self.trailers.get("engine.compaction_requested", "")
