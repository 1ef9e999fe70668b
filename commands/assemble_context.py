"""AssembleContext: the hot path. Layers, pinned chunks, required items, retrieved chunks and
recent history packed within the caller's token budget (projections/assembly/packing.py), with the
quality attestation, savings sampling and the compaction trigger (docs/assembly.md).

This module orchestrates (validate, read, retrieve, pack, attest, telemetry) and holds no SQL:
the session's reads are `projections.reads.session_reads.read_session`, one read-only transaction
(app.org_id set); retrieval is `projections.reads.search`, the code path Search uses, with the
named recipe `recipes.assembly(token_budget)` (projections/retrieval/recipes.py: its depth, its
grant permission, its plan mode) where Search passes `recipes.SEARCH`, so the two report the same
outcome for the same retrieval.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import random
import uuid
from dataclasses import dataclass, field

import structlog

from commands import access_audit
from commands.deps import Deps
from commands.session_access import require_readable
from context_engine import validation
from context_engine.auth import Principal
from context_engine.concurrency import alongside
from context_engine.errors import DomainError, InvalidArgument, NotFound
from context_engine.events import CompactionThreshold, Event, SessionRef
from context_engine.guardrails.trust import trusted_fingerprints
from context_engine.hashing import merkle_root, sha256_hex
from context_engine.metrics import timed
from context_engine.scope import Scope
from context_engine.visibility import Visibility, may_rewrite
from inference import tokens
from projections.assembly import turn_labels
from projections.assembly.packing import Block, Packed, pack
from projections.projector.outcome import ProjectionOutcome
from projections.reads import corpus_totals, session_reads, sessions
from projections.reads.quarantined_matches import Quarantined
from projections.reads.search import MAX_QUERY_BYTES, ChunkHit, SearchOutcome, SearchQuery, search
from projections.reads.session_reads import MUST_INCLUDE_HINT, PINNED_HINT, SessionReads
from projections.retrieval import recipes
from projections.retrieval.outcome import RetrievalOutcome
from projections.store.pool import org_transaction
from streams.jobs import baseline_metric
from streams.topics import LogTopics

log = structlog.get_logger("context_engine.assembly")

MAX_HINT_ITEMS = 32
MEMORY_KEYS = ("working", "episodic", "semantic")
RECENT_SHARE_HINT = "recent_share"  # the share of the budget reserved for the recent window, this call
# History turns read: those whose newer turns hold at most this many times the budget in stored
# (cl100k) tokens. The history section never holds more than the budget, so the rest of a long
# session is not read; the encodings differ by far less than 2x on text, and if the turns read do
# not fill the budget all the same the window is read again in full (the same prompt either way).
HISTORY_READ_FACTOR = 2


@dataclass(frozen=True)
class AssembleContext:
    session_id: str
    task_description: str = ""
    token_budget: int = 0
    model_id: str = ""
    hints: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Quality:
    confidence_score: float
    expansion_applied: bool
    fallback_used: bool
    fallback_reason: str
    retrieval_outcome: RetrievalOutcome
    effective_min_score: float
    results_below_threshold: int


@dataclass(frozen=True)
class Assembled:
    prompt_id: str
    prompt: str
    cache_prefix_bytes: int
    assembled_tokens: int
    baseline_tokens: int
    savings_ratio: float
    version_hash: str
    chunk_ids: list[str]
    quality: Quality
    quarantined: Quarantined = Quarantined(0)  # matches of task_description the PII scan holds back
    compaction_requested: str = ""  # the compaction request this call opened (its opening event), if any


def _hint_list(hints: dict[str, str], key: str) -> list[str]:
    items = [x.strip() for x in hints.get(key, "").split(",") if x.strip()]
    if len(items) > MAX_HINT_ITEMS:
        raise InvalidArgument(f"hints.{key}", f"holds {len(items)} items; at most {MAX_HINT_ITEMS}")
    return list(dict.fromkeys(items))


def _recent_share(hints: dict[str, str], default: float) -> float:
    """hints["recent_share"]: a number in [0, 1], the share of the budget the recent window may
    take before retrieval; the deployment's ASSEMBLY_RECENT_SHARE without it."""
    raw = hints.get(RECENT_SHARE_HINT)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # NaN included
        raise InvalidArgument(f"hints.{RECENT_SHARE_HINT}",
                              f"{raw[:40]!r} is not a share of the budget: a number from 0 to 1, such as 0.25")
    return value


