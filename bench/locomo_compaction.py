"""Compaction of LoCoMo (../shared/benchmarks/locomo) with the offline summarizer (issue #22).

Each conversation's older sessions (all but its last --keep-sessions) are summarised by the
extractive backend, as one Compact of the conversation would replace them; printed per
conversation and in all: tokens before and after (cl100k, the gpt-4 encoding), the
fact_retention_score (inference/facts.py) and the gate's verdict, the evidence turns of the
compacted span some sentence of which the summary keeps verbatim (what a question needs), and
the summarizer's time.

Then, on a real stack (unless --offline-only), AssembleContext evidence coverage at each of
--budgets tokens (2,000 and 4,000) before and after compaction, same questions (categories 1-4
with evidence): every conversation is one session (bench/locomo_assembly.py's ingest), every
question is assembled, each session is compacted by the Compact RPC (sliding_window, the offline
summarizer, keeping --keep-recent-turns turns; the worker's compaction on threshold is off, so
"before" is before), and every question is assembled again. The replaced turns stay
retrievable (recall storage), and a summary line gives its place to its turn when retrieval
finds it (docs/compaction.md). An evidence turn counts as covered when the prompt holds
its text or one of its sentences of at least MIN_SENTENCE characters verbatim (the same test
before and after: a summary keeps sentences, not turns); coverage is the mean over questions of
the share of their evidence turns covered.

    .venv/bin/python bench/locomo_compaction.py
    .venv/bin/python bench/locomo_compaction.py --offline-only
    .venv/bin/python bench/locomo_compaction.py --limit-conversations 2 --keep --home /tmp/lc
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import asyncpg  # noqa: E402
import grpc  # noqa: E402
from grpc_load import call_with_retry
from locomo import LOCOMO_DIR, Conversation, load_locomo
from locomo_assembly import ingest
from locomo_assembly import session_of as conversation_session
from locomo_search import Item, items_of, org_of
from report import machine, percentile
from stack import Stack, wait_for_vectors
from tqdm import tqdm

from inference.facts import RETENTION_FLOOR, retention
from inference.summarizers import Turn
from inference.summarizers.extractive import NEW_TERMS, sentences, summarize
from inference.tokens import count_tokens
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

MODEL = "gpt-4"
MIN_SENTENCE = 12
GOAL_REDUCTION = 0.5


def session_of(dia_id: str) -> int:
    return int(dia_id[1:].split(":", 1)[0])


def offline(args: argparse.Namespace, conversations: list[Conversation]) -> None:
    print(f"offline: {LOCOMO_DIR}, each conversation's sessions but its last {args.keep_sessions} "
          f"compacted by the extractive summarizer (NEW_TERMS {NEW_TERMS}), tokens by {MODEL}'s encoding, "
          f"floor {RETENTION_FLOOR}")
    print()
    print(f"{'conv':>5} {'turns':>6} {'tokens':>7} {'after':>6} {'fewer':>6} {'facts':>6} {'score':>7} {'gate':>5} "
          f"{'evidence kept':>14} {'ms':>6}")
    totals = {"before": 0, "after": 0, "evidence": 0, "kept": 0}
    reductions, scores = [], []
    for conv in conversations:
        last = max(session_of(d) for d, _ in conv.turns)
        older = [(d, text) for d, text in conv.turns if session_of(d) <= last - args.keep_sessions]
        turns = [Turn(*text.split(": ", 1)) for _, text in older]
        started = time.perf_counter()
        summary = summarize(turns)
        ms = (time.perf_counter() - started) * 1000
        score = retention([t.content for t in turns], summary)
        before = count_tokens("\n".join(text for _, text in older), MODEL)
        after = count_tokens(summary, MODEL)
        span = {d for d, _ in older}
        by_id = dict(older)
        evidence = sorted({e for q in conv.questions for e in q.evidence if e in span})
        kept = [e for e in evidence if any(s in summary for s in sentences(by_id[e].split(": ", 1)[1]))]
        reductions.append(1 - after / before)
        scores.append(score.score)
        for k, v in (("before", before), ("after", after), ("evidence", len(evidence)), ("kept", len(kept))):
            totals[k] += v
        gate = "pass" if score.score >= RETENTION_FLOOR else "FAIL"
        print(f"{conv.name:>5} {len(turns):>6} {before:>7} {after:>6} {1 - after / before:>6.1%} {score.total:>6} "
              f"{score.score:>7.4f} {gate:>5} {f'{len(kept)}/{len(evidence)}':>14} {ms:>6.0f}")
    print()
    print(f"in all: {totals['before']:,} -> {totals['after']:,} tokens ({1 - totals['after'] / totals['before']:.1%} "
          f"fewer; per conversation mean {statistics.fmean(reductions):.1%}, least {min(reductions):.1%}); "
          f"fact_retention_score least {min(scores):.4f}; evidence turns with a sentence kept "
          f"{totals['kept']}/{totals['evidence']} ({totals['kept'] / max(1, totals['evidence']):.1%})")



# -- on a stack: AssembleContext coverage before and after Compact -----------------------------

def covered(prompt: str, turn: str) -> bool:
    """The prompt holds the turn, or one of its sentences (MIN_SENTENCE characters or more)."""
    text = turn.split(": ", 1)[-1].strip()
    return text in prompt or any(len(s) >= MIN_SENTENCE and s in prompt for s in sentences(text))


@dataclass
class Phase:
    """Per question: the share of its evidence turns covered, the call's latency (s) and tokens."""
    coverage: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    retrieved: list[int] = field(default_factory=list)  # chunk ids of the prompt
    below_floor: list[int] = field(default_factory=list)  # quality.results_below_threshold


