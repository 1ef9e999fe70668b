"""The ContextEngine servicer: protobuf in, one handler call, protobuf out. The caller is the
Principal the Authentication interceptor verified; its scope already equals request.scope.

Methods whose issue has not landed answer UNIMPLEMENTED with a message naming that issue.
"""

from __future__ import annotations

import datetime as dt
import re

from google.protobuf.timestamp_pb2 import Timestamp

from commands.assemble_context import AssembleContext, assemble_context
from commands.compact import Compact, compact
from commands.create_share import CreateShare, create_share
from commands.create_snapshot import CreateSnapshot, create_snapshot
from commands.deps import Deps
from commands.embed_texts import EmbedTexts, embed_texts
from commands.idempotency import IDEMPOTENCY_HEADER
from commands.ingest_event import IngestEvent, ingest_event
from commands.list_shares import ListShares, list_shares
from commands.pull_context import PullContext, pull_context
from commands.push_context import PushContext, push_context
from commands.resolve_guardrail_layers import resolve_guardrail_layers
from commands.revoke_share import RevokeShare, revoke_share
from commands.rollback_context import RollbackContext, rollback_context
from commands.search import search
from commands.validate_prompt import ValidatePrompt, validate_prompt
from context_engine import validation
from context_engine.errors import Unimplemented
from context_engine.guardrails.trust import load_trust
from entrypoints.api.interceptors import current_principal
from entrypoints.serving.interceptors import metadata_value
from projections.reads.quarantined_matches import Quarantined
from projections.reads.search import SearchQuery
from projections.retrieval.fusion import HYBRID
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

# Where each RPC not built yet is built: the issue that brings it.
PENDING: dict[str, str] = {}


def _idempotency_key(context) -> str:
    """The `idempotency-key` header, checked (validation.idempotency_key), or "" without one."""
    return validation.idempotency_key(metadata_value(context, IDEMPOTENCY_HEADER) or "", IDEMPOTENCY_HEADER)


