"""Calls under load: retrying what the engine calls retryable, open- and closed-loop drivers,
calls spread over connections to every API process, and a phase measured by the API's metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random
import sys
import time
from collections.abc import Awaitable, Callable

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # the bench scripts are entry points: before gRPC initialises
import grpc  # noqa: E402
from server_metrics import stage_table
from stack import Stack
from tqdm import tqdm

from upsquad.context.v1 import context_pb2_grpc

# What the engine answers when a retry with the same idempotency key is the right reaction.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL}
RETRIES: collections.Counter = collections.Counter()


async def call_with_retry(fn, request, metadata, *, patience: float = 600, timeout: float = 120):
    """Retry what the engine calls retryable (every IngestEvent here carries an idempotency key) until
    `patience` seconds have passed; RETRIES counts the retries by status code."""
    delay, deadline = 0.25, time.monotonic() + patience
    while True:
        try:
            return await fn(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE or time.monotonic() > deadline:
                raise
            RETRIES[exc.code().name] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5)


# `issue(since)` makes one call, records it (latency from `since`, loop time) and returns the loop
# time it completed at. The drivers set `phase.span`: first arrival to last completion.
Issue = Callable[[float], Awaitable[float]]


async def drive_open_loop(phase, issue: Issue, rate: float, seconds: float, *, poisson: bool = True,
                          seed: int = 3):
    """Offer `rate` calls/s for `seconds` whatever the answers: Poisson or evenly spaced arrivals,
    latency counted from the scheduled arrival."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    start = loop.time() + 0.05
    offset, tasks = 0.0, []
    while offset < seconds:
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        tasks.append(asyncio.create_task(issue(start + offset)))
        offset += rng.expovariate(rate) if poisson else 1.0 / rate
    phase.span = max(await asyncio.gather(*tasks)) - start
    return phase


async def drive_closed_loop(phase, issue: Issue, clients: int, seconds: float):
    """`clients` callers, each issuing its next call when the previous one answers."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + seconds

    async def client() -> float:
        end = loop.time()
        while loop.time() < deadline:
            end = await issue(loop.time())
        return end

    phase.span = max(await asyncio.gather(*(client() for _ in range(clients)))) - start
    return phase


async def one_at_a_time(stack: Stack, phase, caller, n: int, operations: tuple[str, ...], rpc_method: str):
    """`n` calls back to back through `caller` (`next_request()`, `call(phase, request, since)`),
    with the API's stage table for them in `phase.stages`."""
    async def run():
        started = time.perf_counter()
        for _ in tqdm(range(n), desc="stages", unit="call", file=sys.stderr):
            await caller.call(phase, caller.next_request(), asyncio.get_running_loop().time())
        phase.span = time.perf_counter() - started
        return phase

    return await measured(stack, run(), operations, rpc_method)


class SpreadStub:
    """A ContextEngine stub over several connections, each call on the next one. The API
    processes share their port through SO_REUSEPORT, which balances connections, not calls: one
    HTTP/2 connection lands on one process, as one agent's would. A fleet of agents holds many
    connections; so does the load generator (--connections)."""

    def __init__(self, channels: list[grpc.aio.Channel]) -> None:
        self._stubs = itertools.cycle([context_pb2_grpc.ContextEngineStub(c) for c in channels])

    def __getattr__(self, method: str):
        return getattr(next(self._stubs), method)


@contextlib.asynccontextmanager
async def spread_stub(stack: Stack, connections: int, token: str, scope: dict[str, str]):
    """`connections` connections, as evenly over the API processes as they divide. SO_REUSEPORT
    places each new connection on a process by a hash of its address, so 8 connections over 2
    processes came out 5 / 3 (62 % of the calls on one process, whose query embedder then
    queued). Each new connection is probed with one ResolveGuardrailLayers call, the API's
    per-process call counters say which process took it, and one beyond its share is closed."""
    from upsquad.context.v1 import context_pb2 as pb

    processes = stack.api_processes
    share = max(1, connections // processes)
    metrics = stack.metrics()
    kept: dict[int, list[grpc.aio.Channel]] = collections.defaultdict(list)
    request = pb.ResolveGuardrailLayersRequest(scope=pb.ScopePath(**scope))
    auth = (("authorization", f"Bearer {token}"),)
    try:
        for _ in range(64 * share * processes):
            if all(len(kept[i]) >= share for i in range(processes)):
                break
            # A local subchannel pool: otherwise channels to one address share one TCP connection.
            channel = grpc.aio.insecure_channel(stack.address, options=[("grpc.use_local_subchannel_pool", 1)])
            before = metrics.snapshot()
            await context_pb2_grpc.ContextEngineStub(channel).ResolveGuardrailLayers(request, metadata=auth)
            served = metrics.calls_per_process(before, metrics.snapshot(), RESOLVE_METHOD)
            process = max(range(processes), key=served.__getitem__)
            if len(kept[process]) < share:
                kept[process].append(channel)
            else:
                await channel.close()
        print("connections per API process: " + " / ".join(str(len(kept[i])) for i in range(processes)),
              file=sys.stderr, flush=True)
        yield SpreadStub([c for i in range(processes) for c in kept[i]])
    finally:
        for channels in kept.values():
            for channel in channels:
                await channel.close()


RESOLVE_METHOD = "/upsquad.context.v1.ContextEngine/ResolveGuardrailLayers"


async def measured(stack: Stack, run, operations: tuple[str, ...], rpc_method: str):
    """Await a load phase (`run`), set its `stages` from the API's metrics read around it, print
    its line."""
    metrics = stack.metrics()
    before = metrics.snapshot()
    phase = await run
    phase.stages = stage_table(metrics, before, metrics.snapshot(), operations, rpc_method)
    print(phase.line(), file=sys.stderr, flush=True)
    return phase
