"""Search under load over 100,000 chunks in one org: open loop, closed loop, time per stage.

Corpus: chunk i is built from the LoCoMo dialog turns (../shared/benchmarks/locomo, 5,882 turns):
the turn i mod 5,882 ("speaker: text") followed by one sentence of another turn drawn at random
(seeded), redrawn until the text is new, so every chunk is distinct (no embedding is saved by
content dedup) and reads like a chat turn of the same length and vocabulary (~40 cl100k tokens).
The first 5,882 chunks (i < 5,882) are the turns unchanged. Chunk i is one IngestEvent (event type
"message", metadata {"seq": i}) in session i mod --sessions of org "bench-search"; 32 calls in
flight, an idempotency key per chunk.

Then the script waits until the embedding pipeline has given every chunk a vector (progress bar),
runs ANALYZE, waits until the stack is idle, and measures (queries: the 1,986 LoCoMo questions,
shuffled, cycled; Search with top_k 10 and the server's default floor unless told otherwise):
  (a) open loop: --rate queries/s offered for --open-seconds (Poisson arrivals; --arrivals fixed
      for a fixed interval); latency counted from the scheduled arrival (no coordinated omission);
  (b) closed loop: 1 / 4 / 16 clients calling back to back for --closed-seconds each;
  (c) time per stage, as the API itself measures it (its Prometheus histograms,
      context_engine/metrics.py, read before and after): for --stage-queries Search calls one at
      a time on the idle stack, and for each load phase (so queueing shows as waiting stages).

    .venv/bin/python bench/search.py                                      # 100,000 chunks
    .venv/bin/python bench/search.py --chunks 5000 --open-seconds 20 --closed-seconds 5
    .venv/bin/python bench/search.py --home /tmp/ce-search-100k --keep    # load once ...
    .venv/bin/python bench/search.py --home /tmp/ce-search-100k --keep --api-processes 2   # ... measure again

With --home the stack runs on that data directory and restarts on it next time (chunks already
there are not ingested again); the directory is removed at the end only when this run created it
and --keep is absent. Chunks are loaded in segments of --restart-every with a stack restart
between them: the bundled broker's fetches cost more with every batch it holds
(bench/broker_batches.py), and a restart restores its log in large batches.

With --grants N (bench/grants.py) the searcher is the team bench-search/sales/apac at clearance 1
(it sees the org's chunks by ancestry), N more chunks are owned by sales/emea, and the load phases
run three times: without grants, with each of those chunks granted to a team in another pillar
(N live grants in the org, none held by the searcher), and with --held M of them (default N)
granted to sales/apac instead (read + use_in_assembly); the runs are printed side by side with
their throughput ratios.

    .venv/bin/python bench/search.py --chunks 5000 --grants 1000 --held 100 --open-seconds 20 --closed-seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import pathlib
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import asyncpg
import grpc  # noqa: E402
from grants import (
    add_grants_option,
    describe,
    fresh_queries,
    grant_runs,
    held_count,
    ingest_owned,
    live_grants,
    print_phases,
)
from grpc_load import RETRIES, call_with_retry, drive_closed_loop, drive_open_loop, measured, one_at_a_time, spread_stub
from locomo import LOCOMO_DIR, load_locomo
from options import add_load_options, stack_settings
from report import load_average, machine, percentile
from server_metrics import print_stage_tables
from stack import Stack, wait_for_vectors, wait_quiet
from tqdm import tqdm

from inference.tokens import count_tokens
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

ORG = "bench-search"
GRANTEE = ("sales", "apac")  # --grants: the searcher, a team beside the grants' owner (bench/grants.py)


# -- corpus ------------------------------------------------------------------------------------

def make_corpus(n: int, seed: int = 11) -> list[str]:
    turns = [text for c in load_locomo(LOCOMO_DIR) for _, text in c.turns]
    sentences = [s for t in turns for s in re.split(r"(?<=[.!?])\s+", t.split(": ", 1)[1]) if len(s) > 12]
    rng = random.Random(seed)
    seen: set[str] = set()
    corpus = []
    for i in range(n):
        text = turns[i % len(turns)]
        while text in seen:
            text = f"{turns[i % len(turns)]} {rng.choice(sentences)}"
        seen.add(text)
        corpus.append(text)
    return corpus


def questions(seed: int = 5) -> list[str]:
    qs = [q.text for c in load_locomo(LOCOMO_DIR) for q in c.questions]
    random.Random(seed).shuffle(qs)
    return qs


# -- load ----------------------------------------------------------------------------------------




async def present_seqs(database_url: str) -> set[int]:
    """The chunk numbers already in the org (bench/assemble.py uses this too)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT DISTINCT metadata->>'seq' AS seq FROM chunks WHERE org_id = $1", ORG)
        return {int(r["seq"]) for r in rows if r["seq"] is not None}
    finally:
        await conn.close()


