"""Work an applied event asks for, as plain values: the worker turns each into its job envelope
(`job_message`) and publishes it after the batch commits."""

from __future__ import annotations

from dataclasses import dataclass

from context_engine.scope import Scope


@dataclass(frozen=True, slots=True)
class EmbedChunks:
    """Embed the new chunks of a content (the event or memory that added them)."""

    scope: Scope
    event_id: str
    chunk_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScanMemory:
    """Scan a pushed memory for PII (its memory.scrubbed event answers)."""

    scope: Scope
    memory_event_id: str


@dataclass(frozen=True, slots=True)
class CompactSession:
    """Compact a session whose history crossed its compaction threshold."""

    scope: Scope
    session_id: str
    token_count: int
    token_budget: int


@dataclass(frozen=True, slots=True)
class IndexSource:
    """Index a long content out of the projector's transaction (projections/projector/deferred_indexing.py)."""

    scope: Scope
    source_event_id: str


JobRequest = EmbedChunks | ScanMemory | CompactSession | IndexSource
