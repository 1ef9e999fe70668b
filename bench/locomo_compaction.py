"""Compaction of LoCoMo (../shared/benchmarks/locomo) with the offline summarizer (issue #22).

Each conversation's older sessions (all but its last --keep-sessions) are summarised by the
extractive backend, as one Compact of the conversation would replace them; printed per
conversation and in all: tokens before and after (cl100k, the gpt-4 encoding), the
fact_retention_score (inference/facts.py) and the gate's verdict, the evidence turns of the
compacted span some sentence of which the summary keeps verbatim (what a question needs), and
the summarizer's time.

Not yet measured here: AssembleContext evidence coverage at 2,000 tokens after compaction
against before, which needs the Compact RPC (docs/compaction.md).

    .venv/bin/python bench/locomo_compaction.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from locomo import LOCOMO_DIR, load_locomo
from report import machine

from inference.facts import RETENTION_FLOOR, retention
from inference.summarizers import Turn
from inference.summarizers.extractive import NEW_TERMS, sentences, summarize
from inference.tokens import count_tokens

MODEL = "gpt-4"


def session_of(dia_id: str) -> int:
    return int(dia_id[1:].split(":", 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-sessions", type=int, default=2, help="the most recent sessions kept verbatim")
    parser.add_argument("--limit-conversations", type=int, default=None)
    args = parser.parse_args()

    print(f"machine: {machine()}")
    print(f"settings: LoCoMo {LOCOMO_DIR}, each conversation's sessions but its last {args.keep_sessions} "
          f"compacted by the extractive summarizer (NEW_TERMS {NEW_TERMS}), tokens by {MODEL}'s encoding, "
          f"floor {RETENTION_FLOOR}")
    print()
    print(f"{'conv':>5} {'turns':>6} {'tokens':>7} {'after':>6} {'fewer':>6} {'facts':>6} {'score':>7} {'gate':>5} "
          f"{'evidence kept':>14} {'ms':>6}")
    totals = {"before": 0, "after": 0, "evidence": 0, "kept": 0}
    reductions, scores = [], []
    for conv in load_locomo(limit=args.limit_conversations):
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


if __name__ == "__main__":
    main()
