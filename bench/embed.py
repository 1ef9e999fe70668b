"""Embedding throughput of the local MiniLM embedder.

    .venv/bin/python bench/embed.py                      # batch sizes 1, 32, 100; ~45 s
    .venv/bin/python bench/embed.py --sizes 1,8,32 --seconds 5 --threads 1 --json out.json

Every batch is made of texts never embedded before in the run ("cold": the model computes
each one). Modes are pluggable: a mode turns the embedder into a ``batch -> vectors``
callable, so a "cached" mode (embedding cache in PostgreSQL in front of the model) can be
added to MODES and reported in the same table.
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

from context_engine.inference.embedder import MiniLMEmbedder

EmbedFn = Callable[[list[str]], np.ndarray]

_WORDS = (
    "agent memory context session user assistant tool output request response budget token "
    "cache vector search summary policy guardrail scope project tenant event stream snapshot "
    "database query index latency throughput model prompt message workflow step result error "
    "retry deploy release customer invoice payment order shipment report quarter revenue team "
    "meeting schedule calendar document review approve reject update delete create the a of to "
    "and in for on with is was be are this that it from by at as an or not but can will should"
).split()


def text_stream(seed: int = 7) -> Iterator[str]:
    """Endless unique, chat-message-like texts of 8-60 words."""
    rng = random.Random(seed)
    n = 0
    while True:
        words = rng.choices(_WORDS, k=rng.randint(8, 60))
        n += 1
        yield f"[{n}] " + " ".join(words).capitalize() + "."


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


# name -> factory(embedder) -> batch function. "cached" goes here once the cache exists.
MODES: dict[str, Callable[[MiniLMEmbedder], EmbedFn]] = {"cold": cold_mode}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,32,100", help="comma-separated batch sizes")
    p.add_argument("--modes", default="cold", help=f"comma-separated, of {sorted(MODES)}")
    p.add_argument("--seconds", type=float, default=14.0, help="time budget per (mode, size)")
    p.add_argument("--max-batches", type=int, default=300, help="cap on batches per size")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured batches per size")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--max-batch-size", type=int, default=32, help="embedder's internal batch")
    p.add_argument("--json", metavar="PATH", help="also write results as JSON")
    args = p.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; available: {sorted(MODES)}")

    t0 = time.perf_counter()
    embedder = MiniLMEmbedder(intra_op_threads=args.threads, max_batch_size=args.max_batch_size)
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
