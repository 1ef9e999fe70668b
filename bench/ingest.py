"""Ingest benchmark: concurrent clients call IngestEvent on a real stack for a fixed time.

Starts `context-engine up` in a scratch data directory (embedded PostgreSQL + tansu + worker +
API as separate processes, exactly as a user runs it), then drives it through gRPC with minted
tokens. Reports acknowledged events/s, acknowledgement latency p50/p95/p99 (an event is
acknowledged once archived and projected), projection lag p50/p95 (archived_at - occurred_at),
and the replay rate of everything written, from the broker's log and from the archive.

    .venv/bin/python bench/ingest.py                 # 16 clients, 60 s
    .venv/bin/python bench/ingest.py --clients 4 --seconds 10
    .venv/bin/python bench/ingest.py --seconds 30 --keep /tmp/ing   # then: bench/replay.py --home /tmp/ing
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import shutil
import statistics
import tempfile
import time

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import asyncpg
import grpc  # noqa: E402
from options import add_setting_option, stack_settings
from report import machine, percentile
from server_metrics import Histogram, ServerMetrics
from stack import Stack, free_port

from context_engine.auth import ensure_dev_key, mint_token
from projections.store import admin
from streams.record_auth import Keyring, RecordVerifier
from streams.replay import read_archive, read_log, replay
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc


async def drive(port: int, token: str, org: str, clients: int, seconds: float, payload: bytes) -> list[float]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = context_pb2_grpc.ContextEngineStub(channel)
    metadata = (("authorization", f"Bearer {token}"),)
    scope = pb.ScopePath(org_id=org)
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal errors
        n = 0
        while time.monotonic() < deadline:
            request = pb.IngestEventRequest(scope=scope, session_id=f"session-{i % 10}", event_type="message",
                                            content=payload + f" #{i}-{n}".encode(), metadata={"role": "user"})
            started = time.perf_counter()
            try:
                await stub.IngestEvent(request, metadata=metadata)
                latencies.append(time.perf_counter() - started)
            except grpc.aio.AioRpcError:
                errors += 1
            n += 1

    # Warm-up: the worker joins its consumer group in a few seconds.
    warm_deadline = time.monotonic() + 60
    while True:
        try:
            await stub.IngestEvent(pb.IngestEventRequest(scope=scope, session_id="warmup", event_type="message",
                                                         content=b"warm"), metadata=metadata)
            break
        except grpc.aio.AioRpcError:
            if time.monotonic() > warm_deadline:
                raise
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(client(i) for i in range(clients)))
    await channel.close()
    if errors:
        print(f"errors: {errors}")
    return latencies


async def lag(database_url: str, org: str) -> list[float]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT extract(epoch FROM archived_at - occurred_at) AS lag FROM event_archive "
                                "WHERE org_id = $1", org)
        return [float(r["lag"]) for r in rows]
    finally:
        await conn.close()


async def replay_rates(endpoints: dict[str, str], topic: str, home: pathlib.Path) -> dict[str, tuple[int, float]]:
    rates = {}
    verifier = RecordVerifier(Keyring(home / "keys" / "log-hmac.keyring", create=False))
    for name, records in (("log", read_log(endpoints["kafka_bootstrap"], topic, verifier=verifier)),
                          ("archive", read_archive(endpoints["database_url"], topic))):
        target = await admin.create_database(endpoints["database_url"],
                                                admin.timestamped_name(f"bench_replay_{name}"))
        report = await replay(records, target)
        rates[name] = (report.events, report.rate)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--payload-bytes", type=int, default=200)
    parser.add_argument("--keep", type=pathlib.Path, default=None, metavar="DIR",
                        help="run in DIR and keep it (bench/replay.py --home DIR replays its archive)")
    add_setting_option(parser)
    args = parser.parse_args()
    settings = stack_settings(args)

    if args.keep and args.keep.exists():
        parser.error(f"{args.keep} exists; --keep needs a new directory")
    home = args.keep or pathlib.Path(tempfile.mkdtemp(prefix="context-engine-bench-"))
    worker_metrics = ServerMetrics([free_port()])
    settings.setdefault("CONTEXT_ENGINE_WORKER_METRICS_PORT", str(worker_metrics.ports[0]))
    stack = Stack(home, settings=settings)
    try:
        stack.wait_serving()
        endpoints = stack.endpoints()
        org = "bench"
        token = mint_token(ensure_dev_key(home / "keys" / "jwt-hs256.key"), org=org, clearance=1,
                           ttl=__import__("datetime").timedelta(hours=2))
        payload = (b'{"role": "user", "text": "' + b"x" * max(0, args.payload_bytes - 30) + b'"}')
        before = worker_metrics.snapshot()
        latencies = asyncio.run(drive(stack.api_port, token, org, args.clients, args.seconds, payload))
        after = worker_metrics.snapshot()
        lags = asyncio.run(lag(endpoints["database_url"], org))
        rates = asyncio.run(replay_rates(endpoints, "context-engine.events", home))
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)  # a 60 s run leaves ~800 MB

    ms = [x * 1000 for x in latencies]
    print(f"machine: {machine()}")
    print(f"settings: {args.clients} clients, {args.seconds:.0f} s, ~{args.payload_bytes} B content, "
          "embedded PostgreSQL 18 + tansu, 4 partitions, ack after archive+projection"
          + "".join(f", {k}={v}" for k, v in settings.items()))
    print(f"acknowledged: {len(ms)} events, {len(ms) / args.seconds:,.0f} events/s")
    print(f"ack latency ms: p50 {percentile(ms, 50):.1f}  p95 {percentile(ms, 95):.1f}  "
          f"p99 {percentile(ms, 99):.1f}  mean {statistics.fmean(ms):.1f}")
    lag_ms = [x * 1000 for x in lags]
    print(f"projection lag ms (archived_at - occurred_at): p50 {percentile(lag_ms, 50):.1f}  "
          f"p95 {percentile(lag_ms, 95):.1f}")
    for line in worker_lines(worker_metrics, before, after, args.seconds):
        print(line)
    for name, (events, rate) in rates.items():
        print(f"replay from {name}: {events} events at {rate:,.0f} events/s")


def worker_lines(metrics: ServerMetrics, before, after, seconds: float) -> list[str]:
    """What the worker reported over the load phase (its /metrics, context_engine/metrics.py)."""
    def one(name: str) -> Histogram:
        return next(iter(metrics.histograms(before, after, name).values()), Histogram())

    batches, events = one("context_engine_projector_batch_seconds"), one("context_engine_projector_batch_events")
    assign, embed = one("context_engine_vector_assignment_seconds"), one("context_engine_embedding_batch_seconds")
    texts = (after.get(("context_engine_embedded_texts_total", ()), 0.0)
             - before.get(("context_engine_embedded_texts_total", ()), 0.0))
    return [
        f"projector (worker-side): {batches.count:,.0f} batches, {events.total / max(events.count, 1):.1f} events "
        f"each; batch ms mean {batches.mean_ms:.1f} p50 {batches.quantile_ms(.5):.1f} "
        f"p95 {batches.quantile_ms(.95):.1f}; "
        f"busy {batches.total / seconds:.0%} of the run",
        f"vector assignments after the commit: {assign.count:,.0f}, ms mean {assign.mean_ms:.1f} "
        f"p95 {assign.quantile_ms(.95):.1f}; embedder: {texts:,.0f} texts in {embed.count:,.0f} batches "
        f"({texts / seconds:.0f} texts/s against {events.total / seconds:.0f} events/s projected)",
    ]


if __name__ == "__main__":
    main()
