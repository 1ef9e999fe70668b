"""The worker's app as `create_app` puts it together (streams/app.py, streams/agents/), without a
broker or a database: which agents read which topics, the order of its tasks, and what its agents
share (one pool, made again when it failed; the pipeline and the assigner made once)."""

import asyncio
import threading

import faust
import pytest

from context_engine.config import Settings
from streams.agents import resources as resources_module
from streams.agents.resources import WorkerResources
from streams.app import create_app


class FakeEmbedder:
    dimension = 384
    model_version = "fake-model"

    def __init__(self, executor) -> None:
        self.executor = executor
        self.loaded_on = threading.current_thread().name


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setattr(resources_module, "embedder_from_settings",
                        lambda _settings, executor=None: FakeEmbedder(executor))
    return Settings(home=tmp_path / "home")


def resources_of(settings) -> WorkerResources:
    return WorkerResources(faust.App("worker-resources-test", autodiscover=False), settings)


@pytest.fixture
def pools(monkeypatch):
    """The pools asked of `create_pool`, in order; each call fails while `failures` is positive."""
    made: list[object] = []
    state = {"failures": 0}

    async def create_pool(url, **_kwargs):
        await asyncio.sleep(0)  # agents starting together ask while the first ask is under way
        if state["failures"]:
            state["failures"] -= 1
            raise ConnectionRefusedError("database down")
        made.append(object())
        return made[-1]

    monkeypatch.setattr(resources_module, "create_pool", create_pool)
    return made, state


def test_every_agent_reads_its_topic_and_the_tasks_start_in_order(settings):
    app = create_app(settings, "localhost:1")
    assert {name: agent.channel.get_topic_name() for name, agent in app.agents.items()} == {
        "session-projector": "context-engine.events",
        "chunk-indexer": "context-engine.indexing",
        "embedding-pipeline": "context-engine.embedding",
        "reindex-worker": "context-engine.reindex",
        "baseline-calculator": "context-engine.metrics-baseline",
        "audit-writer": "context-engine.audit-access",
        "pii-scanner": "context-engine.pii",
        "compaction-worker": "context-engine.compaction",
    }
    assert [task.__wrapped__.__name__ for task in app._app_tasks] == [
        "sweep_backlog", "assign_vectors", "sweep_at_start", "compact_open_requests_at_start", "compact_lost_requests"]


async def test_agents_starting_together_share_one_pool(settings, pools):
    made, _ = pools
    resources = resources_of(settings)
    first, second = await asyncio.gather(resources.pool(), resources.pool())
    assert first is second is made[0]
    assert await resources.pool() is first and len(made) == 1


async def test_a_pool_that_failed_is_made_again_when_next_asked(settings, pools):
    made, state = pools
    state["failures"] = 1
    resources = resources_of(settings)
    with pytest.raises(ConnectionRefusedError):
        await resources.pool()
    assert await resources.pool() is made[0]


async def test_the_pipeline_and_the_vector_assigner_are_made_once_on_the_shared_pool(settings, pools):
    made, _ = pools
    resources = resources_of(settings)
    pipeline, assigner = await resources.pipeline(), await resources.vector_assigner()
    assert await resources.pipeline() is pipeline and await resources.vector_assigner() is assigner
    assert pipeline.pool is assigner.pool is made[0]
    assert pipeline.model_version == "fake-model"


def test_the_embedder_is_loaded_at_once_on_the_thread_it_runs_on(settings):
    resources = resources_of(settings)
    assert resources.embedder.executor is resources.embedding_thread
    assert resources.embedder.loaded_on.startswith("embedder")
