"""Embedding throughput: the local MiniLM embedder in process, or the Embed RPC of a stack.

    .venv/bin/python bench/embed.py                      # in process, batch sizes 1, 32, 100; ~45 s
    .venv/bin/python bench/embed.py --sizes 1,8,32 --seconds 5 --threads 1 --json out.json
    .venv/bin/python bench/embed.py --sizes 1 --seconds 5 --matmul float32  # the float32 products, one text at a time
    .venv/bin/python bench/embed.py --grpc               # starts a stack in a scratch directory
    .venv/bin/python bench/embed.py --grpc --address 127.0.0.1:50051 --data-dir .context-engine

In process, every batch is made of texts never embedded before in the run ("cold": the model
computes each one). Modes are pluggable: a mode turns the embedder into a ``batch -> vectors``
callable (MODES).

--grpc measures the Embed RPC (token check, the per-org cache lookup in PostgreSQL, the model
in the API process, the cache write, the response) through a blocking gRPC channel, one call in
flight. "grpc-cold": texts no run has sent before (a random run id in each), so nothing is
cached; "grpc-cached": the same batches again, in the same order, so every vector comes from
the cache. The `cached` flag of every returned vector is checked against that expectation.
Without --address it starts `context-engine up` in a scratch directory (bench/stack.py) and
stops it at the end; with --address it needs --token or the stack's --data-dir (to mint one
with its development key).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

from inference.minilm_embedder import MATMULS, MiniLMEmbedder

EmbedFn = Callable[[list[str]], np.ndarray]

_WORDS = (
    "agent memory context session user assistant tool output request response budget token "
    "cache vector search summary policy guardrail scope project tenant event stream snapshot "
    "database query index latency throughput model prompt message workflow step result error "
    "retry deploy release customer invoice payment order shipment report quarter revenue team "
    "meeting schedule calendar document review approve reject update delete create the a of to "
    "and in for on with is was be are this that it from by at as an or not but can will should"
).split()


def text_stream(seed: int = 7, tag: str = "") -> Iterator[str]:
    """Endless unique, chat-message-like texts of 8-60 words (`tag` makes them unique across runs)."""
    rng = random.Random(seed)
    n = 0
    while True:
        words = rng.choices(_WORDS, k=rng.randint(8, 60))
        n += 1
        yield f"[{tag}{n}] " + " ".join(words).capitalize() + "."


def cpu_flags() -> str:
    """The instruction sets that decide how onnxruntime computes int8 products (VNNI or not)."""
    wanted = ("avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return " ".join(flag for flag in wanted if flag in flags) or "none of " + " ".join(wanted)


def machine_info(embedder: MiniLMEmbedder) -> dict[str, object]:
    import onnxruntime

    cpu_model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
        "onnxruntime": onnxruntime.__version__,
        "model_version": embedder.model_version,
        "intra_op_threads": embedder.intra_op_threads,
        "max_batch_size": embedder.max_batch_size,
        **embedder.matmul_status(),  # the matmul measured: int8 only if the self-check kept it on this CPU
        "cpu_flags": cpu_flags(),
    }


@dataclass
class Result:
    mode: str
    batch_size: int
    batches: int
    p50_ms: float
    p95_ms: float
    ms_per_text: float
    texts_per_s: float


def measure(mode: str, fn: EmbedFn, batch_size: int, texts: Iterator[str], *,
            seconds: float, max_batches: int, warmup: int) -> Result:
    for _ in range(warmup):
        fn([next(texts) for _ in range(batch_size)])
    latencies: list[float] = []
    started = time.perf_counter()
    while len(latencies) < max_batches and time.perf_counter() - started < seconds:
        batch = [next(texts) for _ in range(batch_size)]
        t0 = time.perf_counter()
        out = fn(batch)
        latencies.append(time.perf_counter() - t0)
        assert out.shape[0] == batch_size
    total = sum(latencies)
    n_texts = batch_size * len(latencies)
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 \
        else [latencies[0]] * 99
    return Result(mode, batch_size, len(latencies), q[49] * 1e3, q[94] * 1e3,
                  total / n_texts * 1e3, n_texts / total)


def cold_mode(embedder: MiniLMEmbedder) -> EmbedFn:
    return embedder.embed_sync


# name -> factory(embedder) -> batch function.
MODES: dict[str, Callable[[MiniLMEmbedder], EmbedFn]] = {"cold": cold_mode}


class Recording:
    """Wraps a text iterator and remembers what it handed out, to replay it."""

    def __init__(self, texts: Iterator[str]) -> None:
        self.texts, self.seen = texts, []

    def __iter__(self) -> "Recording":
        return self

    def __next__(self) -> str:
        text = next(self.texts)
        self.seen.append(text)
        return text


def grpc_embed_fn(stub, org: str, token: str, expect_cached: bool, flags: dict[str, int]) -> EmbedFn:
    from upsquad.context.v1 import context_pb2 as pb

    metadata = (("authorization", f"Bearer {token}"),)

    def fn(batch: list[str]) -> np.ndarray:
        response = stub.Embed(pb.EmbedRequest(scope=pb.ScopePath(org_id=org), texts=batch),
                              metadata=metadata, timeout=120)
        flags["cached"] += sum(v.cached for v in response.embeddings)
        flags["expected"] += len(batch) if expect_cached else 0
        flags["texts"] += len(batch)
        return np.asarray([v.values for v in response.embeddings], dtype=np.float32)

    return fn


def run_grpc(args, sizes: list[int]) -> tuple[dict[str, object], list[Result]]:
    """Embed RPC, cold then cached, per batch size."""
    import datetime as dt
    import pathlib
    import shutil
    import tempfile
    import uuid

    from entrypoints.embedded.process import disable_grpc_fork_handlers

    disable_grpc_fork_handlers()  # before gRPC initialises: this process starts a stack
    import grpc
    from report import load_average, machine
    from stack import Stack

    from context_engine.auth import ensure_dev_key, mint_token
    from upsquad.context.v1 import context_pb2_grpc

    stack = home = None
    if args.address:
        address = args.address
        if args.token:
            token = args.token
        else:
            key_path = pathlib.Path(args.data_dir) / "keys" / "jwt-hs256.key"
            if not key_path.exists():
                raise SystemExit(f"--address needs --token or the stack's --data-dir ({key_path} not found)")
            token = mint_token(ensure_dev_key(key_path), org=args.org, clearance=1, ttl=dt.timedelta(hours=2))
    else:
        home = pathlib.Path(tempfile.mkdtemp(prefix="context-engine-embed-"))
        stack = Stack(home)
    try:
        if stack is not None:
            stack.wait_serving()
            address, token = stack.address, stack.token(args.org)
        channel = grpc.insecure_channel(address)
        stub = context_pb2_grpc.ContextEngineStub(channel)
        run_id = uuid.uuid4().hex[:8]
        info: dict[str, object] = {"machine": machine(), "address": address, "org": args.org, "run_id": run_id,
                                   "started_stack": stack is not None, "load_before": load_average()}
        results: list[Result] = []
        for size in sizes:
            texts = Recording(text_stream(seed=size, tag=f"{run_id}-{size}-"))
            flags = {"cached": 0, "expected": 0, "texts": 0}
            cold = measure("grpc-cold", grpc_embed_fn(stub, args.org, token, False, flags), size, texts,
                           seconds=args.seconds, max_batches=args.max_batches, warmup=args.warmup)
            cold_flags = dict(flags)
            flags = {"cached": 0, "expected": 0, "texts": 0}
            cached = measure("grpc-cached", grpc_embed_fn(stub, args.org, token, True, flags), size,
                             iter(list(texts.seen)), seconds=float("inf"), max_batches=cold.batches,
                             warmup=args.warmup)
            for r, f in ((cold, cold_flags), (cached, flags)):
                results.append(r)
                print(f"{r.mode:<12}{r.batch_size:>6}{r.batches:>9}{r.p50_ms:>10.2f}{r.p95_ms:>10.2f}"
                      f"{r.ms_per_text:>9.2f}{r.texts_per_s:>9.1f}   cached {f['cached']}/{f['texts']}", flush=True)
                if f["cached"] != f["expected"]:
                    print(f"  !! {r.mode}: {f['cached']} vectors flagged cached, expected {f['expected']}")
        info["load_after"] = load_average()
        channel.close()
        return info, results
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,32,100", help="comma-separated batch sizes")
    p.add_argument("--modes", default="cold", help=f"comma-separated, of {sorted(MODES)}")
    p.add_argument("--seconds", type=float, default=14.0, help="time budget per (mode, size)")
    p.add_argument("--max-batches", type=int, default=300, help="cap on batches per size")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured batches per size")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--max-batch-size", type=int, default=32, help="embedder's internal batch (float32 products)")
    p.add_argument("--matmul", choices=MATMULS, default="int8",
                   help="how MiniLM computes its weight products (int8: if its self-check agrees on this CPU)")
    p.add_argument("--json", metavar="PATH", help="also write results as JSON")
    p.add_argument("--grpc", action="store_true", help="measure the Embed RPC, cold and cached")
    p.add_argument("--address", help="--grpc: a running stack's API (default: start one in a scratch dir)")
    p.add_argument("--data-dir", default=".context-engine", help="--grpc --address: the stack's data directory")
    p.add_argument("--token", help="--grpc --address: a token for --org (instead of --data-dir)")
    p.add_argument("--org", default="bench-embed", help="--grpc: org of the calls (the cache is per org)")
    args = p.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.grpc:
        header = f"{'mode':<12}{'batch':>6}{'batches':>9}{'p50 ms':>10}{'p95 ms':>10}{'ms/text':>9}{'texts/s':>9}"
        print(header)
        print("-" * len(header))
        info, results = run_grpc(args, sizes)
        for k, v in info.items():
            print(f"{k:>14}: {v}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "results": [asdict(r) for r in results]}, f, indent=2)
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; available: {sorted(MODES)}")

    t0 = time.perf_counter()
    embedder = MiniLMEmbedder(intra_op_threads=args.threads, max_batch_size=args.max_batch_size, matmul=args.matmul)
    load_s = time.perf_counter() - t0
    info = machine_info(embedder)
    info["model_load_s"] = round(load_s, 3)
    for k, v in info.items():
        print(f"{k:>18}: {v}")
    print()

    texts = text_stream()
    results: list[Result] = []
    header = f"{'mode':<7}{'batch':>6}{'batches':>9}{'p50 ms':>10}{'p95 ms':>10}" \
             f"{'ms/text':>9}{'texts/s':>9}"
    print(header)
    print("-" * len(header))
    for mode in modes:
        fn = MODES[mode](embedder)
        for size in sizes:
            r = measure(mode, fn, size, texts, seconds=args.seconds,
                        max_batches=args.max_batches, warmup=args.warmup)
            results.append(r)
            print(f"{r.mode:<7}{r.batch_size:>6}{r.batches:>9}{r.p50_ms:>10.2f}"
                  f"{r.p95_ms:>10.2f}{r.ms_per_text:>9.2f}{r.texts_per_s:>9.1f}", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
