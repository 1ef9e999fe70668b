"""embedding.recorded: the vectors the embedding pipeline computed, by content hash."""

from __future__ import annotations

from dataclasses import dataclass

from .registry import EventBody, Payload, event_type


@event_type
@dataclass(frozen=True, slots=True)
class EmbeddingRecorded(EventBody):
    """`vectors`: one {"content_hash", "vector" (base64 of little-endian float32)} per content."""

    TYPE = "embedding.recorded"
    SCHEMA_VERSION = 1

    model_version: str
    vectors: list[dict[str, str]]

    def to_payload(self) -> Payload:
        return {"model_version": self.model_version, "vectors": self.vectors}

    @classmethod
    def from_payload(cls, p: Payload) -> EmbeddingRecorded:
        return cls(model_version=p["model_version"], vectors=p["vectors"])
