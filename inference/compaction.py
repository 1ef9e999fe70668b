"""A sliding-window compaction of a session's owner-scope turns, as the Compact RPC and the
compaction worker both run it (docs/compaction.md): keep the last `keep_recent` turns verbatim,
summarise the older ones, score the summary against them (inference.facts.retention) and build
the session.compacted event body. Every refusal is the error the RPC answers with, its `reason`
the outcome the worker counts; nothing is written here.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from context_engine.errors import FailedPrecondition, Unavailable
from context_engine.events import SessionCompacted
from inference.facts import RETENTION_FLOOR, Retention, retention
from inference.summarizers import Summarizer, SummarizerError, Turn
from inference.tokens import count_tokens

STRATEGIES = ("sliding_window",)
TOKEN_MODEL = "gpt-4"  # turns are counted in cl100k at ingest; the summary is counted the same way


class OwnerTurn(Protocol):
    """An active turn written at the session's owner scope (projections.queries.OwnerTurn)."""

    @property
    def event_id(self) -> str: ...
    @property
    def content(self) -> bytes: ...
    @property
    def role(self) -> str: ...
    @property
    def token_count(self) -> int: ...


@dataclass(frozen=True)
class CompactionPlan:
    session_id: str
    replaced: tuple[str, ...]
    summary: bytes
    score: Retention
    original_tokens: int
    compacted_tokens: int

    def event_body(self, base_version: str, strategy: str, summarizer: str) -> SessionCompacted:
        return SessionCompacted(self.session_id, base_version, self.replaced, base64.b64encode(self.summary).decode(),
                                strategy, summarizer, self.score.score, self.original_tokens, self.compacted_tokens)


async def plan_sliding_window(summarizer: Summarizer, session_id: str, turns: Sequence[OwnerTurn], *,
                              keep_recent: int, max_content_bytes: int) -> CompactionPlan:
    """The compaction of `turns` (conversation order), or FailedPrecondition NOTHING_TO_COMPACT /
    SUMMARY_TOO_LARGE / QUALITY_GUARDRAIL_TRIGGERED, Unavailable SUMMARIZER_UNAVAILABLE."""
    older = list(turns[:-keep_recent]) if len(turns) > keep_recent else []
    if len(older) < 2:
        raise FailedPrecondition(
            f"session {session_id!r} has {len(turns)} turns at its owner scope; sliding_window keeps the "
            f"last {keep_recent} and needs at least 2 older ones to compact", reason="NOTHING_TO_COMPACT",
            metadata={"turns": str(len(turns)), "keep_recent_turns": str(keep_recent)})
    texts = [t.content.decode("utf-8", errors="replace") for t in older]
    try:
        summary = await summarizer.summarize([Turn(t.role, text) for t, text in zip(older, texts)])
    except SummarizerError as exc:
        raise Unavailable(f"the summarizer failed: {exc}", reason="SUMMARIZER_UNAVAILABLE") from exc
    encoded = summary.encode()
    if len(encoded) > max_content_bytes:
        raise FailedPrecondition(
            f"the summary of {len(older)} turns is {len(encoded)} bytes, over the {max_content_bytes} a turn may "
            "hold (MAX_CONTENT_BYTES); nothing changed", reason="SUMMARY_TOO_LARGE",
            metadata={"summary_bytes": str(len(encoded)), "max_content_bytes": str(max_content_bytes)})
    score = await asyncio.to_thread(retention, texts, summary)  # CPU over every older turn: off the event loop
    if score.score < RETENTION_FLOOR:
        missing = ", ".join(f"{f.kind} {f.value!r}" for f in score.missing[:20])
        raise FailedPrecondition(
            f"the summary keeps {score.kept} of {score.total} facts of the turns it would replace "
            f"(fact_retention_score {score.score:.4f} < {RETENTION_FLOOR}); missing: {missing}; nothing changed",
            reason="QUALITY_GUARDRAIL_TRIGGERED",
            metadata={"fact_retention_score": f"{score.score:.6f}", "facts": str(score.total),
                      "facts_kept": str(score.kept), "missing": missing})
    return CompactionPlan(session_id, tuple(t.event_id for t in older), encoded, score,
                          sum(t.token_count for t in older), count_tokens(summary, TOKEN_MODEL))