def _validate(cmd: AssembleContext, max_budget: int) -> tuple[list[str], list[str]]:
    validation.session_id(cmd.session_id)
    if not 1 <= cmd.token_budget <= max_budget:
        raise InvalidArgument("token_budget", f"must be between 1 and {max_budget}, got {cmd.token_budget}")
    validation.label(cmd.model_id, "model_id")
    if len(cmd.task_description.encode()) > MAX_QUERY_BYTES:
        raise InvalidArgument("task_description", f"must be at most {MAX_QUERY_BYTES} bytes")
    pinned = _hint_list(cmd.hints, PINNED_HINT)
    for chunk_id in pinned:
        validation.uuid_text(chunk_id, f"hints.{PINNED_HINT}", "chunk id")
    pinned = list(dict.fromkeys(str(uuid.UUID(i)) for i in pinned))  # one id, however it is spelled
    required = _hint_list(cmd.hints, MUST_INCLUDE_HINT)
    for i, key in enumerate(required):
        if key.startswith("event:"):
            validation.uuid_text(key.split(":", 1)[1], f"hints.{MUST_INCLUDE_HINT}", "event id")
            required[i] = f"event:{uuid.UUID(key.split(':', 1)[1])}"
        elif key not in MEMORY_KEYS:
            raise InvalidArgument(f"hints.{MUST_INCLUDE_HINT}",
                                  f"{key[:40]!r} is not a key: use one of {', '.join(MEMORY_KEYS)} or event:<event_id>")
    return pinned, list(dict.fromkeys(required))


async def assemble_context(deps: Deps, principal: Principal, cmd: AssembleContext) -> Assembled:
    pinned_ids, required_keys = _validate(cmd, deps.settings.max_token_budget)
    recent_share = _recent_share(cmd.hints, deps.settings.assembly_recent_share)
    scope, org = principal.scope, principal.scope.org_id
    visible = Visibility.of(scope)
    with timed("assemble", "freshness_wait"):
        await deps.freshness.wait(SessionRef(org, cmd.session_id))
    floor = deps.settings.tenant_min_score(org)
    # Retrieval runs on its own connection while the session's rows are read.
    async with alongside(_retrieve(deps, scope, cmd.task_description, floor,
                                   cmd.token_budget)) as retrieval_task:
        with timed("assemble", "session_read"):
            reads = await _read_session(deps, principal, cmd, pinned_ids, required_keys)
        with timed("assemble", "retrieval_wait"):
            retrieval, failure = await retrieval_task
    retrieved = [_retrieved_block(s.payload, s.score, cmd.session_id)
                 for s in (retrieval.result.results if retrieval else ())]

    count = functools.partial(tokens.count_tokens_remembered, model_id=cmd.model_id)

    def packed_with(history: list[Block]) -> Packed:
        return pack(layers=reads.layers, pinned=reads.pinned, required=reads.required, retrieved=retrieved,
                    history_newest_first=history, budget=cmd.token_budget, count=count, recent_share=recent_share)

    with timed("assemble", "packing"):
        packed = packed_with(reads.history_newest_first)
    if reads.history_truncated and _history_exhausted(packed, reads.history_newest_first):
        with timed("assemble", "history_reread"):  # rare: the turns read were not enough to fill the budget
            async with org_transaction(deps.pool, org, readonly=True) as conn:
                history = await session_reads.read_history(conn, org, cmd.session_id, visible,
                                                           deps.settings.history_window)
            packed = packed_with(history)
    prompt_id = sha256_hex(packed.prompt.encode("utf-8"))
    with timed("assemble", "chunk_ids"):
        chunk_ids = await _chunk_ids(deps, org, visible, packed)
    _audit_shared(deps, principal, packed, {**(retrieval.shared if retrieval else {}), **reads.pinned_shares})
    quality = _quality(retrieval, failure, packed, retrieved, floor)
    baseline = 0
    if random.random() < deps.settings.tenant_sample_rate(org):
        with timed("assemble", "baseline"):
            baseline = await _baseline(deps, org, visible, reads.layers, count, reads.visible_session_tokens, packed,
                                       prompt_id, cmd, scope)
    with timed("assemble", "compaction_trigger"):
        requested = await _compaction_trigger(deps, principal, cmd, reads)
    return Assembled(
        prompt_id=prompt_id, prompt=packed.prompt, cache_prefix_bytes=packed.prefix_bytes,
        assembled_tokens=packed.tokens, baseline_tokens=baseline,
        savings_ratio=(baseline - packed.tokens) / baseline if baseline else 0.0,
        version_hash=merkle_root([sha256_hex(b.text.encode("utf-8")) for b in packed.blocks]),
        chunk_ids=chunk_ids, quality=quality, quarantined=retrieval.quarantined if retrieval else Quarantined(0),
        compaction_requested=requested)


