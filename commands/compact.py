"""Compact (clearance L3+, and only the session's owner scope: visibility.may_rewrite, as
RollbackContext): strategy sliding_window (inference/compaction.py, which the compaction worker
runs too) keeps the session's most recent turns verbatim
(COMPACTION_KEEP_RECENT_TURNS) and replaces the older ones written at the owner scope in its
history with a summary, one line per kept turn; the replaced turns stay retrievable
(docs/compaction.md).

A summary that would not cut the session's tokens by COMPACTION_MIN_SAVINGS is refused
(FAILED_PRECONDITION, INSUFFICIENT_SAVINGS). The summary is scored by inference.facts.retention
against the turns it replaces; below 0.98, or stating what they do not, the answer is
FAILED_PRECONDITION (QUALITY_GUARDRAIL_TRIGGERED, the score and the facts in the details). Either
way nothing is written. Otherwise a session.compacted event carries the version the
turns were read at; the projector refuses it if the session has moved on (STALE), so of two
concurrent Compacts one wins and the other is ABORTED (SESSION_CHANGED), nothing written."""

from __future__ import annotations

from dataclasses import dataclass

from commands import access_audit
from commands.deps import Deps
from commands.session_access import refused_write, require_rewritable, visible_session
from context_engine import clearance, metrics, validation
from context_engine.auth import Principal
from context_engine.errors import Aborted, DomainError, InvalidArgument
from context_engine.events import Event, SessionRef
from context_engine.hashing import next_version
from inference.compaction import STRATEGIES, plan_sliding_window
from projections.projector.outcome import ProjectionOutcome
from projections.reads import compaction as compaction_reads
from projections.reads import sessions
from projections.store.pool import org_transaction


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
    access_audit.require_clearance(deps, principal, clearance.Action.COMPACT, "session", command.session_id,
                                   "compact")
    validation.session_id(command.session_id)
    if command.strategy not in STRATEGIES:
        raise InvalidArgument("strategy", f"{command.strategy[:64]!r} is not supported; the only strategy is "
                                          "'sliding_window'", reason="UNSUPPORTED_STRATEGY")
    org = principal.scope.org_id
    async with visible_session(deps, principal, command.session_id, "compact",
                               require=require_rewritable) as (conn, session):
        base = session.version
        turns = await sessions.owner_turns(conn, org, command.session_id, session.scope_path)
        session_tokens = await sessions.active_tokens(conn, org, command.session_id)
    try:
        plan = await plan_sliding_window(deps.summarizer, command.session_id, turns,
                                         keep_recent=deps.settings.compaction_keep_recent_turns,
                                         max_content_bytes=deps.settings.max_content_bytes,
                                         session_tokens=session_tokens,
                                         min_savings=deps.settings.compaction_min_savings)
    except DomainError as exc:
        metrics.COMPACTIONS.labels("rpc", exc.reason.lower()).inc()
        raise
    body = plan.event_body(base, command.strategy, deps.summarizer.name)
    ref = SessionRef(org, command.session_id)
    event = Event.of(body, scope=principal.scope, actor=principal.subject, aggregate=ref.aggregate,
                     event_id=plan.compaction_id)
    outcome = await deps.append(event, ref)
    if outcome == ProjectionOutcome.OUT_OF_SCOPE:
        raise refused_write(deps, principal, command.session_id, "compact")
    if outcome is None:  # acknowledged without the projector's word: the compactions table says
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            applied = await compaction_reads.compaction_applied(conn, org, event.event_id)
        outcome = ProjectionOutcome.APPLIED if applied else ProjectionOutcome.STALE
    if outcome in (ProjectionOutcome.STALE, ProjectionOutcome.UNKNOWN_TARGET):
        metrics.COMPACTIONS.labels("rpc", "session_changed").inc()
        raise Aborted(f"session {command.session_id!r} changed while it was being compacted (another write or "
                      "compaction came first); nothing changed, call again to compact its new state",
                      reason="SESSION_CHANGED")
    metrics.COMPACTIONS.labels("rpc", "compacted").inc()
    return Compacted(next_version(base, event.content_hash), plan.original_tokens, plan.compacted_tokens,
                     plan.score.score)
