"""A failed call as an exception: the gRPC status, the engine's reason code and its ErrorInfo
metadata (what a retry needs, the field at fault), so callers branch on `reason`, not on prose."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


class EngineError(Exception):
    """`code` is the gRPC status; `reason` the engine's code (e.g. `SESSION_OUT_OF_SCOPE`, empty
    when the failure came from the transport); `metadata` the ErrorInfo's metadata."""

    def __init__(self, method: str, code: grpc.StatusCode, message: str, reason: str = "",
                 metadata: dict[str, str] | None = None, idempotency_key: str | None = None) -> None:
        super().__init__(f"{method}: {code.name}{f' ({reason})' if reason else ''}: {message}")
        self.method = method
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        # A keyed write's key: retry it with this one (an unacknowledged write may still be applied).
        self.idempotency_key = idempotency_key

    @classmethod
    def from_rpc_error(cls, method: str, error: grpc.RpcError, *, idempotency_key: str | None = None) -> "EngineError":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = (error.details() if hasattr(error, "details") else "") or ""
        reason, metadata = "", {}
        try:
            status = rpc_status.from_call(error)
        except ValueError:  # details that disagree with the call's status (rewritten on the way): no reason
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
        return cls(method, code, message, reason, metadata, idempotency_key)

    @property
    def not_durable_yet(self) -> bool:
        """The write was sent but not acknowledged: a retry with its idempotency key is safe."""
        return self.code == grpc.StatusCode.UNAVAILABLE and self.reason == "NOT_DURABLE_YET"
