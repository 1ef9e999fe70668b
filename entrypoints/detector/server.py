"""The ML detector sidecar process: gRPC server, per-model health, graceful shutdown.

Every RPC of MLDetectorService needs `authorization: Bearer <service token>`
(inference/detector/token.py; UNAUTHENTICATED, reason SERVICE_TOKEN_REJECTED, otherwise). The
gRPC health checks and reflection stay open: they carry no data, and the supervisor and
orchestrators' probes (which cannot send metadata) use them.

Health names: "" (the process) and "upsquad.ml.v1.MLDetectorService" are SERVING once the server
is up; "prompt-guard-86m" and "gliner-small-v2.1" are SERVING only while that model is loaded (and,
for GLiNER, while its anti-collapse canary passes). The server starts before the weights load, so
probes answer during a slow load with the model names NOT_SERVING.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import structlog

from context_engine.config import Settings
from entrypoints.serving.interceptors import ErrorsAndAccessLog, ServiceToken
from entrypoints.serving.server import HostedServer, ServiceBinding, build_server, wait_for_termination_signal
from inference.detector.service import MODEL_NAMES, SERVICE_NAME, DetectorServicer
from inference.detector.settings import DetectorSettings
from inference.detector.token import service_token
from upsquad.ml.v1 import detector_pb2_grpc

log = structlog.get_logger("context_engine.detector")


def build_detector_server(settings: Settings, detector_settings: DetectorSettings | None = None, *,
                          address: str | None = None,
                          servicer: DetectorServicer | None = None) -> tuple[HostedServer, DetectorServicer]:
    """A detector server bound to `address` (default settings.detector_address), not started.
    Every call but the health checks needs the service token (inference/detector/token.py);
    ValueError for a configured token that could not be sent."""
    token = service_token(settings)  # before anything starts: a bad token fails the start
    servicer = servicer or DetectorServicer(detector_settings or DetectorSettings())
    interceptors = [ErrorsAndAccessLog(), ServiceToken(token)]

    def register(server) -> None:
        detector_pb2_grpc.add_MLDetectorServiceServicer_to_server(servicer, server)

    binding = ServiceBinding(SERVICE_NAME, register)
    hosted = build_server(address or settings.detector_address, [binding], interceptors=interceptors,
                          max_message_bytes=settings.grpc_max_message_bytes)
    return hosted, servicer


async def start_detector(hosted: HostedServer, servicer: DetectorServicer) -> None:
    """Start serving, then load the models and publish their health."""
    await hosted.start()
    for name in MODEL_NAMES:
        await hosted.set_health(name, False)
    servicer.add_health_listener(hosted.set_health)
    await servicer.load()
    log.info("detector started", port=hosted.port, models=servicer.health(), problems=servicer.problems())


async def run_detector(settings: Settings, detector_settings: DetectorSettings | None = None, *,
                       ready: Callable[[HostedServer], object] | None = None) -> None:
    """Run the sidecar until SIGTERM / SIGINT, then stop gracefully."""
    hosted, servicer = build_detector_server(settings, detector_settings)
    try:
        await start_detector(hosted, servicer)
        if ready is not None:
            result = ready(hosted)
            if inspect.isawaitable(result):
                await result
        signal_name = await wait_for_termination_signal()
        log.info("detector stopping", signal=signal_name, grace_seconds=settings.shutdown_grace_seconds)
    finally:
        await hosted.stop(settings.shutdown_grace_seconds)
        servicer.close()
