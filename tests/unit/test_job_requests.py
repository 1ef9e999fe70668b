"""The projector asks for jobs as plain values; the worker turns each into its stream's envelope."""

from __future__ import annotations

import pytest

from context_engine.scope import Scope
from projections.projector.job_requests import CompactSession, EmbedChunks, IndexSource, ScanMemory
from projections.projector.outcome import ProjectionOutcome
from streams.jobs import job_message, open_envelope, open_indexing_job, open_pii_scan_job
from upsquad.context.v1 import stream_pb2

SCOPE = Scope("acme", "p")
EVENT_ID = "3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22"


def test_each_request_becomes_its_streams_envelope():
    kind, job = job_message(EmbedChunks(SCOPE, EVENT_ID, ("c1", "c2")))
    env, embedding = open_envelope(job.value, stream_pb2.EmbeddingJob)
    assert (kind, env.stream, embedding.event_id, list(embedding.chunk_ids)) == (
        "embedding", "embedding:acme", EVENT_ID, ["c1", "c2"])
    kind, job = job_message(ScanMemory(SCOPE, EVENT_ID))
    assert (kind, open_pii_scan_job(job.value)[1]) == ("pii", EVENT_ID)
    kind, job = job_message(IndexSource(SCOPE, EVENT_ID))
    assert (kind, open_indexing_job(job.value)[1]) == ("indexing", EVENT_ID)
    kind, job = job_message(CompactSession(SCOPE, "s1", 900, 1000))
    env, compaction = open_envelope(job.value, stream_pb2.CompactionJob)
    assert (kind, compaction.session_id, compaction.current_token_count, compaction.token_budget) == (
        "compaction", "s1", 900, 1000)
    assert job.key == b"acme"


def test_anything_else_is_no_job():
    with pytest.raises(TypeError):
        job_message(("embedding", object()))


def test_an_outcome_is_the_string_that_crosses_processes():
    assert ProjectionOutcome.APPLIED == "APPLIED"
    assert f"{EVENT_ID}:{ProjectionOutcome.OUT_OF_SCOPE}" == f"{EVENT_ID}:OUT_OF_SCOPE"
    assert ProjectionOutcome("REJECTED_STALE") is ProjectionOutcome.REJECTED_STALE
