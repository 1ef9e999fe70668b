"""LoCoMo evidence coverage and token reduction of AssembleContext on a real stack.

Documents are the dialog turns "speaker: text" of ../shared/benchmarks/locomo (10 conversations,
5,882 turns); questions are those of categories 1-4 with non-empty evidence (1,536). Each
conversation is ONE session in its own org (retrieval sees only that conversation): its turns go
in through gRPC IngestEvent in dialogue order (one call in flight per conversation, so the
session's history order is the dialogue order; conversations in parallel), content = the turn,
metadata {"dia_id": ..., "time": its session's date_time} (no "time" with --no-dialogue-times: the
prompt then dates turns by when the stack received them), an idempotency key per turn. The script
keeps the event id of every turn: the turn's chunk id is UUIDv5(CHUNK_NAMESPACE, "<event_id>#0")
(checked against the chunks table), and waits until every chunk has a vector.

Then, for every question and every budget (default 1,000 / 2,000 / 4,000), one AssembleContext
call (one in flight): task_description = the question, session_id = the conversation's session,
model_id "gpt-4" (cl100k_base), no hints, no guardrail layers, the server's default settings
(retrieval floor retrieval_min_score, savings sampled on 5 % of calls) except that a crossing of
the compaction threshold does not compact the session (COMPACTION_ON_THRESHOLD=false) unless
--compaction-on-threshold: then the first (untimed) calls compact every session, and the bench
waits for the worker to close every request before the timed calls. --setting NAME=VALUE sets
any other setting (ASSEMBLY_RECENT_SHARE=0, say).

With --question-turn, each question is first ingested as the session's newest turn (metadata
role "user", the time of the conversation's last session), the budgets are assembled, and the
session is rolled back to the version before it (RollbackContext): "newest" reports the share of
prompts that hold that turn (its chunk id, and the prompt ends with its text).

Per budget:
  evidence coverage   per question |evidence turns in the prompt| / |evidence|, averaged
                      (comparable with R@N tok of bench/locomo_search.py); "any": the share of
                      questions with at least one evidence turn in the prompt (any@N tok there);
                      a turn is in the
                      prompt when its chunk id is in chunk_ids; the prompt text is checked too
                      (the turn's text found in the prompt) and disagreements are counted;
  split               the same coverage counted only in the `## Retrieved context` section and
                      only in the `## Recent conversation` section (each chunk id of chunk_ids
                      is located in the prompt, in order);
  tokens              mean assembled_tokens; token reduction = 1 - assembled / full, where full
                      = the whole conversation as one prompt (turns joined by a blank line,
                      cl100k), per call then averaged;
  latency             p50 / p95 of the call, measured by the client;
  by sentence         an evidence turn counts when the prompt holds its text or one of its
                      sentences of 12+ characters (a compaction summary keeps sentences):
                      bench/locomo_compaction.py's measure.

Rows: all questions, per category, and the conversations the retrieval recipe is fitted on
(conv-26, 30, 41, 42, 43, 44: "fit") apart from those it is judged on (conv-47, 48, 49, 50: "held out").

    .venv/bin/python bench/locomo_assembly.py                          # all 10 conversations
    .venv/bin/python bench/locomo_assembly.py --limit-conversations 2 --budgets 2000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()  # an entry point that starts a stack: before gRPC initialises
import asyncpg
import grpc  # noqa: E402
from grpc_load import call_with_retry
from locomo import SPLITS, Conversation, load_locomo
from locomo_search import CATEGORIES, REFERENCE, Item, items_of, org_of
from options import add_locomo_options, add_setting_option, stack_settings
from report import load_average, machine, percentile
from stack import Stack, stack_cpu_seconds, wait_for_vectors
from tqdm import tqdm

from inference.summarizers.extractive import sentences
from inference.tokens import count_tokens
from projections.retrieval.chunking import CHUNK_NAMESPACE
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

MODEL = "gpt-4"
SEPARATOR = "\n\n"
GOAL_BUDGET = 2000
GOAL_REDUCTION = 0.85
MIN_SENTENCE = 12
BEST_PLAIN = ("RRF", REFERENCE["RRF"][4])  # R@2k tok of the best plain ranker in the issue (.793)
_HISTORY_HEADING = re.compile(r"(?:^|\n\n)## Recent conversation\n\n")
_RETRIEVED_HEADING = re.compile(r"(?:^|\n\n)## Retrieved context\n\n")


def session_of(c: Conversation) -> str:
    return f"conversation-{c.name}"


# -- load ----------------------------------------------------------------------------------------

async def ingest(stack: Stack, conversations: list[Conversation],
                 dialogue_times: bool = True) -> tuple[dict[tuple[str, str], str], float]:
    """Every turn through IngestEvent, in dialogue order per conversation (one in flight per
    conversation, conversations in parallel). Returns ({(conversation, dia_id): event_id}, seconds)."""
    event_ids: dict[tuple[str, str], str] = {}
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        bar = tqdm(total=sum(len(c.turns) for c in conversations), desc="IngestEvent", unit="turn", file=sys.stderr)

        async def one_conversation(c: Conversation) -> None:
            org = org_of(c)
            token = stack.token(org)
            for dia_id, text in c.turns:
                request = pb.IngestEventRequest(scope=pb.ScopePath(org_id=org), session_id=session_of(c),
                                                event_type="message", content=text.encode(),
                                                metadata={"dia_id": dia_id, **(
                                                    {"time": c.times[dia_id]} if dialogue_times else {})})
                metadata = (("authorization", f"Bearer {token}"), ("idempotency-key", f"{org}/{dia_id}"))
                response = await call_with_retry(stub.IngestEvent, request, metadata)
                event_ids[(c.name, dia_id)] = response.event_id
                bar.update()

        started = time.perf_counter()
        await asyncio.gather(*(one_conversation(c) for c in conversations))
        elapsed = time.perf_counter() - started
        bar.close()
    return event_ids, elapsed


def turn_chunk_id(event_id: str) -> str:
    return str(uuid.uuid5(CHUNK_NAMESPACE, f"{event_id}#0"))


async def check_store(database_url: str, conversations: list[Conversation],
                      event_ids: dict[tuple[str, str], str]) -> dict[str, int]:
    """Compare the chunks and the session order in PostgreSQL with what the script expects."""
    conn = await asyncpg.connect(database_url)
    problems = collections.Counter()
    try:
        for c in conversations:
            rows = await conn.fetch("SELECT chunk_id, chunk_index, metadata->>'dia_id' AS dia_id FROM chunks "
                                    "WHERE org_id = $1", org_of(c))
            by_dia: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
            for r in rows:
                by_dia[r["dia_id"]].append((r["chunk_index"], str(r["chunk_id"])))
            for dia_id, _ in c.turns:
                got = sorted(by_dia.get(dia_id, []))
                if len(got) != 1:
                    problems["turns with != 1 chunk"] += 1
                if not got or got[0][1] != turn_chunk_id(event_ids[(c.name, dia_id)]):
                    problems["chunk id != UUIDv5(event_id#0)"] += 1
            order = [r["dia_id"] for r in await conn.fetch(
                "SELECT metadata->>'dia_id' AS dia_id FROM session_events WHERE org_id = $1 AND session_id = $2 "
                "AND active ORDER BY seq", org_of(c), session_of(c))]
            if order != [d for d, _ in c.turns]:
                problems["sessions not in dialogue order"] += 1
    finally:
        await conn.close()
    return dict(problems)


# -- assembly ------------------------------------------------------------------------------------

@dataclass
class Call:
    item: int
    budget: int
    latency: float
    assembled_tokens: int
    counted_tokens: int  # count_tokens(prompt, "gpt-4") on the client
    coverage: float  # by chunk id
    any_evidence: bool  # at least one evidence turn in the prompt (by chunk id)
    coverage_text: float  # by text
    retrieved_cov: float
    history_cov: float
    retrieved_blocks: int
    history_blocks: int
    retrieved_tokens: int
    history_tokens: int
    reduction: float
    outcome: str
    fallback: str
    baseline_tokens: int
    unlocated: int  # chunk ids whose text was not found in the prompt in order
    unknown_ids: int  # chunk ids that are no turn of the conversation (a summary line's, a question turn's)
    coverage_sentences: float  # by text or a sentence of 12+ characters
    newest: bool | None  # the question, ingested as the newest turn, is in the prompt (None: not ingested)


@dataclass
class Corpus:
    """Per conversation: chunk id -> dia_id and dia_id -> text; full-conversation tokens."""
    dia_of_chunk: dict[str, str] = field(default_factory=dict)
    text_of: dict[str, str] = field(default_factory=dict)
    full_tokens: int = 0


def sections(prompt: str) -> tuple[int, int]:
    """Start offsets of the retrieved and history sections' headings (len(prompt) if absent)."""
    r = _RETRIEVED_HEADING.search(prompt)
    h = _HISTORY_HEADING.search(prompt)
    return (r.start() if r else len(prompt)), (h.start() if h else len(prompt))


