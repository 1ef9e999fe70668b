"""The gRPC server both services run (the ContextEngine API and the ML detector): grpc.aio,
standard health checking (overall and per service), server reflection, message- and
metadata-size limits, the bind, and graceful shutdown on SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = structlog.get_logger("context_engine.server")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServiceBinding:
    """One gRPC service to host: its full name and the generated `add_*_to_server` call."""

    name: str
    register: Callable[[grpc.aio.Server], None]


class HostedServer:
    def __init__(self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer,
                 services: Sequence[ServiceBinding], port: int) -> None:
        self.server = server
        self.health = health_servicer
        self.services = services
        self.port = port

    async def set_health(self, name: str, serving: bool) -> None:
        await self.health.set(name, SERVING if serving else NOT_SERVING)

    async def start(self) -> None:
        freeze_startup_objects()
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """The process's and every hosted service's health at once (after a graceful shutdown
        began, the servicer keeps them NOT_SERVING whatever this says)."""
        await self.set_health("", serving)
        for service in self.services:
            await self.set_health(service.name, serving)

    async def stop(self, grace: float) -> None:
        """Stop taking new calls (health flips first, so balancers drain), let calls in flight finish."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, descriptors, models, pools: they live as long as the
    process) out of the garbage collector's reach. Its full passes otherwise traverse them all:
    in an API process under Search load each took 56-112 ms, a stall of every call in flight."""
    gc.collect()
    gc.freeze()


MAX_METADATA_BYTES = 16 * 1024


def build_server(address: str, services: Sequence[ServiceBinding], *,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 max_message_bytes: int = 8 * 1024 * 1024, reuse_port: bool = False) -> HostedServer:
    """`reuse_port` lets several processes serve one port; off, a second bind fails loudly."""
    server = grpc.aio.server(
        interceptors=list(interceptors),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
            # One limit, not gRPC's soft 8 KiB / hard 16 KiB pair, between which it refuses a
            # random share of calls: metadata up to this size always arrives (a token up to
            # auth.MAX_TOKEN_BYTES is then refused by the verifier, with its reason), larger never.
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ],
    )
    for service in services:
        service.register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [s.name for s in services] + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                      reflection.SERVICE_NAME],
        server,
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind gRPC server to {address}")
    return HostedServer(server, health_servicer, services, port)


async def wait_for_termination_signal() -> str:
    """Block until SIGTERM or SIGINT; returns the signal's name."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[str] = loop.create_future()

    def deliver(name: str) -> None:
        if not received.done():
            received.set_result(name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, deliver, sig.name)
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
