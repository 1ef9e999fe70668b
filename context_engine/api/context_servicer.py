"""The ContextEngine servicer: protobuf in, one handler call, protobuf out.

Methods whose issue has not landed answer UNIMPLEMENTED with a message naming that issue.
"""

from __future__ import annotations

from upsquad.context.v1 import context_pb2_grpc

from context_engine.errors import Unimplemented

# Where each RPC is built: the issue that brings it.
PENDING: dict[str, str] = {
    "AssembleContext": "issue #5 (assembly and guardrail layers)",
    "IngestEvent": "issue #3 (event log and session write path)",
    "Compact": "a later issue (compaction worker)",
    "PushContext": "issue #3 (event log and session write path)",
    "PullContext": "issue #3 (event log and session write path)",
    "RollbackContext": "issue #3 (event log and session write path)",
    "CreateSnapshot": "issue #3 (event log and session write path)",
    "ValidatePrompt": "issue #5 (assembly and guardrail layers)",
    "Search": "issue #4 (retrieval)",
    "Embed": "issue #4 (retrieval)",
    "CreateShare": "a later issue (shares)",
    "RevokeShare": "a later issue (shares)",
    "ListShares": "a later issue (shares)",
    "ResolveGuardrailLayers": "issue #5 (assembly and guardrail layers)",
}


def _pending(method: str):
    async def not_yet(self, request, context):
        raise Unimplemented(f"ContextEngine.{method} is not implemented yet: it lands with {PENDING[method]}",
                            metadata={"method": method})

    not_yet.__name__ = method
    return not_yet


class ContextEngineServicer(context_pb2_grpc.ContextEngineServicer):
    pass


for _name in PENDING:
    setattr(ContextEngineServicer, _name, _pending(_name))
