"""Domain errors. Each names a reason code; the gRPC layer maps the class to a status code
in one place (entrypoints.serving.status) and carries the reason in google.rpc.ErrorInfo.

`unavailable_cause` is the one place an infrastructure failure (PostgreSQL or the broker gone,
refusing connections or shutting down) becomes `Unavailable`: the API's outermost interceptor
asks it before answering INTERNAL."""

from __future__ import annotations

import sys


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


class UndecodableRequest(InvalidArgument):
    """The request body does not parse as the method's request message (corrupt wire format,
    invalid UTF-8 in a string field). The message names only the message type: it is answered
    before authentication, so it must say nothing of what was sent."""

    reason = "REQUEST_UNDECODABLE"

    def __init__(self, message_name: str) -> None:
        DomainError.__init__(self, f"the request body is not a valid {message_name}",
                             metadata={"message": message_name})


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


class Aborted(DomainError):
    """A write lost a race (another write to the same state came first); retrying may succeed."""

    reason = "ABORTED"


class ResourceExhausted(DomainError):
    reason = "RESOURCE_EXHAUSTED"


class Unavailable(DomainError):
    reason = "UNAVAILABLE"


class Unimplemented(DomainError):
    reason = "NOT_YET_IMPLEMENTED"


class DeadlineExceeded(DomainError):
    reason = "DEADLINE_EXCEEDED"


# -- infrastructure failures -------------------------------------------------------------------

DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
BROKER_UNAVAILABLE = "BROKER_UNAVAILABLE"

# PostgreSQL SQLSTATEs that mean "the server is not there for you right now": class 08
# (connection exception), 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now
# (starting up, shutting down, recovering), 57P04 database dropped, 53300 too many connections.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08",)
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "57P04", "53300"})
# asyncpg's InterfaceErrors that say a connection or the pool is gone (not a misuse of the API).
_CLOSED_MARKERS = ("connection is closed", "underlying connection is closed", "pool is closing",
                   "pool is closed", "connection was closed")


def unavailable_cause(exc: BaseException) -> Unavailable | None:
    """`Unavailable` (reason DATABASE_UNAVAILABLE or BROKER_UNAVAILABLE) when `exc`, or an
    exception it was raised from or while handling, says PostgreSQL or the broker is unreachable
    or going away; None for anything else, which stays a bug (INTERNAL).

    Recognised: asyncpg errors whose SQLSTATE is above (AdminShutdownError, CannotConnectNowError,
    ConnectionDoesNotExistError, TooManyConnectionsError, every PostgresConnectionError, ...);
    asyncpg InterfaceErrors about a closed connection or pool; asyncpg's InternalClientError (a
    connection's protocol state broken, seen when its backend is terminated); OSError (ConnectionRefusedError,
    ConnectionResetError, ...) and TimeoutError (a connect or pool-acquire timeout) raised inside
    asyncpg; aiokafka's connection errors and the ones it marks retriable. The message names the
    dependency only, never the driver's text (it can carry hosts and statements)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        reason = _infrastructure_reason(current)
        if reason == DATABASE_UNAVAILABLE:
            return Unavailable("the database is unavailable; retry shortly", reason=DATABASE_UNAVAILABLE)
        if reason == BROKER_UNAVAILABLE:
            return Unavailable("the event log broker is unavailable; retry shortly", reason=BROKER_UNAVAILABLE)
        current = current.__cause__ or current.__context__
    return None


def _infrastructure_reason(exc: BaseException) -> str | None:
    # Looked up, not imported: a process that never loaded a driver cannot have its errors
    # (the detector sidecar loads neither).
    asyncpg_exceptions = sys.modules.get("asyncpg.exceptions")
    if asyncpg_exceptions is not None:
        if isinstance(exc, asyncpg_exceptions.PostgresError):
            state = getattr(exc, "sqlstate", None) or ""
            if state in _UNAVAILABLE_SQLSTATES or state.startswith(_UNAVAILABLE_SQLSTATE_CLASSES):
                return DATABASE_UNAVAILABLE
            return None
        if isinstance(exc, asyncpg_exceptions.InterfaceError):
            text = str(exc)
            return DATABASE_UNAVAILABLE if any(m in text for m in _CLOSED_MARKERS) else None
        if isinstance(exc, asyncpg_exceptions.InternalClientError):
            # The protocol's state broken under it: what a pooled connection whose backend was
            # terminated between two queries raises ("cannot switch to state 15; another
            # operation (2) is in progress") before asyncpg notices the socket is gone.
            return DATABASE_UNAVAILABLE
        if isinstance(exc, (OSError, TimeoutError)) and _raised_inside(exc, "asyncpg"):
            return DATABASE_UNAVAILABLE
    kafka_errors = sys.modules.get("aiokafka.errors")
    if kafka_errors is not None:
        if isinstance(exc, kafka_errors.KafkaConnectionError) or (
                isinstance(exc, kafka_errors.KafkaError) and getattr(exc, "retriable", False)):
            return BROKER_UNAVAILABLE
        if isinstance(exc, (OSError, TimeoutError)) and _raised_inside(exc, "aiokafka"):
            return BROKER_UNAVAILABLE
    return None


def _raised_inside(exc: BaseException, package: str) -> bool:
    """Whether a frame of `package` is on the exception's traceback (it came out of the driver)."""
    tb = exc.__traceback__
    prefix = package + "."
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        if name == package or name.startswith(prefix):
            return True
        tb = tb.tb_next
    return False
