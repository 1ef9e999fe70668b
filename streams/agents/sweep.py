"""The backlog sweep: work asked for and not done (indexing still requested, chunks without a
vector, memory whose PII scan is still pending: a job lost in a crash) is done again, all of it
once at start, then every `SWEEP_INTERVAL_S` what is older than `SWEEP_MIN_AGE_S`."""

from __future__ import annotations

import datetime as dt

import faust

from projections.projector import deferred_indexing
from streams.agents.embedding import embed_orgs
from streams.agents.indexing import index_sources
from streams.agents.pii import scan
from streams.agents.resources import WorkerResources

SWEEP_INTERVAL_S = 30.0
SWEEP_MIN_AGE_S = 600.0


async def sweep(resources: WorkerResources, older_than: dt.timedelta) -> None:
    async with (await resources.pool()).acquire() as conn:
        await index_sources(resources, await deferred_indexing.backlog(conn, older_than=older_than))
    p = await resources.pipeline()
    after = None
    while True:  # the whole backlog, a page at a time (a restart can leave thousands)
        page, after = await p.backlog(older_than=older_than, after=after)
        await embed_orgs(p, page)
        if after is None:
            break
    s = await resources.scanner()
    await scan(s, await s.backlog(older_than=older_than))


def register_sweep_timer(app: faust.App, resources: WorkerResources) -> None:
    @app.timer(SWEEP_INTERVAL_S)
    async def sweep_backlog() -> None:
        # Only work older than any queued job should be: a sweep of younger chunks would embed
        # again what the agents are about to (measured: it doubled the work under a backlog).
        await sweep(resources, dt.timedelta(seconds=SWEEP_MIN_AGE_S))


def register_sweep_at_start(app: faust.App, resources: WorkerResources) -> None:
    @app.task
    async def sweep_at_start() -> None:
        await sweep(resources, dt.timedelta(0))
