"""The ContextEngine servicer: protobuf in, one handler call, protobuf out. The caller is the
Principal the Authentication interceptor verified; its scope already equals request.scope.

Methods whose issue has not landed answer UNIMPLEMENTED with a message naming that issue.
"""

from __future__ import annotations

import datetime as dt

from google.protobuf.timestamp_pb2 import Timestamp
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

from context_engine.api.interceptors import current_principal, metadata_value
from context_engine.commands.create_snapshot import CreateSnapshot, create_snapshot
from context_engine.commands.deps import Deps
from context_engine.commands.ingest_event import IngestEvent, ingest_event
from context_engine.commands.push_context import PushContext, push_context
from context_engine.commands.rollback_context import RollbackContext, rollback_context
from context_engine.errors import Unimplemented
from context_engine.projections.pull_context import PullContext, pull_context

IDEMPOTENCY_HEADER = "idempotency-key"

# Where each RPC not built yet is built: the issue that brings it.
PENDING: dict[str, str] = {
    "AssembleContext": "issue #5 (assembly and guardrail layers)",
    "Compact": "a later issue (compaction worker)",
    "ValidatePrompt": "issue #5 (assembly and guardrail layers)",
    "Search": "issue #4 (retrieval)",
    "Embed": "issue #4 (retrieval)",
    "CreateShare": "a later issue (shares)",
    "RevokeShare": "a later issue (shares)",
    "ListShares": "a later issue (shares)",
    "ResolveGuardrailLayers": "issue #5 (assembly and guardrail layers)",
}


def timestamp(moment: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(moment)
    return ts


class ContextEngineServicer(context_pb2_grpc.ContextEngineServicer):
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def IngestEvent(self, request: pb.IngestEventRequest, context) -> pb.IngestEventResponse:
        result = await ingest_event(self.deps, current_principal(), IngestEvent(
            session_id=request.session_id, event_type=request.event_type, content=request.content,
            metadata=dict(request.metadata), idempotency_key=metadata_value(context, IDEMPOTENCY_HEADER) or ""))
        return pb.IngestEventResponse(event_id=result.event_id, version_hash=result.version_hash,
                                      token_count=result.token_count)

    async def PushContext(self, request: pb.PushContextRequest, context) -> pb.PushContextResponse:
        result = await push_context(self.deps, current_principal(), PushContext(
            session_id=request.session_id, memory_type=request.memory_type, content=request.content,
            metadata=dict(request.metadata)))
        return pb.PushContextResponse(version_hash=result.version_hash, created_at=timestamp(result.created_at))

    async def PullContext(self, request: pb.PullContextRequest, context) -> pb.PullContextResponse:
        result = await pull_context(self.deps.pool, self.deps.freshness, current_principal(), PullContext(
            agent_id=request.agent_id, session_id=request.session_id, snapshot_name=request.snapshot_name))
        memory = result.memory
        return pb.PullContextResponse(version_hash=result.version_hash, memory_type=memory.memory_type,
                                      content=memory.content, created_at=timestamp(memory.created_at),
                                      metadata=memory.metadata)

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


def _pending(method: str):
    async def not_yet(self, request, context):
        raise Unimplemented(f"ContextEngine.{method} is not implemented yet: it lands with {PENDING[method]}",
                            metadata={"method": method})

    not_yet.__name__ = method
    return not_yet


for _name in PENDING:
    setattr(ContextEngineServicer, _name, _pending(_name))
