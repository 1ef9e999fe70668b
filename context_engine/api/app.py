"""The ContextEngine API process: builds the server and serves until SIGTERM/SIGINT."""

from __future__ import annotations

import structlog
from upsquad.context.v1 import context_pb2, context_pb2_grpc

from context_engine.api.context_servicer import ContextEngineServicer
from context_engine.api.interceptors import Authentication, ErrorsAndAccessLog
from context_engine.api.server import HostedServer, ServiceBinding, build_server, wait_for_termination_signal
from context_engine.auth import TokenVerifier
from context_engine.config import Settings

log = structlog.get_logger("context_engine.api")

SERVICE_NAME = context_pb2.DESCRIPTOR.services_by_name["ContextEngine"].full_name


def build_api_server(settings: Settings, address: str | None = None) -> HostedServer:
    servicer = ContextEngineServicer()
    binding = ServiceBinding(
        SERVICE_NAME, lambda server: context_pb2_grpc.add_ContextEngineServicer_to_server(servicer, server))
    return build_server(
        address or settings.api_address, [binding],
        interceptors=[ErrorsAndAccessLog(), Authentication(TokenVerifier(settings))],
        max_message_bytes=settings.grpc_max_message_bytes,
    )


async def run_api(settings: Settings) -> None:
    server = build_api_server(settings)
    await server.start()
    log.info("serving", service=SERVICE_NAME, address=f"{settings.api_host}:{server.port}")
    signal_name = await wait_for_termination_signal()
    log.info("stopping", signal=signal_name, grace_s=settings.shutdown_grace_seconds)
    await server.stop(settings.shutdown_grace_seconds)
    log.info("stopped")
