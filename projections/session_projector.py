"""The session projection: log records -> event archive + session read models.

One function, `apply_batch`, serves the live Faust agent (a batch per `stream.take`) and bulk
replay (batches read back from the archive or the log): the chain is a pure function of log
order, so both paths produce the same rows and the same version hashes. How a batch is
committed: projections/projector/batch.py; what each event type does:
projections/projector/appliers/; the payloads: the event classes (context_engine/events/).

Every record gets an `Applied` with its `Outcome`; the work it asks for (embedding, PII scan,
compaction, indexing) comes back as plain requests (`Applied.jobs`), which the worker turns into
job envelopes (`job_message`) and publishes after the commit. Event types without an applier are
archived and IGNORED (their own projectors handle them); a type `context_engine.events` does not
know fails decoding, and is set aside. For every session event, `Event.aggregate` must be the
session's `SessionRef.aggregate`, the partition key that makes the session's log order total.
"""

from __future__ import annotations

from projections.projector.batch import PROJECTOR, Notify, apply_batch, load_offsets
from projections.projector.job_requests import CompactSession, EmbedChunks, IndexSource, JobRequest, ScanMemory
from projections.projector.outcome import Applied, Outcome, ProjectionError
from projections.projector.rejections import SYSTEM_ORG, claimed_identity, is_infrastructure_failure

APPLIED = Outcome.APPLIED
DUPLICATE = Outcome.DUPLICATE
SNAPSHOT_NAME_TAKEN = Outcome.SNAPSHOT_NAME_TAKEN
UNKNOWN_TARGET = Outcome.UNKNOWN_TARGET
IGNORED = Outcome.IGNORED
OUT_OF_SCOPE = Outcome.OUT_OF_SCOPE
IDEMPOTENCY_KEY_TAKEN = Outcome.IDEMPOTENCY_KEY_TAKEN
REJECTED = Outcome.REJECTED

__all__ = [
    "APPLIED", "DUPLICATE", "IDEMPOTENCY_KEY_TAKEN", "IGNORED", "OUT_OF_SCOPE", "PROJECTOR", "REJECTED",
    "SNAPSHOT_NAME_TAKEN", "SYSTEM_ORG", "UNKNOWN_TARGET", "Applied", "CompactSession", "EmbedChunks",
    "IndexSource", "JobRequest", "Notify", "Outcome", "ProjectionError", "ScanMemory", "apply_batch",
    "claimed_identity", "is_infrastructure_failure", "load_offsets",
]
