"""A sliding-window compaction of a session's owner-scope turns, as the Compact RPC and the
compaction worker both run it (docs/compaction.md): keep the last `keep_recent` turns verbatim,
summarise the older ones (a summary's earlier lines are not summarised again), refuse a summary
that would not cut the session's tokens by `min_savings`, score it against the turns it would
replace (inference.facts.retention) and build the session.compacted event body. Every refusal is
the error the RPC answers with, its `reason` the outcome the worker counts; nothing is written
here.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from context_engine.errors import FailedPrecondition, Unavailable
from context_engine.events import SessionCompacted
from inference.facts import RETENTION_FLOOR, Retention, retention
from inference.summarizers import Summarizer, SummarizerError, SummaryLine, Turn
from inference.tokens import count_tokens

STRATEGIES = ("sliding_window",)
TOKEN_MODEL = "gpt-4"  # turns are counted in cl100k at ingest; the summary is counted the same way


class OwnerTurn(Protocol):
    """An active turn written at the session's owner scope (projections.reads.sessions.OwnerTurn)."""

    @property
    def event_id(self) -> str: ...
    @property
    def content(self) -> bytes: ...
    @property
    def role(self) -> str: ...
    @property
    def token_count(self) -> int: ...
    @property
    def summary(self) -> bool: ...  # a line of an earlier compaction's summary


@dataclass(frozen=True)
class CompactionPlan:
    session_id: str
    replaced: tuple[str, ...]
    lines: tuple[SummaryLine, ...]  # `turn` indexes `replaced`
    line_tokens: tuple[int, ...]
    score: Retention
    original_tokens: int
    compaction_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # the event's id

    @property
    def summary(self) -> bytes:
        return "\n".join(line.text for line in self.lines).encode()

    @property
    def compacted_tokens(self) -> int:
        return sum(self.line_tokens)

    def event_body(self, base_version: str, strategy: str, summarizer: str) -> SessionCompacted:
        return SessionCompacted(self.session_id, base_version, self.replaced, base64.b64encode(self.summary).decode(),
                                strategy, summarizer, self.score.score, self.original_tokens, self.compacted_tokens,
                                self.compaction_id, tuple(self.replaced[line.turn] for line in self.lines),
                                self.line_tokens)


async def plan_sliding_window(summarizer: Summarizer, session_id: str, turns: Sequence[OwnerTurn], *,
                              keep_recent: int, max_content_bytes: int, session_tokens: int,
                              min_savings: float) -> CompactionPlan:
    """The compaction of `turns` (conversation order; `session_tokens` the session's active
    tokens, every scope's), or FailedPrecondition NOTHING_TO_COMPACT / SUMMARY_TOO_LARGE /
    INSUFFICIENT_SAVINGS / QUALITY_GUARDRAIL_TRIGGERED, Unavailable SUMMARIZER_UNAVAILABLE."""
    plain = [t for t in turns if not t.summary]  # an earlier summary's lines stay as they are
    older = plain[:-keep_recent] if len(plain) > keep_recent else []
    if len(older) < 2:
        raise FailedPrecondition(
            f"session {session_id!r} has {len(plain)} turns at its owner scope that no summary stands for; "
            f"sliding_window keeps the last {keep_recent} and needs at least 2 older ones to compact",
            reason="NOTHING_TO_COMPACT", metadata={"turns": str(len(plain)), "keep_recent_turns": str(keep_recent)})
    texts = [t.content.decode("utf-8", errors="replace") for t in older]
    try:
        summary = await summarizer.summarize([Turn(t.role, text) for t, text in zip(older, texts)])
    except SummarizerError as exc:
        raise Unavailable(f"the summarizer failed: {exc}", reason="SUMMARIZER_UNAVAILABLE") from exc
    lines = tuple(line for line in summary.lines if line.text and 0 <= line.turn < len(older))
    encoded = "\n".join(line.text for line in lines).encode()
    if len(encoded) > max_content_bytes:
        raise FailedPrecondition(
            f"the summary of {len(older)} turns is {len(encoded)} bytes, over the {max_content_bytes} a turn may "
            "hold (MAX_CONTENT_BYTES); nothing changed", reason="SUMMARY_TOO_LARGE",
            metadata={"summary_bytes": str(len(encoded)), "max_content_bytes": str(max_content_bytes)})
    line_tokens = tuple(count_tokens(line.text, TOKEN_MODEL) for line in lines)
    original = sum(t.token_count for t in older)
    _require_savings(original, sum(line_tokens), session_tokens, min_savings)
    text = encoded.decode()
    score = await asyncio.to_thread(retention, texts, text)  # CPU over every older turn: off the event loop
    _require_quality(score)
    return CompactionPlan(session_id, tuple(t.event_id for t in older), lines, line_tokens, score, original)


def _require_savings(original: int, compacted: int, session_tokens: int, min_savings: float) -> None:
    """A compaction that would not cut the session's tokens by `min_savings` rewrites for nothing."""
    saved = original - compacted
    if saved < min_savings * session_tokens:
        share = saved / session_tokens if session_tokens else 0.0
        raise FailedPrecondition(
            f"the summary would cut the session's {session_tokens} tokens by {saved} ({share:.1%}: {original} "
            f"tokens of turns replaced by {compacted}); a compaction must cut at least {min_savings:.0%} "
            "(COMPACTION_MIN_SAVINGS); nothing changed", reason="INSUFFICIENT_SAVINGS",
            metadata={"original_tokens": str(original), "compacted_tokens": str(compacted),
                      "session_tokens": str(session_tokens), "min_savings": str(min_savings)})


def _require_quality(score: Retention) -> None:
    """The gate: the summary keeps the replaced turns' facts (all but RETENTION_FLOOR's slack),
    states none they do not (a changed number, a dropped negation, a swapped binding) and keeps
    each correction's last word, whatever the recall."""
    if score.passes:
        return
    missing = ", ".join(f"{f.kind} {f.value!r}" for f in score.missing[:20])
    introduced = ", ".join(f"{f.kind} {f.value!r}" for f in score.introduced[:20])
    superseded = ", ".join(f"{f.kind} {f.value!r}" for f in score.superseded[:20])
    problems = [f"keeps {score.kept} of {score.total} facts of the turns it would replace "
                f"(fact_retention_score {score.score:.4f}, floor {RETENTION_FLOOR})"]
    if missing:
        problems.append(f"missing: {missing}")
    if introduced:
        problems.append(f"states what the turns do not: {introduced}")
    if superseded:
        problems.append(f"lacks what a later turn corrected it to: {superseded}")
    raise FailedPrecondition(
        f"the summary {'; '.join(problems)}; nothing changed", reason="QUALITY_GUARDRAIL_TRIGGERED",
        metadata={"fact_retention_score": f"{score.score:.6f}", "facts": str(score.total),
                  "facts_kept": str(score.kept), "missing": missing, "introduced": introduced,
                  "superseded": superseded})
