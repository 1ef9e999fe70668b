"""The worker's word that it is projecting, for `context-engine up` and the API's health.

The API answers as soon as it listens, but an IngestEvent is acknowledged only once the worker
has archived and projected it, and the worker needs ~3 s to join its consumer group. The worker
writes `run/worker.ready` in the data directory when the domain-event topic's partitions are
assigned to it. The supervisor removes the file before it starts the worker, so a file left by an
earlier run never counts, and again as soon as it sees the worker dead, before it restarts it.

`up` says SERVING only once the file exists, and it starts its API processes with
`HEALTH_FOLLOWS_WORKER_ENV` set: they begin to listen once the file exists (`wait_ready`), and
their `grpc.health.v1` status then follows it (`follow`): NOT_SERVING while no worker projects,
since no write can be acknowledged then. An API started on its own (`context-engine serve api`,
the worker elsewhere) does neither.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Awaitable, Callable

# Set by `up` in its API processes' environment (not a setting: it says who supervises them).
HEALTH_FOLLOWS_WORKER_ENV = "CONTEXT_ENGINE_HEALTH_FOLLOWS_WORKER"
FOLLOW_INTERVAL_S = 0.2


def ready_file(home: pathlib.Path) -> pathlib.Path:
    return home / "run" / "worker.ready"


def mark_ready(home: pathlib.Path, partitions: list[int]) -> None:
    path = ready_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"event partitions {' '.join(map(str, partitions))}\n")  # for a reader; only existence counts


def clear(home: pathlib.Path) -> None:
    ready_file(home).unlink(missing_ok=True)


def is_ready(home: pathlib.Path) -> bool:
    return ready_file(home).exists()


def health_follows_worker(environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(HEALTH_FOLLOWS_WORKER_ENV) == "1"


async def wait_ready(home: pathlib.Path, interval: float = FOLLOW_INTERVAL_S) -> None:
    while not is_ready(home):
        await asyncio.sleep(interval)


async def follow(home: pathlib.Path, on_change: Callable[[bool], Awaitable[None]], *,
                 ready: bool, interval: float = FOLLOW_INTERVAL_S) -> None:
    """Call `on_change(now_ready)` whenever the ready file appears or goes, `ready` being what the
    caller last saw; runs until cancelled. One stat() a poll."""
    while True:
        await asyncio.sleep(interval)
        now = is_ready(home)
        if now != ready:
            ready = now
            await on_change(now)
