"""The session projection: log records -> event archive + session read models.

One function, `batch.apply_batch`, serves the live Faust agent (a batch per `stream.take`) and
bulk replay (batches read back from the archive or the log): the chain is a pure function of log
order, so both paths produce the same rows and the same version hashes. The payloads are the
event classes (context_engine/events/).

Every record gets an `Applied` with its `ProjectionOutcome` (outcome.py); the work it asks for (embedding,
PII scan, compaction, indexing) comes back as plain requests (`Applied.jobs`, job_requests.py),
which the worker turns into job envelopes (`job_message`) and publishes after the commit. Event
types without an applier are archived and IGNORED (their own projectors handle them); a type
`context_engine.events` does not know fails decoding, and is set aside. For every session event,
`Event.aggregate` must be the session's `SessionRef.aggregate`, the partition key that makes the
session's log order total.

The parts, each imported from its own module:
- batch.py: one batch, one transaction: the opening and closing scripts, savepoints per org, offsets;
- archive.py: a record's envelope checked, and the batch's fresh events archived;
- rejections.py: what is an event's fault and is set aside, and what is the infrastructure's;
- org_applier.py: one org's fresh events applied in log order, rows written in bulk;
- appliers/: one function per event type, in a registry (type -> applier);
- version_chain.py: the sessions' chain state (genesis, next version, seq) and its rows;
- outcome.py: what one record did (ProjectionOutcome, Applied); job_requests.py: the work it asks for.
"""