def timestamp(moment: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(moment)
    return ts


class ContextEngineServicer(context_pb2_grpc.ContextEngineServicer):
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        load_trust(deps.settings)  # at start, not in a call: the first read of the key files

    async def AssembleContext(self, request: pb.AssembleContextRequest, context) -> pb.AssembleContextResponse:
        a = await assemble_context(self.deps, current_principal(), AssembleContext(
            session_id=request.session_id, task_description=request.task_description,
            token_budget=request.token_budget, model_id=request.model_id, hints=dict(request.hints)))
        q = a.quality
        compaction = (("engine.compaction_requested", a.compaction_requested),) if a.compaction_requested else ()
        context.set_trailing_metadata(quarantine_metadata(a.quarantined) + compaction)
        return pb.AssembleContextResponse(
            prompt_id=a.prompt_id, assembled_prompt=a.prompt, cache_prefix_bytes=a.cache_prefix_bytes,
            assembled_tokens=a.assembled_tokens, baseline_tokens=a.baseline_tokens, savings_ratio=a.savings_ratio,
            version_hash=a.version_hash, chunk_ids=a.chunk_ids,
            quality=pb.QualityAttestation(
                confidence_score=q.confidence_score, expansion_applied=q.expansion_applied,
                fallback_used=q.fallback_used, fallback_reason=q.fallback_reason,
                retrieval_outcome=int(q.retrieval_outcome), effective_min_score=q.effective_min_score,
                results_below_threshold=q.results_below_threshold))

    async def IngestEvent(self, request: pb.IngestEventRequest, context) -> pb.IngestEventResponse:
        result = await ingest_event(self.deps, current_principal(), IngestEvent(
            session_id=request.session_id, event_type=request.event_type, content=request.content,
            metadata=dict(request.metadata), idempotency_key=_idempotency_key(context)))
        return pb.IngestEventResponse(event_id=result.event_id, version_hash=result.version_hash,
                                      token_count=result.token_count)

    async def PushContext(self, request: pb.PushContextRequest, context) -> pb.PushContextResponse:
        result = await push_context(self.deps, current_principal(), PushContext(
            session_id=request.session_id, memory_type=request.memory_type, content=request.content,
            metadata=dict(request.metadata), idempotency_key=_idempotency_key(context)))
        return pb.PushContextResponse(version_hash=result.version_hash, created_at=timestamp(result.created_at))

    async def PullContext(self, request: pb.PullContextRequest, context) -> pb.PullContextResponse:
        result = await pull_context(self.deps, current_principal(), PullContext(
            agent_id=request.agent_id, session_id=request.session_id, snapshot_name=request.snapshot_name))
        memory = result.memory
        metadata = dict(memory.metadata)
        if memory.pii_status != "clear":  # say so: this content is the fail-closed fallback's
            metadata["engine.pii_status"] = memory.pii_status
        return pb.PullContextResponse(version_hash=result.version_hash, memory_type=memory.memory_type,
                                      content=memory.content, created_at=timestamp(memory.created_at),
                                      metadata=metadata)

    async def CreateSnapshot(self, request: pb.CreateSnapshotRequest, context) -> pb.CreateSnapshotResponse:
        result = await create_snapshot(self.deps, current_principal(), CreateSnapshot(
            session_id=request.session_id, snapshot_name=request.snapshot_name))
        return pb.CreateSnapshotResponse(snapshot_id=result.snapshot_id, version_hash=result.version_hash,
                                         created_at=timestamp(result.created_at))

    async def RollbackContext(self, request: pb.RollbackContextRequest, context) -> pb.RollbackContextResponse:
        result = await rollback_context(self.deps, current_principal(), RollbackContext(
            session_id=request.session_id, target_version_hash=request.target_version_hash))
        return pb.RollbackContextResponse(restored_version_hash=result.restored_version_hash,
                                          rolled_back_at=timestamp(result.rolled_back_at))

    async def Compact(self, request: pb.CompactRequest, context) -> pb.CompactResponse:
        result = await compact(self.deps, current_principal(), Compact(session_id=request.session_id,
                                                                       strategy=request.strategy))
        return pb.CompactResponse(version_hash=result.version_hash, original_tokens=result.original_tokens,
                                  compacted_tokens=result.compacted_tokens,
                                  fact_retention_score=result.fact_retention_score)

    async def CreateShare(self, request: pb.CreateShareRequest, context) -> pb.CreateShareResponse:
        result = await create_share(self.deps, current_principal(), CreateShare(
            resource_id=request.resource_id, resource_type=request.resource_type,
            grantee_scope=request.grantee_scope, grantee_scope_id=request.grantee_scope_id,
            permissions=tuple(request.permissions), reason=request.reason))
        return pb.CreateShareResponse(share_id=result.share_id, created_at=timestamp(result.created_at))

    async def RevokeShare(self, request: pb.RevokeShareRequest, context) -> pb.RevokeShareResponse:
        result = await revoke_share(self.deps, current_principal(), RevokeShare(
            share_id=request.share_id, reason=request.reason))
        return pb.RevokeShareResponse(revoked_at=timestamp(result.revoked_at))

    async def ListShares(self, request: pb.ListSharesRequest, context) -> pb.ListSharesResponse:
        result = await list_shares(self.deps, current_principal(), ListShares(
            page=request.page, page_size=request.page_size))
        return pb.ListSharesResponse(total_count=result.total_count, shares=[
            pb.ShareGrant(share_id=g.share_id, resource_id=g.resource_id, resource_type=g.resource_type,
                          grantor_scope_id=g.grantor_path, grantee_scope=g.grantee_scope,
                          grantee_scope_id=g.grantee_path, permissions=list(g.permissions), reason=g.reason,
                          created_at=timestamp(g.created_at))
            for g in result.grants])

    async def Search(self, request: pb.SearchRequest, context) -> pb.SearchResponse:
        outcome = await search(self.deps, current_principal(), SearchQuery(
            query=request.query, domain=request.domain, top_k=request.top_k, min_score=request.min_score))
        r = outcome.result
        context.set_trailing_metadata(quarantine_metadata(outcome.quarantined))
        return pb.SearchResponse(
            results=[pb.SearchResult(chunk_id=s.chunk_id, content=s.payload.content, score=s.score,
                                     source=s.payload.source,
                                     metadata=search_result_metadata(s, outcome.expansion_applied,
                                                                     outcome.share_of(s.chunk_id)))
                     for s in r.results],
            effective_min_score=r.effective_min_score, results_below_threshold=r.results_below_threshold,
            outcome=int(r.outcome))

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        result = await embed_texts(self.deps, self.deps.embedder, current_principal().scope,
                                   EmbedTexts(texts=list(request.texts), model_version=request.model_version))
        return pb.EmbedResponse(
            embeddings=[pb.EmbeddingVector(values=v.tolist(), cached=c)
                        for v, c in zip(result.vectors, result.cached)],
            model_version=result.model_version)


    async def ResolveGuardrailLayers(self, request: pb.ResolveGuardrailLayersRequest,
                                     context) -> pb.ResolveGuardrailLayersResponse:
        layers = await resolve_guardrail_layers(self.deps, current_principal())
        return pb.ResolveGuardrailLayersResponse(layers=[
            pb.GuardrailLayer(layer_level=r.level, content_hash=r.content_hash, version=r.version,
                              effective_at=r.effective_at_ms) for r in layers])

    async def ValidatePrompt(self, request: pb.ValidatePromptRequest, context) -> pb.ValidatePromptResponse:
        v = await validate_prompt(self.deps, current_principal(), ValidatePrompt(
            prompt=request.prompt, layer_hashes=list(request.layer_hashes)))
        return pb.ValidatePromptResponse(valid=v.valid, violation_code=v.violation_code or "",
                                         violation_detail=v.violation_detail or "")


def search_result_metadata(scored, expansion_applied: bool, share_id: str = "") -> dict[str, str]:
    """The chunk's own metadata plus why it was returned: its provenance, the share it came
    through when the caller sees it only by a grant, and each fused signal (keys under `engine.`;
    docs/retrieval.md)."""
    hit = scored.payload
    meta = {str(k): v if isinstance(v, str) else str(v) for k, v in hit.metadata.items()}
    meta.update({
        "engine.source_kind": hit.source_kind,
        "engine.source_event_id": hit.source_event_id,
        "engine.session_id": hit.session_id or "",
        "engine.chunk_index": str(hit.chunk_index),
        "engine.domain": hit.domain,
        "engine.scope": hit.scope_path,
        "engine.created_at": hit.created_at.isoformat(),
        "engine.score.vector": f"{scored.vector:.6f}",
        "engine.score.lexical": f"{scored.lexical:.6f}",
        "engine.score.recency": f"{scored.recency:.6f}",
        "engine.score.neighbour": f"{scored.neighbour:.6f}",
        "engine.bm25": f"{hit.bm25:.6f}",
        "engine.fusion": HYBRID.name,
        "engine.expansion_applied": "true" if expansion_applied else "false",
    })
    if share_id:
        meta["engine.share_id"] = share_id
    return meta


def quarantine_metadata(quarantined: Quarantined) -> tuple[tuple[str, str], ...]:
    """Trailing metadata: how many items matching the query are held back by the PII scan, and
    why (projections/reads/quarantined_matches.py). Printable ASCII, as a text metadata value must be
    (any other byte would fail the whole call)."""
    pairs = [("engine.quarantined_matches", str(quarantined.items))]
    if quarantined.items:
        pairs.append(("engine.quarantine_reason", _PRINTABLE_ASCII.sub("?", quarantined.describe())[:512]))
    return tuple(pairs)


_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def _pending(method: str):
    async def not_yet(self, request, context):
        raise Unimplemented(f"ContextEngine.{method} is not implemented yet: it lands with {PENDING[method]}",
                            metadata={"method": method})

    not_yet.__name__ = method
    return not_yet


for _name in PENDING:
    setattr(ContextEngineServicer, _name, _pending(_name))
