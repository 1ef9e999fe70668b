"""The worker's agents, one module per family, each with a `register_…(app, resources)` that puts
its agents, timers or tasks on the Faust app (streams/app.py `create_app` calls them in order):

- projector.py — `session-projector` (and the readiness mark), the `assign_vectors` task;
- indexing.py — `chunk-indexer`;
- embedding.py — `embedding-pipeline`, `reindex-worker`;
- savings.py — `baseline-calculator`;
- audit.py — `audit-writer`;
- pii.py — `pii-scanner`;
- compaction.py — `compaction-worker`, and its sweep of open compaction requests;
- sweep.py — the backlog sweep, every `SWEEP_INTERVAL_S` and once at start.

What they share (topics, signatures, the pool, the embedder...) is a `WorkerResources`
(resources.py). Every agent first drops the records no trusted writer signed (`authentic`).
"""

from __future__ import annotations

from typing import cast

from faust.types import StreamT

from streams.windowed_stream import WindowedStream

# How the job agents batch: up to JOB_BATCH_MAX records, or what came within JOB_BATCH_WITHIN_S
# of the first (streams/windowed_stream.py).
JOB_BATCH_MAX = 64
JOB_BATCH_WITHIN_S = 0.02


def windowed(stream: StreamT) -> WindowedStream:
    """An agent's stream, which is the app's `Stream` class (streams/app.py: WindowedStream)."""
    return cast(WindowedStream, stream)
