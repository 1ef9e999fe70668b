"""What the benchmarks under bench/ share: a real stack in a scratch directory, the machine line,
percentiles, tokens, waiting for the embedding pipeline and for an idle stack, and LoCoMo.

`Stack` runs `context-engine up` exactly as a user does (embedded PostgreSQL + tansu + worker +
API + detector as separate processes) on free ports, in a data directory the caller chooses; a
second Stack on the same directory keeps the data (the broker is restored from the archive).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import itertools
import json
import os
import pathlib
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import random
from collections.abc import Awaitable

from context_engine.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # the bench scripts are entry points: before gRPC initialises
import grpc  # noqa: E402
from tqdm import tqdm
from upsquad.context.v1 import context_pb2_grpc

from context_engine.auth import ensure_dev_key, mint_token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int) -> int:
    """A port p with p .. p + n - 1 all free."""
    for _ in range(100):
        first = free_port()
        try:
            with contextlib.ExitStack() as held:
                for port in range(first + 1, first + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


def machine() -> str:
    cpu = "unknown cpu"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def load_average() -> str:
    """The 1/5/15-minute load averages: the machine is shared, so say how busy it was."""
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Stack:
    """`context-engine up --data-dir home` on free ports; `stop()` sends SIGTERM and waits.
    `api_processes` API processes share the gRPC port; process i serves /metrics on
    metrics_port + i (`ServerMetrics` reads them all)."""

    def __init__(self, home: pathlib.Path, *, api_processes: int = 1,
                 settings: dict[str, str] | None = None) -> None:
        self.home = home
        self.api_port, self.detector_port = free_port(), free_port()
        self.metrics_port = free_port_run(api_processes)
        self.api_processes = api_processes
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
        env["CONTEXT_ENGINE_LOG_LEVEL"] = "WARNING"
        env.update(settings or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "context_engine", "up", "--data-dir", str(home),
             "--api-port", str(self.api_port), "--detector-port", str(self.detector_port),
             "--api-processes", str(api_processes), "--metrics-port", str(self.metrics_port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.output: collections.deque[str] = collections.deque(maxlen=50)  # last lines of `up`
        self.postgres_pid: int | None = None

    def metrics(self) -> "ServerMetrics":
        return ServerMetrics([self.metrics_port + i for i in range(self.api_processes)])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    def wait_serving(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            if match := re.search(r"PostgreSQL \(embedded, pid (\d+)\)", line):
                self.postgres_pid = int(match[1])
            if "SERVING after" in line:
                # Keep reading what `up` prints so a full pipe can never block it.
                threading.Thread(target=self._drain, daemon=True).start()
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError("stack did not start:\n" + "\n".join(self.output))

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def endpoints(self) -> dict[str, str]:
        return json.loads((self.home / "run" / "stack.json").read_text())

    def token(self, org: str, *, pillar: str = "", team: str = "", agent: str = "", clearance: int = 1,
              ttl: dt.timedelta = dt.timedelta(hours=6)) -> str:
        key = ensure_dev_key(self.home / "keys" / "jwt-hs256.key")
        return mint_token(key, org=org, pillar=pillar, team=team, agent=agent, clearance=clearance, ttl=ttl)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def stack_pids(stack: Stack) -> list[int]:
    """`up` and everything under it, plus the embedded PostgreSQL server and its backends (pg_ctl
    detaches the postmaster, so it is not under `up`)."""
    roots = [stack.proc.pid] + ([stack.postgres_pid] if stack.postgres_pid else [])
    tree, seen, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo.extend(tree.get(pid, []))
    return seen


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def wait_quiet(stack: Stack, *, below: float = 0.5, window: float = 5.0, timeout: float = 900.0) -> float:
    """Wait until the whole stack uses less than `below` of one core over `window` seconds (after a
    restart the API restores the log from the archive and the worker re-projects it; after a load
    the embedding pipeline and autovacuum run on). An idle stack is not at 0: the worker and tansu
    poll each other every few ms (measured ~0.2-0.25 of a core together). Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        pids = stack_pids(stack)
        before = _cpu_seconds(pids)
        time.sleep(window)
        if (_cpu_seconds(pids) - before) / window < below:
            return time.monotonic() - started
    raise TimeoutError(f"the stack was still busy after {timeout:.0f} s")


