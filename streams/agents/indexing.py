"""`chunk-indexer`: the chunks of contents over 8 KiB, after the projector's commit, built and
written by the indexer's background process (projections/projector/deferred_indexing.py,
indexer_process.py), then their embedding jobs."""

from __future__ import annotations

import contextlib
import functools
from concurrent.futures.process import BrokenProcessPool

import faust
import structlog
from faust.types import StreamT

from context_engine.scope import Scope
from projections.projector import deferred_indexing, indexer_process
from projections.projector.indexer_process import IndexingFailed, describe
from projections.projector.rejections import is_infrastructure_failure
from streams.agents import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, windowed
from streams.agents.resources import WorkerResources
from streams.jobs import embedding_job, open_indexing_job

log = structlog.get_logger("context_engine.worker")


def register_chunk_indexer(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["indexing"], name="chunk-indexer")
    async def chunk_indexer(stream: StreamT) -> None:
        async for batch in windowed(stream).take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            by_org: dict[str, list[str]] = {}
            for event in resources.authentic(batch):
                env, source = open_indexing_job(event.value)
                by_org.setdefault(env.scope.org_id, []).append(source)
            await index_sources(resources, by_org)


async def index_sources(resources: WorkerResources, sources_by_org: dict[str, list[str]]) -> None:
    """Index long contents (projections/projector/deferred_indexing.py) and ask for their embeddings. A
    source that fails stays requested: the sweep tries it again. A failure of the content's
    making (not PostgreSQL's or the broker's) is counted on its request; a process that died
    indexing it (killed, out of memory) counts too, when it dies again on it."""
    for org_id, sources in sources_by_org.items():
        for source in sources:
            try:
                unembedded = await _index_in_process(resources, org_id, source)
            except Exception as exc:
                log.exception("indexing failed; left for the sweep", org_id=org_id, source_event_id=source)
                failed = exc if isinstance(exc, IndexingFailed) else IndexingFailed(
                    describe(exc), is_infrastructure_failure(exc))
                if not failed.infrastructure:
                    with contextlib.suppress(Exception):
                        async with (await resources.pool()).acquire() as conn:
                            await deferred_indexing.record_failure(conn, org_id, source, failed.description)
                continue
            for event_id, chunk_ids in unembedded.items():
                await resources.send_job("embedding", embedding_job(Scope(org_id), event_id, chunk_ids))


async def _index_in_process(resources: WorkerResources, org_id: str, source: str) -> dict[str, list[str]]:
    settings = resources.settings
    index = functools.partial(indexer_process.index_source, settings.database_url, org_id, source,
                              build_niceness=settings.embedding_niceness, build_idle=settings.embedding_idle_priority)
    try:
        return await resources.indexing_process.run(index)
    except BrokenProcessPool:
        # A dying process fails every call it held, this one maybe for another source's sake (the
        # sweep shares the process): once more in a new one before it counts against this source.
        log.warning("the indexer's process died; trying the source again in a new one",
                    org_id=org_id, source_event_id=source)
        return await resources.indexing_process.run(index)
