"""`embedding-pipeline`: EmbeddingJobs -> `embedding.recorded` events; `reindex-worker`:
ReindexJobs, a scope re-embedded with the running model (streams/embedding_pipeline.py)."""

from __future__ import annotations

import faust
import structlog
from faust.types import StreamT

from streams.agents import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, windowed
from streams.agents.resources import WorkerResources
from streams.embedding_pipeline import EmbeddingPipeline
from streams.jobs import open_envelope, scope_of
from upsquad.context.v1 import stream_pb2

log = structlog.get_logger("context_engine.worker")


def register_embedding_pipeline(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["embedding"], name="embedding-pipeline")
    async def embedding_agent(stream: StreamT) -> None:
        p = await resources.pipeline()
        async for batch in windowed(stream).take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            by_org: dict[str, list[str]] = {}
            for event in resources.authentic(batch):
                env, job = open_envelope(event.value, stream_pb2.EmbeddingJob)
                by_org.setdefault(env.scope.org_id, []).extend(job.chunk_ids)
            await embed_orgs(p, by_org)


async def embed_orgs(p: EmbeddingPipeline, chunk_ids_by_org: dict[str, list[str]]) -> None:
    """Never crash the agent on an embedder failure: the chunks stay in the backlog and the
    sweep retries them."""
    for org_id, ids in chunk_ids_by_org.items():
        try:
            await p.embed_chunks(org_id, ids)
        except Exception:
            log.exception("embedding failed; left for the backlog sweep", org_id=org_id, chunks=len(ids))


def register_reindex_worker(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["reindex"], name="reindex-worker")
    async def reindex_agent(stream: StreamT) -> None:
        p = await resources.pipeline()
        async for event in stream.events():
            if resources.authentic([event]):
                await _reindex(p, event.value)


async def _reindex(p: EmbeddingPipeline, raw_job: bytes) -> None:
    """A job for another model than the running one is refused; a failure is logged, not retried."""
    _env, job = open_envelope(raw_job, stream_pb2.ReindexJob)
    scope = scope_of(job.scope)
    if job.new_model_version and job.new_model_version != p.model_version:
        log.error("reindex refused: the running embedder is another model", scope=scope.path,
                  asked=job.new_model_version, running=p.model_version)
        return
    try:
        n = await p.reindex(scope)
        log.info("reindexed", scope=scope.path, contents=n, model_version=p.model_version)
    except Exception:
        log.exception("reindex failed", scope=scope.path)
