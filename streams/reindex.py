"""`context-engine reindex`: ask the worker to re-embed a scope with the running embedder, and
watch it happen.

The request is a ReindexJob on the reindex stream (keyed by org); the worker's reindex agent
(streams/agents/embedding.py) re-embeds every chunk owned at the scope or below whose vector came from
another model, recording the vectors on the log like any embedding. Progress is read from the
read model: chunks of the scope whose vector is from the running model, out of all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from context_engine.scope import Scope
from projections.reads.embedding_backlog import model_coverage_in_scope
from projections.store.pool import org_transaction
from streams.jobs import publish, reindex_job
from streams.record_auth import RecordSigner
from streams.topics import LogTopics


@dataclass(frozen=True)
class ReindexProgress:
    total: int
    current: int  # chunks whose vector is from the running model
    previous_model: str  # the most common other model in the scope ("" = none)

    @property
    def done(self) -> bool:
        return self.current >= self.total


async def progress(pool: asyncpg.Pool, scope: Scope, model_version: str) -> ReindexProgress:
    async with org_transaction(pool, scope.org_id, readonly=True) as conn:
        total, current, previous = await model_coverage_in_scope(conn, scope, model_version)
    return ReindexProgress(total, current, previous or "")


async def request(bootstrap: str, topics: LogTopics, scope: Scope, *, old_model_version: str,
                  new_model_version: str, initiated_by: str, signer: RecordSigner,
                  security: Mapping[str, Any] | None = None) -> str:
    """Publish the ReindexJob (signed: streams/record_auth.py); returns its message_id."""
    job = reindex_job(scope, old_model_version, new_model_version, initiated_by)
    await publish(bootstrap, topics.jobs["reindex"], [job], signer=signer, security=security)
    return job.message_id
