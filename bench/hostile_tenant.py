"""Hostile tenant: does one org's worst-case writes slow or break another's?

Starts `context-engine up` in a scratch data directory, then runs three phases of `--seconds`
each, one after the other in one run:

- quiet: org B ingests small messages at `--rate` calls/s (open loop, Poisson arrivals);
- hostile: the same, while org A writes contents of exactly MAX_CONTENT_BYTES (1 MiB) as fast as
  `--attackers` closed-loop clients may, cycling through four kinds: no spaces, ordinary text,
  multi-byte text, NUL bytes. Every A content is new (each call rotates its kind's megabyte to
  another character boundary: no content hash, and no chunk boundary, repeats), so none of its
  chunking or embedding is saved by deduplication;
- after: org B alone again, while the stack works off what it admitted of org A's.

Reports org B's acknowledgement latency p50/p95/p99 and errors in each phase, org A's outcomes
by status code, and the CPU each process of the stack used in each phase.

    .venv/bin/python bench/hostile_tenant.py                   # 60 s per phase, B at 20/s, 2 attackers
    .venv/bin/python bench/hostile_tenant.py --seconds 20 --rate 10
    .venv/bin/python bench/hostile_tenant.py --honour-retry    # org A waits as RESOURCE_EXHAUSTED says
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import pathlib
import shutil
import string
import tempfile
import time

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import asyncpg
import grpc  # noqa: E402
import numpy as np
from grpc_load import drive_closed_loop, drive_open_loop
from ingest import worker_lines
from options import add_setting_option, stack_settings
from report import load_average, machine, percentile
from server_metrics import ServerMetrics
from stack import Stack, _cpu_seconds, free_port, stack_pids, wait_quiet

from entrypoints.serving.status import error_info
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

CONTENT_BYTES = 1024 * 1024
WORDS = ("the harbour keeper lit a lamp while seven boats waited for tide and the village slept "
         "under heavy rain until morning came over grey water").split()


_LETTERS = np.frombuffer((string.ascii_letters + string.digits).encode(), dtype=np.uint8)
_WORDS = np.array([w.encode() for w in WORDS], dtype=object)
_CJK = np.array(list("日本語の文章と漢字、äöüß€😀"), dtype=object)


def hostile_content(kind: str, n: int, rng: np.random.Generator) -> bytes:
    """`n` bytes of one kind, different on every call; made with numpy so that the load generator
    spends milliseconds, not the stack's cores, on a megabyte."""
    if kind == "no spaces":
        return _LETTERS[rng.integers(0, len(_LETTERS), n)].tobytes()
    if kind == "ordinary text":
        words = _WORDS[rng.integers(0, len(_WORDS), n // 4)]
        ends = rng.random(len(words)) < 0.08
        return b" ".join(w + b"." if e else w for w, e in zip(words, ends))[:n].ljust(n, b".")
    if kind == "multi-byte":
        return "".join(_CJK[rng.integers(0, len(_CJK), n // 3)]).encode()[:n].ljust(n, b".")
    if kind == "NUL bytes":
        return b"\x00".join(_WORDS[rng.integers(0, len(_WORDS), n // 4)])[:n].ljust(n, b"\x00")
    raise ValueError(kind)


KINDS = ("no spaces", "ordinary text", "multi-byte", "NUL bytes")
PHASES = ("quiet", "hostile", "after")  # org B alone, beside org A's flood, alone again


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name
        self.latencies_ms: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.span = 0.0


async def run(stack: Stack, worker: ServerMetrics, rate: float, seconds: float, attackers: int,
              honour_retry: bool) -> dict[str, object]:
    channel = grpc.aio.insecure_channel(stack.address, options=[("grpc.max_send_message_length", 16 << 20)])
    stub = context_pb2_grpc.ContextEngineStub(channel)
    victim = (("authorization", f"Bearer {stack.token('org-b')}"),)
    attacker = (("authorization", f"Bearer {stack.token('org-a')}"),)
    loop = asyncio.get_running_loop()
    counter = iter(range(10**9))

    async def warm_up() -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                await stub.IngestEvent(pb.IngestEventRequest(scope=pb.ScopePath(org_id="org-b"), session_id="warm",
                                                             event_type="message", content=b"warm"), metadata=victim)
                return
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise

    def victim_call(phase: Phase):
        async def issue(since: float) -> float:
            n = next(counter)
            request = pb.IngestEventRequest(scope=pb.ScopePath(org_id="org-b"), session_id=f"b-{n % 8}",
                                            event_type="message", content=f"small message {n} from org B".encode())
            try:
                await stub.IngestEvent(request, metadata=victim, timeout=60)
                phase.latencies_ms.append((loop.time() - since) * 1000)
            except grpc.aio.AioRpcError as exc:
                phase.errors[exc.code().name] += 1
            return loop.time()
        return issue

    outcomes: collections.Counter[str] = collections.Counter()
    attacker_ms: list[float] = []
    # Made before the phases: building a megabyte per call on this event loop would delay the
    # victim's calls as measured here. Each call rotates its kind's content to a new character
    # boundary, so no content (and no chunk boundary) repeats, for a memcpy.
    rng = np.random.default_rng(11)
    pool = {kind: hostile_content(kind, CONTENT_BYTES, rng) for kind in KINDS}
    starts = {kind: np.flatnonzero(np.frombuffer(c, dtype=np.uint8) & 0xC0 != 0x80) for kind, c in pool.items()}

    async def attacker_call(since: float) -> float:
        n = next(counter)
        kind = KINDS[n % len(KINDS)]
        base, cut = pool[kind], int(starts[kind][(n * 7919) % len(starts[kind])])
        request = pb.IngestEventRequest(scope=pb.ScopePath(org_id="org-a"), session_id=f"a-{n % 4}",
                                        event_type="tool_output", content=base[cut:] + base[:cut])
        started = loop.time()
        try:
            await stub.IngestEvent(request, metadata=attacker, timeout=120)
            outcomes[f"{kind}: OK"] += 1
            attacker_ms.append((loop.time() - started) * 1000)
        except grpc.aio.AioRpcError as exc:
            outcomes[f"{kind}: {exc.code().name}"] += 1
            if honour_retry and (info := error_info(exc)) is not None and "retry_after_seconds" in info.metadata:
                await asyncio.sleep(float(info.metadata["retry_after_seconds"]))
        return loop.time()

    await warm_up()
    cpu: dict[str, dict[str, float]] = {}
    worker_report: dict[str, list[str]] = {}
    phases = {name: Phase(name) for name in PHASES}
    began: dict[str, dt.datetime] = {}
    attack = Phase("attack")
    for name, phase in phases.items():
        before, metrics = {pid: _cpu_seconds([pid]) for pid in stack_pids(stack)}, worker.snapshot()
        began[name] = dt.datetime.now(dt.UTC)
        org_b = drive_open_loop(phase, victim_call(phase), rate, seconds)
        await (asyncio.gather(org_b, drive_closed_loop(attack, attacker_call, attackers, seconds))
               if name == "hostile" else org_b)
        # by the processes at the end: one the worker started during the phase counts from its start
        cpu[name] = {role: sum(_cpu_seconds([pid]) - before.get(pid, 0.0) for pid in pids) / max(phase.span, 1e-9)
                     for role, pids in process_roles(stack).items()}
        worker_report[name] = worker_lines(worker, metrics, worker.snapshot(), phase.span)
    await channel.close()
    lags = await projection_lags(stack.endpoints()["database_url"], "org-b", began)
    return {"lags": lags, **phases, "outcomes": outcomes, "attacker_ms": attacker_ms, "cpu": cpu,
            "worker": worker_report}


async def projection_lags(database_url: str, org: str, starts: dict[str, dt.datetime]) -> dict[str, list[float]]:
    """Per phase (by when its events occurred), org B's API-to-archive times."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT occurred_at, extract(epoch FROM archived_at - occurred_at) * 1000 AS ms "
                                "FROM event_archive WHERE org_id = $1 AND aggregate NOT LIKE '%/warm'", org)
    finally:
        await conn.close()
    lags: dict[str, list[float]] = {name: [] for name in starts}
    for r in rows:
        name = max((n for n, at in starts.items() if r["occurred_at"] >= at), key=starts.__getitem__, default=None)
        if name is not None:
            lags[name].append(r["ms"])
    return lags


def _background_role(pid: int) -> str:
    """A worker's background process by the name it gave itself (context_engine.concurrency)."""
    try:
        return open(f"/proc/{pid}/comm").read().strip().removeprefix("ce-")
    except OSError:
        return "background"


def process_roles(stack: Stack) -> dict[str, list[int]]:
    """The stack's processes by what they run: api, worker, the worker's background processes (by
    the names they give themselves: indexer), postgres, broker, other."""
    roles: dict[str, list[int]] = collections.defaultdict(list)
    for pid in stack_pids(stack):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = ("api" if " serve api" in cmd else "worker" if cmd.rstrip().endswith(" worker") else
                "detector" if " serve detector" in cmd else "broker" if "tansu" in cmd else
                "postgres" if "postgres" in cmd else
                _background_role(pid) if "multiprocessing" in cmd else "up")
        roles[role].append(pid)
    return dict(roles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    parser.add_argument("--rate", type=float, default=20.0, help="org B's calls/s")
    parser.add_argument("--attackers", type=int, default=2, help="org A's concurrent clients")
    parser.add_argument("--honour-retry", action="store_true",
                        help="org A waits retry_after_seconds after RESOURCE_EXHAUSTED (a heavy tenant, not a flood)")
    add_setting_option(parser)
    args = parser.parse_args()
    settings = stack_settings(args)
    home = pathlib.Path(tempfile.mkdtemp(prefix="context-engine-hostile-"))
    worker = ServerMetrics([free_port()])
    settings.setdefault("CONTEXT_ENGINE_WORKER_METRICS_PORT", str(worker.ports[0]))
    stack = Stack(home, settings=settings)
    try:
        stack.wait_serving()
        wait_quiet(stack)
        result = asyncio.run(run(stack, worker, args.rate, args.seconds, args.attackers, args.honour_retry))
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)

    print(f"machine: {machine()}; {load_average()} at the end")
    print(f"settings: org B {args.rate:g} IngestEvent/s (~30 B, Poisson) for {args.seconds:g} s per phase; "
          f"org A {args.attackers} closed-loop clients of {CONTENT_BYTES:,} B contents ({', '.join(KINDS)}), "
          f"{'waiting' if args.honour_retry else 'not waiting'} after RESOURCE_EXHAUSTED; "
          "embedded PostgreSQL 18 + tansu, 4 partitions, ack after archive+projection"
          + "".join(f", {k}={v}" for k, v in settings.items()))
    print(f"{'org B':<10}{'calls':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}  errors  "
          "CPU (cores) by process")
    for name in PHASES:
        phase: Phase = result[name]  # type: ignore[assignment]
        ms = phase.latencies_ms
        errors = ", ".join(f"{k} {v}" for k, v in sorted(phase.errors.items())) or "0"
        cpu = result["cpu"][name]  # type: ignore[index]
        print(f"{name:<10}{len(ms):>7}{percentile(ms, 50):>9.1f}{percentile(ms, 95):>9.1f}{percentile(ms, 99):>9.1f}"
              f"{max(ms, default=float('nan')):>9.1f}  {errors:<7} "
              + " ".join(f"{role} {v:.2f}" for role, v in sorted(cpu.items())) + f" = {sum(cpu.values()):.2f}")
    for name, ms in result["lags"].items():  # type: ignore[union-attr]
        print(f"{name}: org B API-to-archive ms p50 {percentile(ms, 50):.1f} p95 {percentile(ms, 95):.1f} "
              f"p99 {percentile(ms, 99):.1f}")
    quiet = percentile(result["quiet"].latencies_ms, 99)  # type: ignore[union-attr]
    for name, goal in (("hostile", 2.0), ("after", 1.2)):
        ratio = percentile(result[name].latencies_ms, 99) / quiet  # type: ignore[union-attr]
        print(f"org B p99 {name} / quiet: {ratio:.2f}x (goal <= {goal:g}x)")
    for name, lines in result["worker"].items():  # type: ignore[union-attr]
        for line in lines:
            print(f"{name}: {line}")
    attacker_ms = result["attacker_ms"]
    print("org A outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(result["outcomes"].items())))  # type: ignore[union-attr]
    if attacker_ms:
        print(f"org A ack ms: p50 {percentile(attacker_ms, 50):.0f}  p95 {percentile(attacker_ms, 95):.0f}  "  # type: ignore[arg-type]
              f"({len(attacker_ms) / args.seconds:.2f} MiB/s acknowledged)")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