async def assemble_all(stack: Stack, items: list[Item], budgets: list[int], phase: str) -> dict[int, Phase]:
    return {budget: await assemble_at(stack, items, budget, phase) for budget in budgets}


async def assemble_at(stack: Stack, items: list[Item], budget: int, phase: str) -> Phase:
    out = Phase()
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        tokens = {org_of(it.conversation): stack.token(org_of(it.conversation)) for it in items}
        for it in tqdm(items, desc=f"AssembleContext {phase} at {budget:,}", unit="call", file=sys.stderr):
            org = org_of(it.conversation)
            text_of = dict(it.conversation.turns)
            request = pb.AssembleContextRequest(
                scope=pb.ScopePath(org_id=org), session_id=conversation_session(it.conversation),
                task_description=it.question.text, token_budget=budget, model_id=MODEL)
            started = time.perf_counter()
            reply = await call_with_retry(stub.AssembleContext, request, (("authorization", f"Bearer {tokens[org]}"),))
            out.latency.append(time.perf_counter() - started)
            out.tokens.append(reply.assembled_tokens)
            out.retrieved.append(len(reply.chunk_ids))
            out.below_floor.append(reply.quality.results_below_threshold)
            evidence = [e for e in it.question.evidence if e in text_of]
            out.coverage.append(sum(covered(reply.assembled_prompt, text_of[e]) for e in evidence)
                                / max(1, len(evidence)))
    return out


async def compact_all(stack: Stack, conversations: list[Conversation]) -> dict[str, pb.CompactResponse | str]:
    """One Compact per conversation's session, by its owner (clearance L3): the reply, or the error."""
    out: dict[str, pb.CompactResponse | str] = {}
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        for c in conversations:
            org = org_of(c)
            metadata = (("authorization", f"Bearer {stack.token(org, clearance=3)}"),)
            try:
                request = pb.CompactRequest(scope=pb.ScopePath(org_id=org), session_id=conversation_session(c),
                                            strategy="sliding_window")
                out[c.name] = await stub.Compact(request, metadata=metadata, timeout=600)
            except grpc.aio.AioRpcError as err:
                out[c.name] = f"{err.code().name}: {err.details()}"
    return out


async def active_history(database_url: str, conversations: list[Conversation]) -> dict[str, str]:
    """Per conversation, its session's active turns joined (after compaction: the summary and the
    kept turns): what the best possible prompt could hold."""
    conn = await asyncpg.connect(database_url)
    try:
        return {c.name: "\n".join(bytes(r["content"]).decode() for r in await conn.fetch(
            "SELECT content FROM session_events WHERE org_id = $1 AND session_id = $2 AND active ORDER BY seq",
            org_of(c), conversation_session(c))) for c in conversations}
    finally:
        await conn.close()