async def wait_embedded(database_url: str, orgs: list[str], expected_chunks: int | None = None, *,
                        progress: Callable[[int, int], None] | None = None, poll: float = 1.0,
                        timeout: float = 6 * 3600) -> tuple[int, int]:
    """Poll PostgreSQL (admin URL) until every chunk of these orgs has a vector (and, when given,
    at least `expected_chunks` chunks exist). `progress(embedded, total)` after each poll.
    Returns (chunks, embedded)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            row = await conn.fetchrow(
                "SELECT count(*) AS total, count(*) FILTER (WHERE embedding IS NOT NULL) AS embedded "
                "FROM chunks WHERE org_id = ANY($1::text[])", orgs)
            total, embedded = row["total"], row["embedded"]
            if progress is not None:
                progress(embedded, total)
            if embedded == total and (expected_chunks is None or total >= expected_chunks):
                return total, embedded
            if time.monotonic() > deadline:
                raise TimeoutError(f"{embedded} of {total} chunks embedded after {timeout:.0f} s")
            await asyncio.sleep(poll)
    finally:
        await conn.close()


# -- LoCoMo ---------------------------------------------------------------------------------------

LOCOMO_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "locomo"
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised dia_ids ("D8:6"), de-duplicated, in order


@dataclass(frozen=True)
class Conversation:
    name: str  # the file's stem ("26")
    turns: tuple[tuple[str, str], ...]  # (dia_id, "speaker: text") in dialogue order
    questions: tuple[Question, ...]  # every question of the file, all categories


def normalise_evidence(entries: list[str]) -> tuple[str, ...]:
    """`"D8:6; D9:17"`, `D:11:26`, `D30:05` -> D8:6, D9:17, D11:26, D30:5; a bare "D" -> nothing."""
    ids = [f"D{int(a)}:{int(b)}" for entry in entries for a, b in _EVIDENCE.findall(entry)]
    return tuple(dict.fromkeys(ids))


def load_locomo(directory: pathlib.Path = LOCOMO_DIR, limit: int | None = None) -> list[Conversation]:
    """The LoCoMo conversations: documents are dialog turns "speaker: text" (no image captions)."""
    conversations = []
    for path in sorted(directory.glob("*.json"), key=lambda p: p.stem)[:limit]:
        data = json.loads(path.read_text())
        sessions = sorted((k for k in data if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k[8:]))
        turns = tuple((t["dia_id"], f"{t['speaker']}: {t['text']}") for k in sessions for t in data[k])
        questions = tuple(Question(q["question"], int(q["category"]), normalise_evidence(q.get("evidence") or []))
                          for q in data["qa"])
        conversations.append(Conversation(path.stem, turns, questions))
    return conversations


# -- calls under load -----------------------------------------------------------------------------

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


def wait_for_vectors(database_url: str, orgs: list[str], expected_chunks: int | None, *, poll: float = 1.0,
                     **bar_options) -> tuple[int, float]:
    """`wait_embedded` with a progress bar: (chunks, seconds waited)."""
    bar = tqdm(desc="embedded", unit="chunk", file=sys.stderr, **bar_options)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    started = time.perf_counter()
    try:
        chunks, _ = asyncio.run(wait_embedded(database_url, orgs, expected_chunks, progress=progress, poll=poll))
    finally:
        bar.close()
    return chunks, time.perf_counter() - started


# -- the API's own stage timings (context_engine/metrics.py) --------------------------------------

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


def print_stage_tables(phases) -> None:
    for phase in phases:
        if phase.stages:
            print(f"time per stage, {phase.name} ({len(phase.latencies):,} calls; client-side "
                  f"p50 {percentile(phase.latencies, 50) * 1000:.1f} ms)")
            print("\n".join(phase.stages))
            print()


# -- command-line options the benches share --------------------------------------------------------

def client_counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_load_options(parser, *, clients: list[int], unit: str) -> None:
    """bench/search.py's and bench/assemble.py's corpus, stack and load-phase options."""
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--ingest-concurrency", type=int, default=32)
    parser.add_argument("--home", type=pathlib.Path, default=None, help="data directory (reused when it exists)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory at the end")
    parser.add_argument("--api-processes", type=int, default=1, help="API processes sharing the port")
    parser.add_argument("--connections", type=int, default=8,
                        help="client connections the calls are spread over (one lands on one API process)")
    parser.add_argument("--rate", type=float, default=50.0, help=f"open loop: {unit}/s offered")
    parser.add_argument("--open-seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=client_counts, default=clients,
                        help="closed loop client counts, comma-separated")
    parser.add_argument("--closed-seconds", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    add_setting_option(parser)


def add_setting_option(parser) -> None:
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a CONTEXT_ENGINE_* setting for the stack, e.g. QUERY_VECTORS_REMEMBERED=0 (repeatable)")


def stack_settings(args) -> dict[str, str]:
    """--setting NAME=VALUE options as the stack's environment (CONTEXT_ENGINE_ prefix optional)."""
    if bad := [s for s in args.setting if "=" not in s]:
        raise SystemExit(f"--setting takes NAME=VALUE, got {bad[0]!r}")
    return dict(("CONTEXT_ENGINE_" + name.removeprefix("CONTEXT_ENGINE_").upper(), value)
                for name, value in (s.split("=", 1) for s in args.setting))


def add_locomo_options(parser) -> None:
    """bench/locomo_search.py's and bench/locomo_assembly.py's data and stack options."""
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N",
                        help="only the first N conversations (files in name order)")
    parser.add_argument("--locomo-dir", type=pathlib.Path, default=LOCOMO_DIR)
    parser.add_argument("--home", type=pathlib.Path, default=None,
                        help="data directory for the stack (default: a scratch directory, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="do not remove the data directory")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the numbers as JSON")


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
