"""Guardrail layers (L1-L4): owner scopes, signing and verification. See docs/guardrails.md."""
