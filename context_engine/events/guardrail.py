"""guardrail.published: a signed guardrail layer (its payload is the layer's own form)."""

from __future__ import annotations

from dataclasses import dataclass

from context_engine.guardrails.signing import SignedLayer

from .registry import EventBody, Payload, event_type


@event_type
@dataclass(frozen=True, slots=True)
class GuardrailPublished(EventBody):
    TYPE = "guardrail.published"
    SCHEMA_VERSION = 1

    layer: SignedLayer

    def to_payload(self) -> Payload:
        return self.layer.payload()

    @classmethod
    def from_payload(cls, p: Payload) -> GuardrailPublished:
        """LayerFormatError unless `p` is a well-formed layer (the signature is not checked)."""
        return cls(SignedLayer.from_payload(p))