async def _read_session(deps: Deps, principal: Principal, cmd: AssembleContext, pinned_ids: list[str],
                        required_keys: list[str]) -> SessionReads:
    """The session's reads (projections/reads/session_reads.py) in one read-only transaction: history
    turns only as far back as HISTORY_READ_FACTOR times the budget in stored tokens. A session
    or a pinned chunk of another scope is refused as absent, and audited."""
    scope = principal.scope
    trusted = trusted_fingerprints(deps.settings)  # UNAVAILABLE rather than a prompt without its layers

    try:
        async with org_transaction(deps.pool, scope.org_id, readonly=True) as conn:
            session = await sessions.get_session(conn, scope.org_id, cmd.session_id)
            if session is not None:  # refused before anything else is read
                try:
                    require_readable(session, scope, cmd.session_id)
                except NotFound:
                    access_audit.denied(deps, principal, "session", cmd.session_id, "use_in_assembly", "not_visible")
                    raise
            return await session_reads.read_session(
                conn, scope, cmd.session_id, session, trusted=trusted, pinned_ids=pinned_ids,
                required_keys=required_keys, window=deps.settings.history_window,
                read_tokens=int(HISTORY_READ_FACTOR * cmd.token_budget),
                scans=session_reads.ScanWait(deps.pool, deps.settings.pii_scan_wait_seconds))
    except NotFound as exc:
        if exc.reason == "PINNED_CHUNK_NOT_FOUND":
            await access_audit.denied_resources(deps, principal, "chunk", exc.metadata["chunk_ids"].split(","),
                                                "use_in_assembly")
        elif exc.reason == "MUST_INCLUDE_NOT_FOUND" and "event_id" in exc.metadata:
            async with org_transaction(deps.pool, scope.org_id, readonly=True) as conn:
                owner = await sessions.event_owner(conn, scope.org_id, exc.metadata["event_id"])
            if owner is not None and not Visibility.of(scope).sees(owner):  # another scope's event
                access_audit.denied(deps, principal, "event", exc.metadata["event_id"], "use_in_assembly",
                                    "not_visible")
        raise


def _retrieved_block(hit: ChunkHit, score: float, session_id: str) -> Block:
    """A retrieved chunk with its speaker and time; its time label says where it is from when
    that is not this session: another session, or pushed memory."""
    time = turn_labels.turn_time(hit.metadata, hit.created_at)
    if hit.source_kind == "memory":
        time = f"{time}, memory"
    elif hit.session_id != session_id:
        time = f"{time}, session {hit.session_id}"
    return Block("retrieved", turn_labels.with_speaker(hit.content, hit.metadata), key=hit.chunk_id, score=score,
                 source=hit.source_event_id, time=time,
                 at=(hit.created_at.astimezone(dt.UTC).isoformat(), hit.source_event_id, hit.chunk_index))


def _audit_shared(deps: Deps, principal: Principal, packed: Packed, shared: dict[str, str]) -> None:
    """An audited use of each chunk in the prompt that came through a grant."""
    for b in packed.blocks:
        if b.kind in ("pinned", "retrieved") and b.key in shared:
            access_audit.allowed(deps, principal, "chunk", b.key, "use_in_assembly", share_id=shared[b.key])


def _history_exhausted(packed: Packed, history: list[Block]) -> bool:
    """Whether packing used up every history turn it was given (each is in the prompt, or left
    out as pinned or required there): then older turns might have fit too."""
    in_prompt = {b.key for b in packed.blocks if b.kind == "history"}
    elsewhere = {b.source for b in packed.blocks if b.kind in ("pinned", "required") and b.source}
    return all(b.key in in_prompt or b.source in elsewhere for b in history)


async def _retrieve(deps: Deps, scope, task: str, floor: float, token_budget: int
                    ) -> tuple[SearchOutcome | None, str]:
    if not task.strip():
        return None, "no task_description: recency-only context"
    try:
        return await search(deps.pool, deps.query_vectors, scope, SearchQuery(query=task), floor,
                            recipe=recipes.assembly(token_budget)), ""
    except DomainError as exc:
        if isinstance(exc, InvalidArgument):
            raise InvalidArgument("task_description", exc.message) from exc
        return None, f"retrieval failed: {exc.message}"
    except Exception as exc:  # the hot path degrades to recency, and says so
        log.exception("retrieval failed; assembling from recency")
        return None, f"retrieval failed: {type(exc).__name__}: {exc}"


