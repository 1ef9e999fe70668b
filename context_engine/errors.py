"""Domain errors. Each names a reason code; the gRPC layer maps the class to a status code
in one place (context_engine.api.status) and carries the reason in google.rpc.ErrorInfo."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the engine reports to a caller on purpose."""

    reason: str = "INTERNAL"

    def __init__(self, message: str, *, reason: str | None = None, field: str | None = None,
                 metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.field = field
        self.metadata = dict(metadata or {})
        if field:
            self.metadata.setdefault("field", field)


class InvalidArgument(DomainError):
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str, *, reason: str | None = None) -> None:
        super().__init__(f"{field}: {problem}", reason=reason, field=field)


class Unauthenticated(DomainError):
    reason = "UNAUTHENTICATED"


class PermissionDenied(DomainError):
    reason = "PERMISSION_DENIED"


class ClearanceTooLow(PermissionDenied):
    reason = "CLEARANCE_TOO_LOW"


class ScopeMismatch(PermissionDenied):
    reason = "SCOPE_MISMATCH"


class NotFound(DomainError):
    reason = "NOT_FOUND"


class AlreadyExists(DomainError):
    reason = "ALREADY_EXISTS"


class FailedPrecondition(DomainError):
    reason = "FAILED_PRECONDITION"


class ResourceExhausted(DomainError):
    reason = "RESOURCE_EXHAUSTED"


class Unavailable(DomainError):
    reason = "UNAVAILABLE"


class Unimplemented(DomainError):
    reason = "NOT_YET_IMPLEMENTED"


class DeadlineExceeded(DomainError):
    reason = "DEADLINE_EXCEEDED"
