"""`chunk-indexer`: the chunks of contents over 8 KiB, after the projector's commit, built in the
indexer's background process (projections/projector/deferred_indexing.py), then their embedding jobs."""

from __future__ import annotations

import contextlib

import asyncpg
import faust
import structlog
from faust.types import StreamT
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from context_engine.scope import Scope
from projections.projector import deferred_indexing
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
    source that fails stays requested: the sweep tries it again."""
    db = await resources.pool()
    for org_id, sources in sources_by_org.items():
        for source in sources:
            try:
                unembedded = await _index_one(resources, db, org_id, source)
            except Exception as exc:
                log.exception("indexing failed; left for the sweep", org_id=org_id, source_event_id=source)
                if not is_infrastructure_failure(exc):
                    with contextlib.suppress(Exception):
                        async with db.acquire() as conn:
                            await deferred_indexing.record_failure(conn, org_id, source, exc)
                continue
            for event_id, chunk_ids in unembedded.items():
                await resources.send_job("embedding", embedding_job(Scope(org_id), event_id, chunk_ids))


async def _index_one(resources: WorkerResources, db: asyncpg.Pool, org_id: str,
                     source: str) -> dict[str, list[str]]:
    async for attempt in AsyncRetrying(retry=retry_if_exception_type(asyncpg.TransactionRollbackError),
                                       stop=stop_after_attempt(3), reraise=True):
        with attempt:  # a deadlock with the projector, which PostgreSQL broke: again
            async with db.acquire() as conn:
                return await deferred_indexing.index_requested(conn, org_id, source,
                                                               builder=resources.indexing_process)
    raise AssertionError("unreachable: the retry loop returns or raises")