async def embedded_count(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM chunks WHERE org_id = $1 AND embedding IS NOT NULL", ORG)
    finally:
        await conn.close()


async def ingest(stack: Stack, corpus: list[str], todo: list[int], sessions: int, concurrency: int) -> float:
    token = stack.token(ORG)
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        bar = tqdm(total=len(todo), desc="IngestEvent", unit="chunk", file=sys.stderr, smoothing=0.05)
        queue = iter(todo)

        async def client() -> None:
            for i in queue:
                request = pb.IngestEventRequest(scope=pb.ScopePath(org_id=ORG), session_id=f"s{i % sessions:04d}",
                                                event_type="message", content=corpus[i].encode(),
                                                metadata={"seq": str(i)})
                await call_with_retry(stub.IngestEvent, request,
                                      (("authorization", f"Bearer {token}"), ("idempotency-key", f"{ORG}/{i}")))
                bar.update()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        bar.close()
        return time.perf_counter() - started


# -- load tests ------------------------------------------------------------------------------------

@dataclass
class Phase:
    name: str
    offered: float | None  # queries/s offered (open loop)
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, successful calls
    errors: collections.Counter = field(default_factory=collections.Counter)
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    span: float = 0.0  # first arrival to last completion
    stages: list[str] = field(default_factory=list)  # the API's stage table for this phase
    via_grants: int = 0  # results that are granted chunks (--grants)

    @property
    def achieved(self) -> float:
        return len(self.latencies) / self.span if self.span else float("nan")

    def line(self) -> str:
        ms = [x * 1000 for x in self.latencies]
        offered = f"offered {self.offered:.0f}/s, " if self.offered else ""
        errors = f", errors {dict(self.errors)}" if self.errors else ""
        return (f"{self.name:<28}{offered}achieved {self.achieved:6.1f} q/s  p50 {percentile(ms, 50):7.1f}  "
                f"p95 {percentile(ms, 95):7.1f}  p99 {percentile(ms, 99):7.1f} ms  ({len(ms):,} ok{errors})")


def searcher_scope(args) -> dict[str, str]:
    """The org, or with --grants the team GRANTEE (clearance 1 either way)."""
    return {"org_id": ORG} | ({"pillar_id": GRANTEE[0], "team_id": GRANTEE[1]} if args.grants else {})


def searcher_token(stack: Stack, scope: dict[str, str]) -> str:
    return stack.token(ORG, pillar=scope.get("pillar_id", ""), team=scope.get("team_id", ""))


class Searcher:
    def __init__(self, stub, token: str, qs: list[str], top_k: int, min_score: float, timeout: float,
                 scope: dict[str, str], granted: frozenset[str] = frozenset()) -> None:
        self.stub, self.metadata = stub, (("authorization", f"Bearer {token}"),)
        self.qs, self.n = qs, 0
        self.top_k, self.min_score, self.timeout = top_k, min_score, timeout
        self.scope, self.granted = pb.ScopePath(**scope), granted

    def next_request(self) -> pb.SearchRequest:
        q = self.qs[self.n % len(self.qs)]
        self.n += 1
        return pb.SearchRequest(scope=self.scope, query=q, top_k=self.top_k, min_score=self.min_score)

    async def call(self, phase: Phase, request: pb.SearchRequest, since: float) -> float:
        """One Search; records latency from `since` (loop time). Returns completion time."""
        loop = asyncio.get_running_loop()
        try:
            response = await self.stub.Search(request, metadata=self.metadata, timeout=self.timeout)
            phase.latencies.append(loop.time() - since)
            phase.outcomes[pb.RetrievalOutcome.Name(response.outcome).removeprefix("RETRIEVAL_OUTCOME_")] += 1
            phase.via_grants += sum(r.chunk_id in self.granted for r in response.results)
        except grpc.aio.AioRpcError as exc:
            phase.errors[exc.code().name] += 1
        return loop.time()


async def open_loop(s: Searcher, rate: float, seconds: float, arrivals: str, seed: int = 3) -> Phase:
    phase = Phase(f"open loop ({arrivals})", rate, seconds)
    return await drive_open_loop(phase, lambda since: s.call(phase, s.next_request(), since), rate, seconds,
                                 poisson=arrivals == "poisson", seed=seed)


async def closed_loop(s: Searcher, clients: int, seconds: float) -> Phase:
    phase = Phase(f"closed loop, {clients:>2} client{'s' if clients > 1 else ''}", None, seconds)
    return await drive_closed_loop(phase, lambda since: s.call(phase, s.next_request(), since), clients, seconds)


async def load_tests(stack: Stack, qs: list[str], args, granted: frozenset[str] = frozenset()) -> list[Phase]:
    scope = searcher_scope(args)
    token = searcher_token(stack, scope)
    async with spread_stub(stack, args.connections, token, scope) as stub:
        s = Searcher(stub, token, qs, args.top_k, args.min_score, args.timeout, scope, granted)
        warm = Phase("warm-up", None, 0)
        for _ in range(20):
            await s.call(warm, s.next_request(), asyncio.get_running_loop().time())
        phases = []
        print(f"open loop: {args.rate:g} q/s for {args.open_seconds:g} s ...", file=sys.stderr, flush=True)
        phases.append(await measured(stack, open_loop(s, args.rate, args.open_seconds, args.arrivals),
                                     ("search",), SEARCH_METHOD))
        for clients in args.clients:
            await asyncio.sleep(2)
            print(f"closed loop: {clients} clients for {args.closed_seconds:g} s ...", file=sys.stderr, flush=True)
            phases.append(await measured(stack, closed_loop(s, clients, args.closed_seconds), ("search",),
                                         SEARCH_METHOD))
        return phases


# -- time per stage ------------------------------------------------------------------------------

SEARCH_METHOD = "/upsquad.context.v1.ContextEngine/Search"


async def stage_timings(stack: Stack, qs: list[str], n: int, args) -> Phase:
    """`n` Search calls one at a time through gRPC; each stage's time as the API measured it
    (its Prometheus histograms, context_engine/metrics.py), read before and after."""
    async with grpc.aio.insecure_channel(stack.address) as channel:
        scope = searcher_scope(args)
        s = Searcher(context_pb2_grpc.ContextEngineStub(channel), searcher_token(stack, scope), qs[::-1], args.top_k,
                     args.min_score, args.timeout, scope)
        return await one_at_a_time(stack, Phase("one at a time", None, 0), s, n, ("search",), SEARCH_METHOD)


# -- main ------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser, clients=[1, 4, 16], unit="queries")
    parser.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--min-score", type=float, default=0.0, help="0 = the server's default floor")
    parser.add_argument("--stage-queries", type=int, default=300)
    parser.add_argument("--restart-every", type=int, default=25_000,
                        help="restart the stack after this many ingested chunks (the bundled broker slows as it fills)")
    add_grants_option(parser)
    args = parser.parse_args()
    caller_holds = held_count(args)  # --grants: how many of them the caller holds in the third run
    fresh_queries(args)

    corpus = make_corpus(args.chunks + args.grants)  # the texts after the first --chunks: the granted chunks'
    owned_texts, corpus = corpus[args.chunks:], corpus[:args.chunks]
    qs = questions()
    created = args.home is None or not args.home.exists()
    home = args.home or pathlib.Path(tempfile.mkdtemp(prefix="context-engine-search-"))
    stack = Stack(home, api_processes=args.api_processes, settings=stack_settings(args))
    report: dict[str, object] = {}
    try:
        stack.wait_serving()
        database_url = stack.endpoints()["database_url"]
        # A restart restores the log from the archive and the worker re-projects it (and embeds any
        # backlog a stopped run left): wait for that before adding load.
        quiet_s = wait_quiet(stack, timeout=4 * 3600)
        if args.grants and (held := asyncio.run(live_grants(database_url, ORG))):
            raise SystemExit(f"{home} already holds {held:,} live grants: --grants needs a data directory without")
        present = asyncio.run(present_seqs(database_url))
        embedded_before = asyncio.run(embedded_count(database_url))
        todo = [i for i in range(args.chunks) if i not in present]
        print(f"data directory {home}: {len(present):,} chunks present ({embedded_before:,} embedded), "
              f"{len(todo):,} to ingest (stack quiet after {quiet_s:.0f} s)", file=sys.stderr, flush=True)
        # The bundled broker's fetches cost more with every record batch it holds (bench/broker_batches.py):
        # past a few tens of thousands, ingestion and embedding crawl. A restart restores the log from
        # the archive in large batches, so the load goes in segments with a restart between them.
        ingest_s = embed_tail_s = 0.0
        segments = [todo[i:i + args.restart_every] for i in range(0, len(todo), args.restart_every)]
        for n, segment in enumerate(segments):
            if n:
                stack.stop()
                stack = Stack(home, api_processes=args.api_processes, settings=stack_settings(args))
                stack.wait_serving()
                database_url = stack.endpoints()["database_url"]
                wait_quiet(stack, timeout=4 * 3600)
            ingest_s += asyncio.run(ingest(stack, corpus, segment, args.sessions, args.ingest_concurrency))
            chunks, waited = wait_for_vectors(database_url, [ORG], len(present) + sum(map(len, segments[:n + 1])),
                                              poll=2.0, smoothing=0.05)
            embed_tail_s += waited
        if not segments:
            chunks = embedded_before
        load_s = ingest_s + embed_tail_s
        if args.grants:
            report["owned_ingest_s"] = asyncio.run(ingest_owned(stack, ORG, owned_texts, args.ingest_concurrency))
            chunks = wait_for_vectors(database_url, [ORG], chunks + args.grants, poll=2.0)[0] - args.grants

        async def analyze() -> None:
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute("ANALYZE chunks; ANALYZE chunk_terms")
                report["postgres"] = await conn.fetchval("SHOW server_version")
                report["relation_mb"] = {r["name"]: round(r["bytes"] / 2**20) for r in await conn.fetch(
                    "SELECT relname AS name, pg_total_relation_size(oid) AS bytes FROM pg_class "
                    "WHERE relname IN ('chunks', 'chunk_terms', 'chunks_embedding_384')")}
            finally:
                await conn.close()

        asyncio.run(analyze())
        wait_quiet(stack)
        report["load_before"] = load_average()
        phases = asyncio.run(load_tests(stack, qs, args))
        elsewhere: list[Phase] = []
        with_grants: list[Phase] = []
        if args.grants:
            def run(granted: frozenset[str]) -> list[Phase]:
                return asyncio.run(load_tests(stack, qs, args, granted))

            elsewhere, with_grants, _ = grant_runs(stack, database_url, ORG, GRANTEE, args.grants, caller_holds,
                                                   run, wait_quiet, report)
        report["load_after"] = load_average()
        wait_quiet(stack)
        sequential = asyncio.run(stage_timings(stack, qs, args.stage_queries, args))
    finally:
        stack.stop()
        if created and not args.keep:
            shutil.rmtree(home, ignore_errors=True)

    tokens = [count_tokens(corpus[i], "gpt-4") for i in range(0, len(corpus), max(1, len(corpus) // 5000))]
    print()
    print(f"machine: {machine()}; {report['load_before']} before the load phases, "
          f"{report['load_after']} after")
    print(f"settings: {chunks:,} chunks in org {ORG!r} ({args.sessions} sessions; LoCoMo turns recombined, "
          f"mean {statistics.fmean(tokens):.0f} cl100k tokens), PostgreSQL {report.get('postgres')} + pgvector "
          f"(HNSW m 16, ef_construction 64, ef_search 64), tansu, MiniLM-L6 int8; sizes MB {report.get('relation_mb')}")
    if todo:
        print(f"load: {len(todo):,} IngestEvent calls ({args.ingest_concurrency} in flight) in {len(segments)} "
              f"segment(s) of at most {args.restart_every:,} with a stack restart between them, {ingest_s:.0f} s "
              f"of calls ({len(todo) / ingest_s:,.0f}/s); embedding tails {embed_tail_s:.0f} s in all "
              f"({chunks - embedded_before:,} vectors in {load_s:.0f} s of loading, restarts excluded: "
              f"{(chunks - embedded_before) / load_s:,.0f} chunks/s end to end); "
              f"IngestEvent retries {dict(RETRIES) or 'none'}")
    print(f"Search: top_k {args.top_k}, min_score {args.min_score or 'server default'}, queries = the "
          f"{len(qs):,} LoCoMo questions shuffled; client in the same machine (one process, grpc.aio, calls "
          f"spread over {args.connections} connections); {args.api_processes} API process(es)"
          + "".join(f", {k}={v}" for k, v in stack_settings(args).items()))
    if args.grants:
        print(describe(ORG, f"{ORG}/{'/'.join(GRANTEE)} (clearance 1)", args.grants, caller_holds, report))
    print()
    print_phases(phases, elsewhere, with_grants, args.grants, caller_holds, "results")
    outcomes = collections.Counter()
    for phase in phases + elsewhere + with_grants:
        outcomes.update(phase.outcomes)
    print(f"outcomes over the load phases: {dict(outcomes)}")
    print()
    if with_grants:
        print("-- without grants --")
        print_stage_tables(phases)
        print(f"-- with {args.grants:,} live grants, {caller_holds:,} held by the caller --")
    print_stage_tables([sequential, *(with_grants or phases)])

    if args.json:
        def numbers(p: Phase) -> dict[str, object]:
            return {"name": p.name, "offered": p.offered, "achieved": p.achieved,
                    "p50_ms": percentile(p.latencies, 50) * 1000, "p95_ms": percentile(p.latencies, 95) * 1000,
                    "p99_ms": percentile(p.latencies, 99) * 1000, "ok": len(p.latencies),
                    "errors": dict(p.errors), "outcomes": dict(p.outcomes)}

        grants = {"phases_grants_elsewhere": [numbers(p) for p in elsewhere],
                  "phases_with_grants": [numbers(p) | {"via_grants": p.via_grants} for p in with_grants]} \
            if with_grants else {}
        args.json.write_text(json.dumps({
            "machine": machine(), "chunks": chunks, "settings": vars(args) | {"home": str(home), "json": None},
            "phases": [numbers(p) for p in phases],
            "stages": {p.name: p.stages for p in [sequential, *phases]}, "report": report} | grants,
            indent=2, default=str))


if __name__ == "__main__":
    main()