def on_stack(args: argparse.Namespace, conversations: list[Conversation]) -> None:
    items = items_of(conversations)
    orgs = [org_of(c) for c in conversations]
    settings = {"CONTEXT_ENGINE_COMPACTION_ON_THRESHOLD": "false",
                "CONTEXT_ENGINE_COMPACTION_KEEP_RECENT_TURNS": str(args.keep_recent_turns)}
    if args.min_score is not None:
        settings["CONTEXT_ENGINE_RETRIEVAL_MIN_SCORE"] = str(args.min_score)
    created = args.home is None or not args.home.exists()
    home = args.home or pathlib.Path(tempfile.mkdtemp(prefix="context-engine-locomo-compaction-"))
    stack = Stack(home, settings=settings)
    try:
        stack.wait_serving()
        database_url = stack.endpoints()["database_url"]
        _, ingest_s = asyncio.run(ingest(stack, conversations))
        wait_for_vectors(database_url, orgs, sum(len(c.turns) for c in conversations))
        before = asyncio.run(assemble_all(stack, items, args.budgets, "before"))
        started = time.perf_counter()
        compacted = asyncio.run(compact_all(stack, conversations))
        compact_s = time.perf_counter() - started
        wait_for_vectors(database_url, orgs, None)  # the summaries' chunks
        after = asyncio.run(assemble_all(stack, items, args.budgets, "after"))
        history = asyncio.run(active_history(database_url, conversations))
    finally:
        stack.stop()
        if created and not args.keep:
            shutil.rmtree(home, ignore_errors=True)

    print()
    print(f"on a stack: embedded PostgreSQL 18 + pgvector, tansu, MiniLM-L6 int8; {len(conversations)} sessions "
          f"ingested in {ingest_s:.1f} s; Compact sliding_window keeping {args.keep_recent_turns} turns, extractive "
          f"summarizer, one call per session ({compact_s:.1f} s in all); {len(items):,} questions assembled at "
          f"{', '.join(f'{b:,}' for b in args.budgets)} tokens ({MODEL}) before and after, one call in flight, floor "
          f"{args.min_score if args.min_score is not None else 'server default'}")
    # The most the history alone could cover after compaction: the summary lines and the kept turns, whole.
    reachable = [sum(covered(history[it.conversation.name], dict(it.conversation.turns)[e])
                     for e in it.question.evidence if e in dict(it.conversation.turns))
                 / max(1, sum(e in dict(it.conversation.turns) for e in it.question.evidence)) for it in items]
    print(f"{'conv':>5} {'tokens':>7} {'after':>6} {'fewer':>6} {'score':>7} "
          + " ".join(f"{f'before@{b}':>12} {f'after@{b}':>11}" for b in args.budgets) + f" {'history':>8}")
    sums = {"original": 0, "compacted": 0}
    for c in conversations:
        reply = compacted[c.name]
        mine = [i for i, it in enumerate(items) if it.conversation.name == c.name]

        def mean(xs: list[float]) -> float:
            return statistics.fmean(xs[i] for i in mine) if mine else 0.0  # noqa: B023

        cov = " ".join(f"{mean(before[b].coverage):>12.3f} {mean(after[b].coverage):>11.3f}" for b in args.budgets)
        if isinstance(reply, str):
            print(f"{c.name:>5} refused: {reply[:160]}  {cov}")
            continue
        sums["original"] += reply.original_tokens
        sums["compacted"] += reply.compacted_tokens
        print(f"{c.name:>5} {reply.original_tokens:>7} {reply.compacted_tokens:>6} "
              f"{1 - reply.compacted_tokens / reply.original_tokens:>6.1%} {reply.fact_retention_score:>7.4f} "
              f"{cov} {mean(reachable):>8.3f}")
    reduction = 1 - sums["compacted"] / max(1, sums["original"])
    refused = sum(isinstance(r, str) for r in compacted.values())
    print()
    print(f"in all: compacted turns {sums['original']:,} -> {sums['compacted']:,} tokens ({reduction:.1%} fewer); "
          f"{refused} of {len(conversations)} sessions refused; the history alone (summary lines and kept turns, "
          f"whole) holds {statistics.fmean(reachable):.3f} of the evidence")
    met = reduction >= GOAL_REDUCTION and not refused
    for budget in args.budgets:
        cov_before, cov_after = statistics.fmean(before[budget].coverage), statistics.fmean(after[budget].coverage)
        met = met and cov_after >= cov_before
        print(f"evidence coverage at {budget:,} tokens: {cov_before:.3f} before, {cov_after:.3f} after "
              f"({cov_after - cov_before:+.3f})")
        for name, ph in (("before", before[budget]), ("after", after[budget])):
            ms = [x * 1000 for x in ph.latency]
            print(f"  {name}: assembled tokens mean {statistics.fmean(ph.tokens):,.0f}, chunk ids mean "
                  f"{statistics.fmean(ph.retrieved):.1f}, results below the floor mean "
                  f"{statistics.fmean(ph.below_floor):.1f}, "
                  f"AssembleContext p50/p95 {percentile(ms, 50):.1f}/{percentile(ms, 95):.1f} ms")
    print(f"verdict: >= {GOAL_REDUCTION:.0%} fewer tokens with the gate passing, coverage after >= before at every "
          f"budget: {'MET' if met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-sessions", type=int, default=2, help="offline: the most recent sessions kept verbatim")
    parser.add_argument("--keep-recent-turns", type=int, default=10,
                        help="on the stack: COMPACTION_KEEP_RECENT_TURNS (the server's default: 10)")
    parser.add_argument("--budgets", type=lambda v: [int(x) for x in v.split(",")], default=[2000, 4000],
                        help="AssembleContext's token budgets, comma-separated")
    parser.add_argument("--min-score", type=float, default=None,
                        help="the tenant floor retrieval_min_score for the stack (default: the server's)")
    parser.add_argument("--limit-conversations", type=int, default=None)
    parser.add_argument("--offline-only", action="store_true", help="only the summarizer, no stack")
    parser.add_argument("--home", type=pathlib.Path, default=None, help="the stack's home (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the stack's home")
    args = parser.parse_args()

    conversations = load_locomo(limit=args.limit_conversations)
    print(f"machine: {machine()}")
    offline(args, conversations)
    if not args.offline_only:
        on_stack(args, conversations)


if __name__ == "__main__":
    main()
