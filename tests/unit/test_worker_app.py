"""The worker's app as `create_app` puts it together (streams/app.py, streams/agents/), without a
broker or a database: which agents read which topics, the order of its tasks, and what its agents
share (one pool, made again when it failed; the pipeline and the assigner made once)."""

import asyncio
import threading

import faust
import pytest

from context_engine.config import Settings
from streams.agents.resources import WorkerResources
from streams.app import create_app


class FakeEmbedder:
    dimension = 384
    model_version = "fake-model"

    def __init__(self, executor) -> None:
        self.executor = executor
        self.loaded_on = threading.current_thread().name


def load_fake_embedder(_settings, executor=None) -> FakeEmbedder:
    return FakeEmbedder(executor)


@pytest.fixture
def settings(tmp_path):
    return Settings(home=tmp_path / "home")


class Pools:
    """The pools asked of `connect`, in order; each call fails while `failures` is positive."""

    def __init__(self) -> None:
        self.made: list[object] = []
        self.failures = 0

    async def connect(self, url, **_kwargs):
        await asyncio.sleep(0)  # agents starting together ask while the first ask is under way
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError("database down")
        self.made.append(object())
        return self.made[-1]


@pytest.fixture
def pools() -> Pools:
    return Pools()


def resources_of(settings, pools: Pools | None = None) -> WorkerResources:
    return WorkerResources(faust.App("worker-resources-test", autodiscover=False), settings,
                           load_embedder=load_fake_embedder, connect=(pools or Pools()).connect)


def test_every_agent_reads_its_topic_and_the_tasks_start_in_order(settings):
    app = create_app(settings, "localhost:1", load_embedder=load_fake_embedder)
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


def test_deployments_sharing_a_cluster_have_consumer_groups_of_their_own(tmp_path):
    """A worker joining, leaving or killed in one deployment must not rebalance another's (they
    shared one group once, and a full suite's deployments on one broker did)."""
    def group(prefix: str | None) -> str:
        extra = {} if prefix is None else {"topic_prefix": prefix}
        return create_app(Settings(home=tmp_path / "home", **extra), "localhost:1",
                          load_embedder=load_fake_embedder).conf.id
    groups = {prefix: group(prefix) for prefix in (None, "tenant-a", "tenant-b", "tenant-a.x")}
    assert len(set(groups.values())) == len(groups)
    # the default deployment's group is the name it always had: its committed offsets still count
    assert groups[None] == "context-engine-workers"


async def test_agents_starting_together_share_one_pool(settings, pools):
    made = pools.made
    resources = resources_of(settings, pools)
    first, second = await asyncio.gather(resources.pool(), resources.pool())
    assert first is second is made[0]
    assert await resources.pool() is first and len(made) == 1


async def test_a_pool_that_failed_is_made_again_when_next_asked(settings, pools):
    pools.failures = 1
    resources = resources_of(settings, pools)
    with pytest.raises(ConnectionRefusedError):
        await resources.pool()
    assert await resources.pool() is pools.made[0]


async def test_the_pipeline_and_the_vector_assigner_are_made_once_on_the_shared_pool(settings, pools):
    made = pools.made
    resources = resources_of(settings, pools)
    pipeline, assigner = await resources.pipeline(), await resources.vector_assigner()
    assert await resources.pipeline() is pipeline and await resources.vector_assigner() is assigner
    assert pipeline.pool is assigner.pool is made[0]
    assert pipeline.model_version == "fake-model"


def test_the_embedder_is_loaded_at_once_on_the_thread_it_runs_on(settings):
    resources = resources_of(settings)
    assert resources.embedder.executor is resources.embedding_thread
    assert resources.embedder.loaded_on.startswith("embedder")
