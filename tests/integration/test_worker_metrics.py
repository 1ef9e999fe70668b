"""The stream worker's /metrics: what its projector, vector assigner and embedder did, read from
the running worker process (docs/operations.md)."""

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.calls import ingest, wait_embedded
from tests.fixtures.engine import unique

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}  # totals, not buckets


async def test_the_worker_reports_its_batches_assignments_and_embeddings(engine):
    port = engine.settings.worker_metrics_port
    before = await asyncio.to_thread(scrape, port)
    org = unique("org")
    turns = [f"metrics turn {unique('t')}" for _ in range(3)]
    await ingest(engine.caller(org, clearance=1), "s", turns)
    await wait_embedded(engine, org)
    for _ in range(50):  # the waiting gauge drops right after the assignment commits
        after = await asyncio.to_thread(scrape, port)
        if after["context_engine_vector_assignments_waiting"] == 0:
            break
        await asyncio.sleep(0.1)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("context_engine_projector_batch_events_sum") >= len(turns)
    assert grew("context_engine_projector_batch_seconds_count") >= 1
    assert grew("context_engine_embedded_texts_total") >= len(turns)  # distinct contents: computed
    assert grew("context_engine_embedding_batch_seconds_count") >= 1
    assert grew("context_engine_vector_assignment_seconds_count") >= 1
    assert after["context_engine_vector_assignments_waiting"] == 0
