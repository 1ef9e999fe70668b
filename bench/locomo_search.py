"""LoCoMo evidence recall of the Search RPC on a real stack, side by side with plain rankers.

Documents are the dialog turns "speaker: text" of ../shared/benchmarks/locomo (10 conversations,
5,882 turns); questions are those of categories 1-4 with non-empty evidence (1,536). Each
conversation is its own org AND its own session, so a Search over one conversation never sees
another.

Engine: `context-engine up` in a scratch directory; every turn goes in through gRPC IngestEvent
(content = the turn, metadata {"dia_id": ...}, idempotency key per turn), each conversation's turns
one after the other in dialogue order (the session's order, which the adjacent-turn lift reads;
until 2026-12-05 16 turns were in flight and a session's order only roughly the dialogue's) and the
conversations in parallel; the
script waits until the embedding pipeline has given every chunk a vector, then calls Search once
per question (top_k 256, min_score 1e-6 so everything retrieved is ranked; one call in flight)
and maps results back to dia_ids through the chunk metadata. `--top-k 10` asks as an agent
usually does (the columns past 10 results then count what those 10 hold).

Plain rankers, in this process, on the same documents and questions:
  BM25   rank_bm25 BM25Okapi (k1 1.5, b 0.75, its own idf with epsilon floor) over the engine's
         analyzer `inference.text_analysis.analyze` (NFKC + casefold, runs of
         letters/digits, the engine's English stop-word list `bm25.STOP_WORDS` removed, no stemming);
  dense  MiniLM-L6 int8 (`MiniLMEmbedder`), cosine of the question against every turn of its
         conversation;
  RRF    1/(60 + rank_bm25) + 1/(60 + rank_dense) over the two full rankings (ranks from 1).

Two measures, at k = 5 / 10 / 25 ranked turns and within 1k / 2k / 4k tokens:
  evidence recall  (R@, as in docs/retrieval.md) per question |evidence in the first k ranked
                   turns| / |evidence|, averaged over questions;
  any evidence     (any@) the share of questions with at least one evidence turn there.
Evidence ids normalised (`D:11:26` -> D11:26, lists split). "N tok": the longest prefix of the
ranking whose turns total <= N cl100k tokens (`count_tokens(turn, "gpt-4")`). Rows: all ten
conversations, those a recipe is fitted on (conv-26, 30, 41, 42, 43, 44) and those it is judged on
(conv-47, 48, 49, 50), and each category.

    .venv/bin/python bench/locomo_search.py                          # all 10 conversations, ~4 min
    .venv/bin/python bench/locomo_search.py --limit-conversations 2  # quick run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import grpc  # noqa: E402
import numpy as np
from grpc_load import RETRIES, call_with_retry
from locomo import SPLITS, Conversation, Question, load_locomo, org_of
from options import add_locomo_options
from rank_bm25 import BM25Okapi
from report import load_average, machine, percentile
from stack import Stack, stack_cpu_seconds, wait_for_vectors
from tqdm import tqdm

from inference.minilm_embedder import MiniLMEmbedder
from inference.text_analysis import STOP_WORDS, analyze
from inference.tokens import count_tokens
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

CATEGORIES = (1, 2, 3, 4)
KS = (5, 10, 25)
BUDGETS = (1000, 2000, 4000)
COLUMNS = [f"R@{k}" for k in KS] + [f"R@{b // 1000}k tok" for b in BUDGETS]
ANY_COLUMNS = [f"any@{k}" for k in KS] + [f"any@{b // 1000}k tok" for b in BUDGETS]
RRF_K = 60
# The numbers for the plain rankers (R@5, R@10, R@25, R@1k, R@2k, R@4k tok).
REFERENCE = {
    "BM25": (.464, .531, .625, .635, .682, .745),
    "dense": (.356, .438, .578, .617, .721, .833),
    "RRF": (.441, .521, .648, .704, .793, .863),
}


@dataclass(frozen=True)
class Item:
    conversation: Conversation
    question: Question


def items_of(conversations: list[Conversation]) -> list[Item]:
    return [Item(c, q) for c in conversations for q in c.questions
            if q.category in CATEGORIES and q.evidence]


# -- recall ------------------------------------------------------------------------------------

def evidence_row(ranking: list[str], evidence: tuple[str, ...], tokens: dict[str, int]) -> list[float]:
    """For one question: R@k for KS, R@budget for BUDGETS, then the same columns as any-evidence
    hits (1.0 when at least one evidence turn is there)."""
    wanted = set(evidence)
    found = [wanted.intersection(ranking[:k]) for k in KS]
    for budget in BUDGETS:
        used, taken = 0, set()
        for dia_id in ranking:
            used += tokens[dia_id]
            if used > budget:
                break
            taken.add(dia_id)
        found.append(wanted & taken)
    return [len(f) / len(wanted) for f in found] + [1.0 if f else 0.0 for f in found]


def token_short(ranking: list[str], tokens: dict[str, int], budget: int) -> bool:
    """True when the whole ranking holds fewer than `budget` tokens (the ranker ran out of turns)."""
    return sum(tokens[d] for d in ranking) < budget


# -- plain rankers -----------------------------------------------------------------------------

def plain_rankings(conversations: list[Conversation], items: list[Item]) -> dict[str, list[list[str]]]:
    embedder = MiniLMEmbedder()
    out: dict[str, list[list[str]]] = {"BM25": [], "dense": [], "RRF": []}
    by_conv: dict[str, list[Item]] = {}
    for it in items:
        by_conv.setdefault(it.conversation.name, []).append(it)
    for c in tqdm(conversations, desc="plain rankers", unit="conversation", file=sys.stderr):
        ids = [d for d, _ in c.turns]
        texts = [t for _, t in c.turns]
        bm25 = BM25Okapi([analyze(t) for t in texts])
        vectors = embedder.embed_sync(texts)
        questions = by_conv.get(c.name, [])
        qvectors = embedder.embed_sync([it.question.text for it in questions]) if questions else []
        for it, qv in zip(questions, qvectors):
            lexical = np.argsort(-bm25.get_scores(analyze(it.question.text)), kind="stable")
            dense = np.argsort(-(vectors @ qv), kind="stable")
            fused = np.zeros(len(ids))
            for order in (lexical, dense):
                fused[order] += 1.0 / (RRF_K + np.arange(1, len(ids) + 1))
            out["BM25"].append([ids[i] for i in lexical])
            out["dense"].append([ids[i] for i in dense])
            out["RRF"].append([ids[i] for i in np.argsort(-fused, kind="stable")])
    return out


# -- the engine ---------------------------------------------------------------------------------




async def ingest(stack: Stack, conversations: list[Conversation], concurrency: int) -> tuple[int, float]:
    """Every turn through IngestEvent, each conversation in dialogue order, `concurrency`
    conversations at once; returns (events, seconds)."""
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        tokens = {org_of(c): stack.token(org_of(c)) for c in conversations}
        gate = asyncio.Semaphore(concurrency)
        bar = tqdm(total=sum(len(c.turns) for c in conversations), desc="IngestEvent", unit="turn",
                   file=sys.stderr)

        async def conversation(c: Conversation) -> None:
            org = org_of(c)
            async with gate:
                for dia_id, text in c.turns:
                    request = pb.IngestEventRequest(scope=pb.ScopePath(org_id=org), session_id=f"conversation-{c.name}",
                                                    event_type="message", content=text.encode(),
                                                    metadata={"dia_id": dia_id})
                    metadata = (("authorization", f"Bearer {tokens[org]}"), ("idempotency-key", f"{org}/{dia_id}"))
                    await call_with_retry(stub.IngestEvent, request, metadata)
                    bar.update()

        started = time.perf_counter()
        await asyncio.gather(*(conversation(c) for c in conversations))
        elapsed = time.perf_counter() - started
        bar.close()
        return sum(len(c.turns) for c in conversations), elapsed


@dataclass
class EngineRun:
    rankings: list[list[str]]
    latencies: list[float]  # seconds per Search call
    outcomes: dict[str, int]
    results: list[int]  # results per call


async def engine_rankings(stack: Stack, items: list[Item], concurrency: int, top_k: int) -> EngineRun:
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        tokens: dict[str, str] = {}
        rankings: list[list[str]] = [[] for _ in items]
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        counts: list[int] = [0] * len(items)
        gate = asyncio.Semaphore(concurrency)
        bar = tqdm(total=len(items), desc="Search", unit="question", file=sys.stderr)

        async def one(i: int, it: Item) -> None:
            org = org_of(it.conversation)
            token = tokens.setdefault(org, stack.token(org))
            request = pb.SearchRequest(scope=pb.ScopePath(org_id=org), query=it.question.text,
                                       top_k=top_k, min_score=1e-6)
            async with gate:
                started = time.perf_counter()
                response = await call_with_retry(stub.Search, request, (("authorization", f"Bearer {token}"),))
                latencies.append(time.perf_counter() - started)
            name = pb.RetrievalOutcome.Name(response.outcome)
            outcomes[name] = outcomes.get(name, 0) + 1
            counts[i] = len(response.results)
            rankings[i] = list(dict.fromkeys(r.metadata["dia_id"] for r in response.results))
            bar.update()

        # One untimed call per org first: connection set-up and the first query embedding.
        for c in {it.conversation.name: it.conversation for it in items}.values():
            org = org_of(c)
            await call_with_retry(stub.Search, pb.SearchRequest(scope=pb.ScopePath(org_id=org), query="hello"),
                                  (("authorization", f"Bearer {tokens.setdefault(org, stack.token(org))}"),))
        await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
        bar.close()
        return EngineRun(rankings, latencies, outcomes, counts)


# -- report -------------------------------------------------------------------------------------

def table(title: str, rows: dict[str, list[float]], n: int) -> list[str]:
    """Evidence recall and any-evidence columns side by side, one row per ranker."""
    lines = [f"{title} ({n:,} questions)",
             f"{'ranker':<28}" + "".join(f"{c:>11}" for c in COLUMNS + ANY_COLUMNS)]
    for name, values in rows.items():
        lines.append(f"{name:<28}" + "".join(f"{v:>11.3f}" for v in values))
    return lines


def comparison(engine: list[float], plain: dict[str, list[float]]) -> list[str]:
    lines = []
    for name, values in plain.items():
        lines.append(f"{'Search - ' + name:<28}" + "".join(f"{e - v:>+11.3f}" for e, v in zip(engine, values)))
    best = [max(values[i] for values in plain.values()) for i in range(len(engine))]
    lines.append(f"{'beats best plain':<28}" + "".join(
        f"{'yes' if e > b + 1e-9 else 'tie' if abs(e - b) <= 1e-9 else 'no':>11}" for e, b in zip(engine, best)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_locomo_options(parser)
    parser.add_argument("--ingest-concurrency", type=int, default=10, help="conversations ingested at once")
    parser.add_argument("--top-k", type=int, default=256, help="Search's top_k (1..256)")
    parser.add_argument("--search-concurrency", type=int, default=1,
                        help="Search calls in flight (1 = latencies of an otherwise idle stack)")
    args = parser.parse_args()

    conversations = load_locomo(args.locomo_dir, args.limit_conversations)
    items = items_of(conversations)
    doc_tokens = {c.name: {d: count_tokens(t, "gpt-4") for d, t in c.turns} for c in conversations}
    n_turns = sum(len(c.turns) for c in conversations)
    print(f"LoCoMo: {len(conversations)} conversations, {n_turns:,} turns, {len(items):,} questions "
          f"(categories 1-4 with evidence)", flush=True)

    plain = plain_rankings(conversations, items)

    home = args.home or pathlib.Path(tempfile.mkdtemp(prefix="context-engine-locomo-"))
    stack = Stack(home)
    try:
        stack.wait_serving()
        endpoints = stack.endpoints()
        events, ingest_s = asyncio.run(ingest(stack, conversations, args.ingest_concurrency))
        chunks, embed_wait_s = wait_for_vectors(endpoints["database_url"], [org_of(c) for c in conversations],
                                                events)
        load_before, cpu_before, phase_started = load_average(), stack_cpu_seconds(stack), time.monotonic()
        run = asyncio.run(engine_rankings(stack, items, args.search_concurrency, args.top_k))
        cpu_s, phase_s = stack_cpu_seconds(stack) - cpu_before, time.monotonic() - phase_started
        load_after = load_average()
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)

    rankings = {"engine Search": run.rankings, **plain}

    def mean_rows(selected: list[int]) -> dict[str, list[float]]:
        rows = {}
        for name, ranks in rankings.items():
            per_q = [evidence_row(ranks[i], items[i].question.evidence, doc_tokens[items[i].conversation.name])
                     for i in selected]
            rows[name] = [statistics.fmean(col) for col in zip(*per_q)]
        return rows

    everything = list(range(len(items)))
    overall = mean_rows(everything)
    ms = [x * 1000 for x in run.latencies]
    short = sum(token_short(r, doc_tokens[it.conversation.name], BUDGETS[-1]) for r, it in zip(run.rankings, items))

    print()
    print(f"machine: {machine()}; {load_before} before the Search calls, {load_after} after")
    print(f"settings: embedded PostgreSQL 18 + pgvector, tansu; MiniLM-L6 int8; {len(conversations)} orgs/sessions; "
          f"{events:,} IngestEvent calls ({args.ingest_concurrency} conversations at once, each in order) "
          f"in {ingest_s:.1f} s "
          f"({events / ingest_s:,.0f}/s); {chunks:,} chunks all embedded {embed_wait_s:.1f} s after the last ack; "
          f"Search top_k {args.top_k}, min_score 1e-6, {args.search_concurrency} in flight; "
          f"retried calls {dict(RETRIES) or 'none'}")
    print(f"Search latency ms: p50 {percentile(ms, 50):.1f}  p95 {percentile(ms, 95):.1f}  "
          f"p99 {percentile(ms, 99):.1f}  mean {statistics.fmean(ms):.1f}  ({len(ms):,} calls)")
    print(f"Search CPU: {cpu_s / len(ms) * 1000:.1f} ms of stack CPU per call ({cpu_s:.1f} s user+system of every "
          f"stack process over {phase_s:.1f} s of calls, idle polling included)")
    print(f"Search outcomes: {run.outcomes}; results per call: median {statistics.median(run.results):.0f}, "
          f"min {min(run.results)}; rankings holding < {BUDGETS[-1]} tokens: {short}")
    print()
    lines = table("all ten conversations, all categories", overall, len(items))
    lines += [f"{'(issue) ' + name:<28}" + "".join(f"{v:>11.3f}" for v in ref) for name, ref in REFERENCE.items()]
    lines += comparison(overall["engine Search"], {k: v for k, v in overall.items() if k != "engine Search"})
    print("\n".join(lines))
    per_split = {}
    for split, names in SPLITS:
        selected = [i for i, it in enumerate(items) if it.conversation.name in names]
        if selected:
            per_split[split] = mean_rows(selected)
            print()
            print("\n".join(table(f"{split} (conv-{', '.join(names)})", per_split[split], len(selected))))
    per_category = {}
    for cat in CATEGORIES:
        selected = [i for i, it in enumerate(items) if it.question.category == cat]
        if not selected:
            continue
        rows = per_category[cat] = mean_rows(selected)
        print()
        print("\n".join(table(f"category {cat}", rows, len(selected))
                        + comparison(rows["engine Search"], {k: v for k, v in rows.items() if k != "engine Search"})))
    print(f"\nBM25 analyzer: inference.text_analysis.analyze ({len(STOP_WORDS)} stop words)")

    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine(), "conversations": len(conversations), "turns": n_turns, "questions": len(items),
            "columns": COLUMNS + ANY_COLUMNS, "overall": overall, "per_split": per_split,
            "per_category": per_category, "reference": REFERENCE,
            "search_latency_ms": {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99)},
            "search_cpu_ms_per_call": cpu_s / len(ms) * 1000,
            "outcomes": run.outcomes, "ingest": {"events": events, "seconds": ingest_s},
            "embed_wait_s": embed_wait_s}, indent=2))


if __name__ == "__main__":
    main()