def _quality(retrieval: SearchOutcome | None, failure: str, packed: Packed, retrieved: list[Block],
             floor: float) -> Quality:
    """The attestation; a retrieved chunk counts as included when it is in the prompt: in the
    retrieved section, pinned, or as part of its turn in the history or the required items
    (prompt_packing.py shows each once)."""
    if retrieval is None:
        return Quality(0.0, False, True, failure, RetrievalOutcome.UNSPECIFIED, floor, 0)
    r = retrieval.result
    in_prompt = {b.key for b in packed.blocks if b.kind in ("retrieved", "pinned")}
    turns = {b.source for b in packed.blocks if b.kind in ("history", "required") and b.source}
    included = [b.score for b in retrieved if b.score is not None and (b.key in in_prompt or b.source in turns)]
    confidence = sum(included) / len(included) if included else 0.0
    if r.outcome in (RetrievalOutcome.NO_RESULTS, RetrievalOutcome.BELOW_THRESHOLD):
        used, reason = True, r.outcome_name
    elif not included:
        used, reason = False, f"{r.outcome_name}: none of the {len(r.results)} retrieved chunks fit the token budget"
    else:
        used, reason = False, ""
    if reason and retrieval.quarantined.items:  # the prompt carries no retrieved chunk: say what is held back
        reason = f"{reason}; {retrieval.quarantined.describe()}"
    return Quality(confidence, retrieval.expansion_applied, used, reason, r.outcome, r.effective_min_score,
                   r.results_below_threshold)


async def _chunk_ids(deps: Deps, org: str, visible: Visibility, packed: Packed) -> list[str]:
    """Chunk ids in prompt order: pinned and retrieved chunks, and the chunks of included turns."""
    sources = [b.source for b in packed.blocks if b.kind in ("history", "required") and b.source and not b.chunks]
    by_source: dict[str, list[str]] = {}
    if sources:
        async with org_transaction(deps.pool, org, readonly=True) as conn:
            by_source = await session_reads.chunk_ids_by_source(conn, org, visible, sources)
    out: list[str] = []
    for b in packed.blocks:
        if b.kind in ("pinned", "retrieved"):
            out.append(b.key)
        elif b.chunks:  # a retrieved turn shown in its summary line's place: the chunks retrieved
            out += b.chunks
        elif b.source:
            out += by_source.get(b.source, [])
    return list(dict.fromkeys(out))  # a pinned chunk of a required turn is listed once


async def _baseline(deps: Deps, org, visible: Visibility, layers, count, session_tokens: int, packed: Packed,
                    prompt_id: str, cmd: AssembleContext, scope) -> int:
    """The naive prompt's tokens: every layer, the whole session history, every other chunk the
    caller could retrieve, unoptimised. History and corpus use the counts stored at ingest (cl100k)."""
    async with org_transaction(deps.pool, org, readonly=True) as conn:
        corpus = await corpus_totals.tokens_outside_session(conn, org, visible, cmd.session_id)
    naive = sum(count(b.text) for b in layers) + int(session_tokens) + corpus
    naive = max(naive, packed.tokens)
    job = baseline_metric(scope, prompt_id=prompt_id, session_id=cmd.session_id, assembled_tokens=packed.tokens,
                          naive_tokens=naive, model_id=cmd.model_id)
    try:
        await deps.log.publish(LogTopics.from_settings(deps.settings).jobs["metrics:baseline"], org, job.value)
    except Exception:  # telemetry never fails the hot path
        log.warning("baseline metric not published", org_id=org, prompt_id=prompt_id)
    return naive


async def _compaction_trigger(deps: Deps, principal: Principal, cmd: AssembleContext, reads: SessionReads) -> str:
    """Record a crossing of the compaction threshold, which asks the worker to compact the session:
    only the owner scope's own calls do, as only it may compact the session (visibility.may_rewrite);
    a grantee's or a scope below the owner's assembly never rewrites what the owner's readers see.
    Nothing is asked while compaction on threshold is off, nor again for a session version the
    worker refused. Returns the request this call opened (the id of its opening event), or ""."""
    if (not deps.settings.compaction_on_threshold or reads.owner_path is None
            or not may_rewrite(Scope.from_path(reads.owner_path), principal.scope)):
        return ""
    session_tokens = reads.session_tokens
    crossed = session_tokens > deps.settings.compaction_threshold * cmd.token_budget
    if crossed == reads.compaction_open or (crossed and reads.compaction_refused):
        return ""
    session = SessionRef(principal.scope.org_id, cmd.session_id)
    event = Event.of(CompactionThreshold(cmd.session_id, crossed, int(session_tokens), cmd.token_budget),
                     scope=principal.scope, aggregate=session.aggregate, actor=principal.subject)
    try:
        outcome = await deps.append(event, session)
    except Exception:  # the next call observes the crossing again
        log.warning("compaction threshold not recorded", org_id=session.org_id, session_id=cmd.session_id)
        return ""
    return event.event_id if crossed and outcome == ProjectionOutcome.APPLIED else ""