def covered(prompt: str, turn: str) -> bool:
    """The prompt holds the turn, or one of its sentences of MIN_SENTENCE characters or more."""
    text = turn.split(": ", 1)[-1].strip()
    return text in prompt or any(len(s) >= MIN_SENTENCE and s in prompt for s in sentences(text))


def measure(i: int, item: Item, budget: int, latency: float, response, corpus: Corpus,
            question_chunk: str | None = None) -> Call:
    prompt = response.assembled_prompt
    evidence = set(item.question.evidence)
    r_start, h_start = sections(prompt)
    in_retrieved, in_history = set(), set()
    cursor, unlocated, unknown = 0, 0, 0
    for chunk_id in response.chunk_ids:
        dia_id = corpus.dia_of_chunk.get(chunk_id)
        if dia_id is None:
            unknown += 1
            continue
        text = corpus.text_of[dia_id].strip()
        pos = prompt.find(text, cursor)
        if pos < 0:
            unlocated += 1
            continue
        cursor = pos + len(text)
        (in_history if pos >= h_start else in_retrieved).add(dia_id)
    by_id = in_retrieved | in_history | {corpus.dia_of_chunk[c] for c in response.chunk_ids
                                         if c in corpus.dia_of_chunk}
    unknown -= question_chunk in response.chunk_ids if question_chunk else 0
    by_text = {d for d in evidence if corpus.text_of.get(d, "\0").strip() in prompt}
    n = len(evidence)
    retrieved_text = prompt[r_start:h_start] if r_start < len(prompt) else ""
    history_text = prompt[h_start:] if h_start < len(prompt) else ""
    return Call(
        item=i, budget=budget, latency=latency, assembled_tokens=response.assembled_tokens,
        counted_tokens=count_tokens(prompt, MODEL),
        coverage=len(evidence & by_id) / n, any_evidence=bool(evidence & by_id), coverage_text=len(by_text) / n,
        retrieved_cov=len(evidence & in_retrieved) / n, history_cov=len(evidence & (in_history - in_retrieved)) / n,
        retrieved_blocks=len(in_retrieved), history_blocks=len(in_history),
        retrieved_tokens=count_tokens(retrieved_text.strip(), MODEL) if retrieved_text.strip() else 0,
        history_tokens=count_tokens(history_text.strip(), MODEL) if history_text.strip() else 0,
        reduction=1 - response.assembled_tokens / corpus.full_tokens,
        outcome=pb.RetrievalOutcome.Name(response.quality.retrieval_outcome).removeprefix("RETRIEVAL_OUTCOME_"),
        fallback=response.quality.fallback_reason if response.quality.fallback_used else "",
        baseline_tokens=response.baseline_tokens, unlocated=unlocated, unknown_ids=unknown,
        coverage_sentences=sum(covered(prompt, corpus.text_of[d]) for d in evidence if d in corpus.text_of) / n,
        newest=None if question_chunk is None else (question_chunk in response.chunk_ids
                                                    and prompt.rstrip().endswith(item.question.text.strip())))


