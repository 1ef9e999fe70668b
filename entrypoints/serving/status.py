"""The one mapping from domain errors to gRPC status codes.

Every error leaves the server as a google.rpc.Status whose details hold an ErrorInfo with a
reason code, so clients branch on `reason` instead of parsing prose.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from context_engine import errors

ERROR_DOMAIN = "context-engine.upsquad"

_CODES: list[tuple[type[errors.DomainError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Aborted, grpc.StatusCode.ABORTED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
]


def status_code_for(error: errors.DomainError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def to_status(code: grpc.StatusCode, message: str, reason: str,
              metadata: dict[str, str] | None = None) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata or {})
    detail = any_pb2.Any()
    detail.Pack(info)
    proto = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=[detail])
    return rpc_status.to_status(proto)


def status_for(error: errors.DomainError) -> grpc.Status:
    return to_status(status_code_for(error), error.message, error.reason, error.metadata)


def error_info(exc: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """Client side: the ErrorInfo a failed call carried, if any."""
    status = rpc_status.from_call(exc)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
