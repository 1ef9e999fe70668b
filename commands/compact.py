"""Compact (clearance L3+, and only the session's owner scope: visibility.may_rewrite, as
RollbackContext): strategy sliding_window keeps the session's most recent turns verbatim
(COMPACTION_KEEP_RECENT_TURNS) and replaces the older ones written at the owner scope with one
summary turn (docs/compaction.md).

The summary is scored by inference.facts.retention against the turns it replaces; below 0.98 the
answer is FAILED_PRECONDITION (QUALITY_GUARDRAIL_TRIGGERED, the score and the missing facts in
the details) and nothing is written. Otherwise a session.compacted event carries the version the
turns were read at; the projector refuses it if the session has moved on (STALE), so of two
concurrent Compacts one wins and the other is ABORTED (SESSION_CHANGED), nothing written."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

from commands.deps import Deps
from commands.session_access import refused_write, require_rewritable, visible_session
from context_engine import clearance, validation
from context_engine.auth import Principal
from context_engine.errors import Aborted, FailedPrecondition, InvalidArgument, Unavailable
from context_engine.events import Event, SessionCompacted, SessionRef
from context_engine.hashing import next_version
from inference.facts import RETENTION_FLOOR, retention
from inference.summarizers import SummarizerError, Turn
from inference.tokens import count_tokens
from projections import queries
from projections.database import org_transaction
from projections.projector.outcome import Outcome

STRATEGIES = ("sliding_window",)
TOKEN_MODEL = "gpt-4"  # turns are counted in cl100k at ingest; the summary is counted the same way


@dataclass(frozen=True)
class Compact:
    session_id: str
    strategy: str


@dataclass(frozen=True)
class Compacted:
    version_hash: str
    original_tokens: int
    compacted_tokens: int
    fact_retention_score: float


async def compact(deps: Deps, principal: Principal, command: Compact) -> Compacted:
    clearance.require(principal.clearance, clearance.Action.COMPACT)
    validation.session_id(command.session_id)
    if command.strategy not in STRATEGIES:
        raise InvalidArgument("strategy", f"{command.strategy[:64]!r} is not supported; the only strategy is "
                                          "'sliding_window'", reason="UNSUPPORTED_STRATEGY")
    org = principal.scope.org_id
    async with visible_session(deps, principal, command.session_id, "compact",
                               require=require_rewritable) as (conn, session):
        base = session.version
        turns = await queries.owner_turns(conn, org, command.session_id, session.scope_path)
    keep = deps.settings.compaction_keep_recent_turns
    older = turns[:-keep] if len(turns) > keep else []
    if len(older) < 2:
        raise FailedPrecondition(
            f"session {command.session_id!r} has {len(turns)} turns at its owner scope; sliding_window keeps the "
            f"last {keep} and needs at least 2 older ones to compact", reason="NOTHING_TO_COMPACT",
            metadata={"turns": str(len(turns)), "keep_recent_turns": str(keep)})
    texts = [t.content.decode("utf-8", errors="replace") for t in older]
    try:
        summary = await deps.summarizer.summarize([Turn(t.role, text) for t, text in zip(older, texts)])
    except SummarizerError as exc:
        raise Unavailable(f"the summarizer failed: {exc}", reason="SUMMARIZER_UNAVAILABLE") from exc
    encoded, limit = summary.encode(), deps.settings.max_content_bytes
    if len(encoded) > limit:
        raise FailedPrecondition(
            f"the summary of {len(older)} turns is {len(encoded)} bytes, over the {limit} a turn may hold "
            "(MAX_CONTENT_BYTES); nothing changed", reason="SUMMARY_TOO_LARGE",
            metadata={"summary_bytes": str(len(encoded)), "max_content_bytes": str(limit)})
    score = await asyncio.to_thread(retention, texts, summary)  # CPU over every older turn: off the event loop
    if score.score < RETENTION_FLOOR:
        missing = ", ".join(f"{f.kind} {f.value!r}" for f in score.missing[:20])
        raise FailedPrecondition(
            f"the summary keeps {score.kept} of {score.total} facts of the turns it would replace "
            f"(fact_retention_score {score.score:.4f} < {RETENTION_FLOOR}); missing: {missing}; nothing changed",
            reason="QUALITY_GUARDRAIL_TRIGGERED",
            metadata={"fact_retention_score": f"{score.score:.6f}", "facts": str(score.total),
                      "facts_kept": str(score.kept), "missing": missing})
    original = sum(t.token_count for t in older)
    compacted = count_tokens(summary, TOKEN_MODEL)
    body = SessionCompacted(command.session_id, base, tuple(t.event_id for t in older),
                            base64.b64encode(encoded).decode(), command.strategy, deps.summarizer.name,
                            score.score, original, compacted)
    ref = SessionRef(org, command.session_id)
    event = Event.of(body, scope=principal.scope, actor=principal.subject, aggregate=ref.aggregate)
    outcome = await deps.append(event, ref)
    if outcome == Outcome.OUT_OF_SCOPE:
        raise refused_write(deps, principal, command.session_id, "compact")
    if outcome is None:  # acknowledged without the projector's word: its summary row says
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            outcome = Outcome.APPLIED if await queries.event_by_id(conn, org, event.event_id) else Outcome.STALE
    if outcome in (Outcome.STALE, Outcome.UNKNOWN_TARGET):
        raise Aborted(f"session {command.session_id!r} changed while it was being compacted (another write or "
                      "compaction came first); nothing changed, call again to compact its new state",
                      reason="SESSION_CHANGED")
    return Compacted(next_version(base, event.content_hash), original, compacted, score.score)