async def assemble_all(stack: Stack, items: list[Item], budgets: list[int], corpora: dict[str, Corpus], *,
                       question_turn: bool = False, compaction: bool = False) -> list[Call]:
    calls: list[Call] = []
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        tokens: dict[str, str] = {}

        def auth(org: str, clearance: int = 1) -> tuple:
            token = tokens.setdefault(f"{org}/{clearance}", stack.token(org, clearance=clearance))
            return (("authorization", f"Bearer {token}"),)

        def request(it: Item, budget: int, task: str) -> tuple[pb.AssembleContextRequest, tuple]:
            org = org_of(it.conversation)
            return (pb.AssembleContextRequest(scope=pb.ScopePath(org_id=org), session_id=session_of(it.conversation),
                                              task_description=task, token_budget=budget, model_id=MODEL),
                    auth(org))

        # Untimed first call per conversation: connection, first query embedding, and the
        # compaction-threshold event the first call over 80 % of the budget appends.
        for it in {it.conversation.name: it for it in items}.values():
            for budget in budgets:
                await call_with_retry(stub.AssembleContext, *request(it, budget, "hello"))
        if compaction:
            await requests_closed(stack, sorted({org_of(it.conversation) for it in items}))
        await session_versions(stack.endpoints()["database_url"],
                               list({it.conversation.name: it.conversation for it in items}.values()))
        bar = tqdm(total=len(items) * len(budgets), desc="AssembleContext", unit="call", file=sys.stderr)
        for i, it in enumerate(items):
            corpus = corpora[it.conversation.name]
            org, session = org_of(it.conversation), session_of(it.conversation)
            question_chunk, before = None, ""
            if question_turn:
                before, question_chunk = await ask(stub, it, auth(org))
            for budget in budgets:
                req, metadata = request(it, budget, it.question.text)
                started = time.perf_counter()
                response = await call_with_retry(stub.AssembleContext, req, metadata)
                latency = time.perf_counter() - started
                calls.append(measure(i, it, budget, latency, response, corpus, question_chunk))
                bar.update()
            if question_turn:
                await call_with_retry(stub.RollbackContext, pb.RollbackContextRequest(
                    scope=pb.ScopePath(org_id=org), session_id=session, target_version_hash=before), auth(org, 3))
        bar.close()
    return calls


