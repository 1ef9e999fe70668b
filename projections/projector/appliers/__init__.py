"""One applier per event type: type -> async function (org applier, record, event) -> Applied.

An event type without an applier is archived and reported IGNORED (another projector's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from context_engine.events import (
    COMPACTION_REFUSED,
    COMPACTION_THRESHOLD,
    EMBEDDING_RECORDED,
    EVENT_INGESTED,
    GUARDRAIL_PUBLISHED,
    MEMORY_PUSHED,
    MEMORY_SCRUBBED,
    SESSION_COMPACTED,
    SESSION_ROLLED_BACK,
    SHARE_CREATED,
    SHARE_REVOKED,
    SNAPSHOT_CREATED,
    Event,
)
from projections.projector.records import LogRecord

from ..outcome import Applied
from . import compacted, compaction, embedding, guardrail, ingested, memory, rollback, share, snapshot

if TYPE_CHECKING:
    from ..org_state import OrgState

Applier = Callable[["OrgState", LogRecord, Event], Awaitable[Applied]]

APPLIERS: dict[str, Applier] = {
    EVENT_INGESTED: ingested.apply,
    MEMORY_PUSHED: memory.apply_pushed,
    SNAPSHOT_CREATED: snapshot.apply,
    SESSION_ROLLED_BACK: rollback.apply,
    COMPACTION_THRESHOLD: compaction.apply,
    COMPACTION_REFUSED: compaction.apply_refused,
    SESSION_COMPACTED: compacted.apply,
    GUARDRAIL_PUBLISHED: guardrail.apply,
    MEMORY_SCRUBBED: memory.apply_scrubbed,
    EMBEDDING_RECORDED: embedding.apply,
    SHARE_CREATED: share.apply_created,
    SHARE_REVOKED: share.apply_revoked,
}

# What an event type needs loaded before the batch's events apply: an idempotency claim
# (session, writer scope, key) whose earlier use the applier must see.
Preload = Callable[[Event], "tuple[str, str, str] | None"]
PRELOADS: dict[str, Preload] = {EVENT_INGESTED: ingested.preload}

# The types whose session has an owner scope: an event from outside it changes nothing (OUT_OF_SCOPE).
SESSION_TYPES = frozenset({EVENT_INGESTED, MEMORY_PUSHED, SNAPSHOT_CREATED, SESSION_ROLLED_BACK, SESSION_COMPACTED})
