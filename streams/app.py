"""The Faust application that runs the stream workers (projectors and job workers).

Timeouts follow what measured well on the bundled broker (shared/ENVIRONMENT.md): a short
session timeout and heartbeat make a worker ready in ~3 s after a start or a crash, instead
of the default ~30-110 s, and cause no extra rebalances under load. Topics are created by
the engine (streams.topics) with their partition counts, never implicitly by Faust.
"""

from __future__ import annotations

import faust

from context_engine.config import Settings

APP_ID = "context-engine-workers"


def create_app(settings: Settings, bootstrap: str) -> faust.App:
    return faust.App(
        APP_ID,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        broker_session_timeout=2.0,
        broker_heartbeat_interval=0.2,
        stream_wait_empty=False,
        consumer_auto_offset_reset="earliest",
        autodiscover=False,
    )


def run_worker(settings: Settings, bootstrap: str) -> None:
    """Run the worker until SIGTERM/SIGINT (Faust's Worker owns signal handling)."""
    app = create_app(settings, bootstrap)
    worker = faust.Worker(app, loglevel=settings.log_level.lower(), quiet=True)
    worker.execute_from_commandline()