async def ask(stub, it: Item, metadata: tuple) -> tuple[str, str]:
    """Ingest the question as the session's newest user turn: (the version before it, its chunk id)."""
    c = it.conversation
    last = c.times.get(c.turns[-1][0], "") if c.turns else ""
    reply = await call_with_retry(stub.IngestEvent, pb.IngestEventRequest(
        scope=pb.ScopePath(org_id=org_of(c)), session_id=session_of(c), event_type="message",
        content=it.question.text.encode(), metadata={"role": "user", **({"time": last} if last else {})}), metadata)
    return _VERSIONS[session_of(c)], turn_chunk_id(reply.event_id)


_VERSIONS: dict[str, str] = {}  # each session's version before any question: the rollback target


async def requests_closed(stack: Stack, orgs: list[str], timeout: float = 3600.0) -> None:
    """Wait until the worker has closed every compaction request of these orgs (compacted or refused)."""
    conn = await asyncpg.connect(stack.endpoints()["database_url"])
    deadline = time.monotonic() + timeout
    try:
        while await conn.fetchval("SELECT count(*) FROM compaction_requests WHERE org_id = ANY($1::text[]) "
                                  "AND closed_by IS NULL", orgs):
            if time.monotonic() > deadline:
                raise TimeoutError("compaction requests still open")
            await asyncio.sleep(1.0)
        rows = await conn.fetch("SELECT org_id, replaced_turns, original_tokens, compacted_tokens FROM compactions "
                                "WHERE org_id = ANY($1::text[]) ORDER BY org_id", orgs)
        print(f"compactions on threshold: {len(rows)} ({sum(r['replaced_turns'] for r in rows):,} turns, "
              f"{sum(r['original_tokens'] for r in rows):,} -> {sum(r['compacted_tokens'] for r in rows):,} tokens)",
              file=sys.stderr)
    finally:
        await conn.close()


