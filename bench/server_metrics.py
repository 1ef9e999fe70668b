"""What the API measured during a bench phase, read from the /metrics of every API process
(context_engine/metrics.py): the stage histograms and the per-process call counts, and the
tables printed from them."""

from __future__ import annotations

import collections
import urllib.request
from dataclasses import dataclass, field

from report import percentile

PER_PROCESS_CALLS = "bench_calls_per_api_process"


class ServerMetrics:
    """The Prometheus histograms of every API process, summed: `snapshot()` before and after a
    phase, then `stages()` / `rpc()` give what the server measured in between."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    def snapshot(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        from prometheus_client.parser import text_string_to_metric_families

        values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = collections.Counter()
        for index, port in enumerate(self.ports):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    values[(sample.name, tuple(sorted(sample.labels.items())))] += sample.value
                    if sample.name == "context_engine_rpc_seconds_count":  # and per process
                        values[(PER_PROCESS_CALLS, (("method", sample.labels["method"]), ("process", str(index))))] \
                            += sample.value
        return values

    def calls_per_process(self, before, after, method: str) -> list[float]:
        return [after.get(key := (PER_PROCESS_CALLS, (("method", method), ("process", str(i)))), 0.0)
                - before.get(key, 0.0) for i in range(len(self.ports))]

    @staticmethod
    def histograms(before, after, metric: str, **match: str) -> dict[tuple[tuple[str, str], ...], "Histogram"]:
        """Per label set (without `le`) of `metric` matching `match`: the observations between
        the two snapshots."""
        out: dict[tuple[tuple[str, str], ...], Histogram] = {}
        for (name, labels), value in after.items():
            if not name.startswith(metric + "_"):
                continue
            label_map = dict(labels)
            if any(label_map.get(k) != v for k, v in match.items()):
                continue
            delta = value - before.get((name, labels), 0.0)
            le = label_map.pop("le", None)
            key = tuple(sorted(label_map.items()))
            h = out.setdefault(key, Histogram())
            if name.endswith("_count"):
                h.count = delta
            elif name.endswith("_sum"):
                h.total = delta
            elif le is not None:
                h.buckets.append((float(le), delta))
        return {k: h for k, h in out.items() if h.count}


@dataclass
class Histogram:
    count: float = 0.0
    total: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (upper bound, cumulative)

    @property
    def mean_ms(self) -> float:
        return self.total / self.count * 1000 if self.count else float("nan")

    def quantile_ms(self, q: float) -> float:
        """Linear interpolation inside the bucket holding the q-th observation (as PromQL's
        histogram_quantile)."""
        rank, lower, below = q * self.count, 0.0, 0.0
        for upper, cumulative in sorted(self.buckets):
            if cumulative >= rank:
                if upper == float("inf"):
                    return lower * 1000
                inside = cumulative - below
                return (lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)) * 1000
            lower, below = upper, cumulative
        return float("nan")


def stage_table(metrics: ServerMetrics, before, after, operations: tuple[str, ...], rpc_method: str) -> list[str]:
    """Lines: each stage of each of `operations` as the API timed it (calls, mean, p50, p95 from
    the histogram buckets, share of the RPC's total time), then the RPC itself."""
    rpc = metrics.histograms(before, after, "context_engine_rpc_seconds", method=rpc_method, code="OK")
    rpc_h = next(iter(rpc.values()), Histogram())
    stages = {labels: h for operation in operations for labels, h in
              metrics.histograms(before, after, "context_engine_stage_seconds", operation=operation).items()}
    lines = [f"{'stage (server-side wall time)':<36}{'calls':>8}{'mean ms':>9}{'p50 ms':>9}{'p95 ms':>9}{'share':>8}"]
    for labels, h in sorted(stages.items(), key=lambda kv: -kv[1].total):
        share = h.total / rpc_h.total if rpc_h.total else float("nan")
        name = f"{dict(labels)['operation']}: {dict(labels)['stage']}"
        lines.append(f"{name:<36}{h.count:>8.0f}{h.mean_ms:>9.2f}{h.quantile_ms(.5):>9.2f}"
                     f"{h.quantile_ms(.95):>9.2f}{share:>8.0%}")
    lines.append(f"{'whole RPC handler':<36}{rpc_h.count:>8.0f}{rpc_h.mean_ms:>9.2f}{rpc_h.quantile_ms(.5):>9.2f}"
                 f"{rpc_h.quantile_ms(.95):>9.2f}")
    def counted(metric: str, label: str, value: str) -> float:
        key = (metric, ((label, value),))
        return after.get(key, 0.0) - before.get(key, 0.0)

    first, broadened = (counted("context_engine_retrieval_passes_total", "pass", p) for p in ("first", "broadened"))
    lines.append(f"retrieval passes: {first:.0f} first, {broadened:.0f} broadened by the confidence gate")
    computed, remembered, shared = (counted("context_engine_query_vectors_total", "source", s)
                                    for s in ("computed", "remembered", "shared"))
    lines.append(f"query vectors: {computed:.0f} computed by the model, {remembered:.0f} remembered "
                 f"(same org and text as an earlier call in the same API process), {shared:.0f} shared "
                 f"with a run under way")
    if len(metrics.ports) > 1:
        calls = metrics.calls_per_process(before, after, rpc_method)
        lines.append("calls per API process: " + " / ".join(f"{c:.0f}" for c in calls))
    return lines


def print_stage_tables(phases) -> None:
    for phase in phases:
        if phase.stages:
            print(f"time per stage, {phase.name} ({len(phase.latencies):,} calls; client-side "
                  f"p50 {percentile(phase.latencies, 50) * 1000:.1f} ms)")
            print("\n".join(phase.stages))
            print()