async def session_versions(database_url: str, conversations: list[Conversation]) -> None:
    """Each session's version now (the target of a question turn's rollback)."""
    conn = await asyncpg.connect(database_url)
    try:
        for c in conversations:
            _VERSIONS[session_of(c)] = await conn.fetchval(
                "SELECT version FROM sessions WHERE org_id = $1 AND session_id = $2", org_of(c), session_of(c))
    finally:
        await conn.close()


# -- report --------------------------------------------------------------------------------------

def summary(calls: list[Call]) -> dict[str, float]:
    mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    return {
        "n": len(calls),
        "coverage": mean([c.coverage for c in calls]),
        "any": mean([1.0 if c.any_evidence else 0.0 for c in calls]),
        "coverage_text": mean([c.coverage_text for c in calls]),
        "coverage_sentences": mean([c.coverage_sentences for c in calls]),
        "newest": mean([1.0 if c.newest else 0.0 for c in calls if c.newest is not None]),
        "from_retrieved": mean([c.retrieved_cov for c in calls]),
        "from_history": mean([c.history_cov for c in calls]),
        "assembled_tokens": mean([c.assembled_tokens for c in calls]),
        "retrieved_tokens": mean([c.retrieved_tokens for c in calls]),
        "history_tokens": mean([c.history_tokens for c in calls]),
        "retrieved_blocks": mean([c.retrieved_blocks for c in calls]),
        "history_blocks": mean([c.history_blocks for c in calls]),
        "reduction": mean([c.reduction for c in calls]),
        "reduction_min": min((c.reduction for c in calls), default=float("nan")),
        "calls_with_history": mean([1.0 if c.history_blocks else 0.0 for c in calls]),
        "p50_ms": percentile([c.latency * 1000 for c in calls], 50),
        "p95_ms": percentile([c.latency * 1000 for c in calls], 95),
        "p99_ms": percentile([c.latency * 1000 for c in calls], 99),
        "mean_ms": mean([c.latency * 1000 for c in calls]),
    }


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(title)
    print(f"{'':<14}{'n':>6}{'coverage':>10}{'any':>7}{'by text':>9}{'by sent':>9}{'retrieved':>11}{'history':>9}"
          f"{'newest':>8}{'tokens':>8}{'retr tok':>10}{'hist tok':>10}{'reduction':>11}{'p50 ms':>8}{'p95 ms':>8}")
    for name, s in rows.items():
        print(f"{name:<14}{s['n']:>6}{s['coverage']:>10.3f}{s['any']:>7.3f}{s['coverage_text']:>9.3f}{s['coverage_sentences']:>9.3f}"
              f"{s['from_retrieved']:>11.3f}{s['from_history']:>9.3f}{s['newest']:>8.3f}{s['assembled_tokens']:>8.0f}"
              f"{s['retrieved_tokens']:>10.0f}{s['history_tokens']:>10.0f}{s['reduction']:>11.1%}"
              f"{s['p50_ms']:>8.1f}{s['p95_ms']:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_locomo_options(parser)
    parser.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 2000, 4000],
                        help="token budgets, comma-separated")
    parser.add_argument("--min-score", type=float, default=None,
                        help="the tenant floor retrieval_min_score for the stack (default: the server's)")
    parser.add_argument("--no-dialogue-times", action="store_true",
                        help="ingest without metadata time: turns are dated by when the stack received them")
    parser.add_argument("--question-turn", action="store_true",
                        help="ingest each question as the newest turn before its calls, roll it back after")
    parser.add_argument("--compaction-on-threshold", action="store_true",
                        help="the default setting: the first calls compact every session (the bench waits)")
    add_setting_option(parser)
    args = parser.parse_args()

    conversations = load_locomo(args.locomo_dir, args.limit_conversations)
    items = items_of(conversations)
    corpora: dict[str, Corpus] = {}
    for c in conversations:
        corpora[c.name] = Corpus(text_of=dict(c.turns),
                                 full_tokens=count_tokens(SEPARATOR.join(t for _, t in c.turns), MODEL))
    n_turns = sum(len(c.turns) for c in conversations)
    print(f"LoCoMo: {len(conversations)} conversations, {n_turns:,} turns, {len(items):,} questions "
          f"(categories 1-4 with evidence); full conversation tokens (cl100k): "
          f"{', '.join(str(corpora[c.name].full_tokens) for c in conversations)}", flush=True)

    # The calls measure assembly over the whole conversation: the worker does not compact the
    # sessions when a call's budget is crossed (bench/locomo_compaction.py measures that).
    settings = {"CONTEXT_ENGINE_COMPACTION_ON_THRESHOLD": "true" if args.compaction_on_threshold else "false",
                **stack_settings(args)}
    if args.min_score is not None:
        settings["CONTEXT_ENGINE_RETRIEVAL_MIN_SCORE"] = str(args.min_score)
    created = args.home is None or not args.home.exists()
    home = args.home or pathlib.Path(tempfile.mkdtemp(prefix="context-engine-locomo-asm-"))
    stack = Stack(home, settings=settings)
    try:
        stack.wait_serving()
        endpoints = stack.endpoints()
        event_ids, ingest_s = asyncio.run(ingest(stack, conversations, not args.no_dialogue_times))
        chunks, embed_wait_s = wait_for_vectors(endpoints["database_url"], [org_of(c) for c in conversations],
                                                n_turns)
        problems = asyncio.run(check_store(endpoints["database_url"], conversations, event_ids))
        for c in conversations:
            corpora[c.name].dia_of_chunk = {turn_chunk_id(event_ids[(c.name, d)]): d for d, _ in c.turns}
        load_before, cpu_before, phase_started = load_average(), stack_cpu_seconds(stack), time.monotonic()
        calls = asyncio.run(assemble_all(stack, items, args.budgets, corpora, question_turn=args.question_turn,
                                         compaction=args.compaction_on_threshold))
        cpu_s, phase_s = stack_cpu_seconds(stack) - cpu_before, time.monotonic() - phase_started
        load_after = load_average()
    finally:
        stack.stop()
        if created and not args.keep:
            shutil.rmtree(home, ignore_errors=True)

    print()
    print(f"machine: {machine()}; {load_before} before the AssembleContext calls, {load_after} after")
    print(f"settings: embedded PostgreSQL 18 + pgvector, tansu, MiniLM-L6 int8; {len(conversations)} orgs, one "
          f"session each; {n_turns:,} IngestEvent calls (in order per session) in {ingest_s:.1f} s; {chunks:,} "
          f"chunks embedded {embed_wait_s:.1f} s after the last ack; AssembleContext model_id {MODEL!r}, no hints, "
          f"no layers, floor {args.min_score if args.min_score is not None else 'server default'}, "
          f"settings {settings}; question as the newest turn: {args.question_turn}; "
          f"one call in flight; turns dated by "
          f"{'when the stack received them' if args.no_dialogue_times else 'their LoCoMo session date_time'}")
    print("store checks: "
          f"{problems or 'every turn is one chunk with id UUIDv5(event_id#0); sessions in dialogue order'}")
    print(f"AssembleContext CPU: {cpu_s / len(calls) * 1000:.1f} ms of stack CPU per call ({cpu_s:.1f} s user+system "
          f"of every stack process over {phase_s:.1f} s of calls, idle polling included)")
    over = sum(c.assembled_tokens > c.budget for c in calls)
    mismatched = sum(c.assembled_tokens != c.counted_tokens for c in calls)
    disagree = sum(abs(c.coverage - c.coverage_text) > 1e-9 for c in calls)
    print(f"checks: over budget {over}; assembled_tokens != client count of the prompt {mismatched}; coverage by "
          f"chunk id != by text {disagree}; chunk ids not located in the prompt {sum(c.unlocated for c in calls)}; "
          f"chunk ids of no turn {sum(c.unknown_ids for c in calls)}")
    outcomes = collections.Counter(c.outcome for c in calls)
    fallbacks = collections.Counter(c.fallback for c in calls if c.fallback)
    print(f"retrieval outcomes: {dict(outcomes)}; fallbacks: {dict(fallbacks) or 'none'}")
    sampled = [c for c in calls if c.baseline_tokens]
    if sampled:
        print(f"savings sampled on {len(sampled)} of {len(calls)} calls: baseline_tokens mean "
              f"{statistics.fmean(c.baseline_tokens for c in sampled):,.0f} (the engine's naive prompt: session "
              f"history + every retrievable chunk, i.e. the conversation twice)")
    print()
    report: dict[str, object] = {"machine": machine(), "conversations": len(conversations), "turns": n_turns,
                                 "questions": len(items), "budgets": args.budgets, "min_score": args.min_score,
                                 "problems": problems, "outcomes": dict(outcomes), "per_budget": {}}
    for budget in args.budgets:
        mine = [c for c in calls if c.budget == budget]
        rows = {"all": summary(mine)}
        for split, names in SPLITS:
            sel = [c for c in mine if items[c.item].conversation.name in names]
            if sel:
                rows[split] = summary(sel)
        for cat in CATEGORIES:
            sel = [c for c in mine if items[c.item].question.category == cat]
            if sel:
                rows[f"category {cat}"] = summary(sel)
        print_table(f"budget {budget:,} tokens ({len(mine):,} calls)", rows)
        s = rows["all"]
        print(f"  mean blocks: retrieved {s['retrieved_blocks']:.1f}, history {s['history_blocks']:.1f}; "
              f"calls with any history {s['calls_with_history']:.1%}; smallest reduction {s['reduction_min']:.1%}; "
              f"latency p99 {s['p99_ms']:.1f} ms, mean {s['mean_ms']:.1f} ms")
        print()
        report["per_budget"][budget] = rows
    print("coverage: mean over questions of the share of evidence turns in the prompt (chunk ids); 'any': the share "
          "of questions with at least one evidence turn in it; 'by text': the "
          "same with the turn's text searched in the prompt; retrieved / history: the share found in each section; "
          "tokens: mean assembled_tokens; reduction: mean of 1 - assembled / full conversation")
    if GOAL_BUDGET in args.budgets:
        s = report["per_budget"][GOAL_BUDGET]["all"]
        name, bar_value = BEST_PLAIN
        ok_tokens = s["reduction"] >= GOAL_REDUCTION
        ok_cov = s["coverage"] >= bar_value
        print()
        print(f"verdict at {GOAL_BUDGET:,} tokens: token reduction {s['reduction']:.1%} "
              f"(goal >= {GOAL_REDUCTION:.0%}): "
              f"{'MET' if ok_tokens else 'MISSED'}; evidence coverage {s['coverage']:.3f} vs the best plain ranker "
              f"({name} R@2k tok {bar_value:.3f}): {'MET' if ok_cov else 'MISSED'} "
              f"({s['coverage'] - bar_value:+.3f}; {s['from_retrieved']:.3f} from retrieved, "
              f"{s['from_history']:.3f} from history)")
        report["verdict"] = {"reduction_met": ok_tokens, "coverage_met": ok_cov}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
