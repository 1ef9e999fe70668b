"""Server interceptors both services install: thin wrappers around each unary handler.

- `ErrorsAndAccessLog` (outermost): one JSON access-log line per call, and the translation of
  domain errors into gRPC status (reason codes in ErrorInfo). A request body that does not parse
  is INVALID_ARGUMENT (before authentication, saying nothing of the body); PostgreSQL or the
  broker going away is UNAVAILABLE (`errors.unavailable_cause`); other unexpected exceptions
  become INTERNAL without leaking their text.
- `ServiceToken`: the detector sidecar's optional shared secret.

The API's own `Authentication` (entrypoints/api/interceptors.py) records the verified caller
with `set_caller`, which the access log names.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from context_engine import errors
from context_engine.auth import Principal
from context_engine.metrics import RPC_SECONDS
from entrypoints.serving.status import status_for, to_status

log = structlog.get_logger("context_engine.access")

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]

# Infrastructure services answer without credentials (probes, grpcurl discovery).
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

_caller: contextvars.ContextVar[Principal] = contextvars.ContextVar("caller")


def set_caller(principal: Principal) -> None:
    """Record the verified caller of the RPC being served. Each call runs in its own task with
    its own context: no reset is needed, and leaving it set lets the access log name the caller."""
    _caller.set(principal)


def current_caller() -> Principal | None:
    """The verified caller of the RPC being served, None when nothing verified one."""
    return _caller.get(None)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What a request body that does not parse becomes, in place of the request message.

    grpc.aio calls the handler's request deserializer outside every interceptor and answers an
    exception from it UNKNOWN with the exception's type and text, before any authentication.
    `ErrorsAndAccessLog` installs a deserializer that returns this instead, and answers it
    INVALID_ARGUMENT naming only the message type."""

    message_name: str
    error: str  # the parser's exception type, for the server's log only


def _tolerant(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any] | None:
    if deserializer is None or getattr(deserializer, "tolerant", False):
        return deserializer
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    message_name = getattr(descriptor, "full_name", None) or f"{method.rsplit('/', 1)[-1]} request"

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError, or anything else the parser raises: never the text
            return Undecodable(message_name, type(exc).__name__)

    decode.tolerant = True  # type: ignore[attr-defined]
    return decode


def wrap_unary(handler: grpc.RpcMethodHandler | None, around: Callable[[Behavior], Behavior],
                *, method: str | None = None) -> grpc.RpcMethodHandler | None:
    """The handler with its behavior wrapped by `around`; with `method`, its request deserializer
    also turns a body that does not parse into `Undecodable`."""
    if handler is None or handler.unary_unary is None:
        return handler
    deserializer = handler.request_deserializer
    return grpc.unary_unary_rpc_method_handler(
        around(handler.unary_unary),
        request_deserializer=_tolerant(deserializer, method) if method is not None else deserializer,
        response_serializer=handler.response_serializer,
    )


def metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The value of one invocation-metadata key, or None."""
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return None


class ErrorsAndAccessLog(grpc.aio.ServerInterceptor):
    def __init__(self, max_handler_seconds: float = 30.0) -> None:
        self._max_seconds = max_handler_seconds

    async def intercept_service(self, continuation, details):
        method = details.method

        def around(behavior: Behavior) -> Behavior:
            async def logged(request, context):
                started = time.perf_counter()
                code = grpc.StatusCode.OK
                try:
                    if isinstance(request, Undecodable):
                        log.warning("undecodable request", method=method, error=request.error)
                        raise errors.UndecodableRequest(request.message_name)
                    budget = asyncio.timeout(self._max_seconds)
                    try:
                        async with budget:
                            return await behavior(request, context)
                    except TimeoutError as exc:  # no call may hang: say where it was stuck
                        if not budget.expired():  # a timeout of the handler's own (a connect, an acquire)
                            raise
                        log.error("handler exceeded its time", method=method, seconds=self._max_seconds,
                                  exc_info=exc.__context__ or exc)
                        raise errors.DeadlineExceeded(
                            f"the server gave up after {self._max_seconds:.0f}s", reason="HANDLER_TIMEOUT") from exc
                except errors.DomainError as exc:
                    status = status_for(exc)
                    code = status.code
                    await context.abort_with_status(status)
                except grpc.aio.AbortError:
                    code = context.code() or grpc.StatusCode.UNKNOWN
                    raise
                except Exception as exc:
                    unavailable = errors.unavailable_cause(exc)
                    if unavailable is None:
                        code = grpc.StatusCode.INTERNAL
                        log.exception("unhandled error", method=method)
                        await context.abort_with_status(
                            to_status(code, "internal error; see server log", "INTERNAL"))
                    else:  # PostgreSQL or the broker went away: the caller should retry
                        code = grpc.StatusCode.UNAVAILABLE
                        log.warning("dependency unavailable", method=method, reason=unavailable.reason,
                                    error=f"{type(exc).__name__}: {exc}")
                        await context.abort_with_status(status_for(unavailable))
                finally:
                    principal = current_caller()
                    seconds = time.perf_counter() - started
                    code_name = code.name if hasattr(code, "name") else str(code)
                    RPC_SECONDS.labels(method, code_name).observe(seconds)
                    log.info("rpc", method=method, code=code_name, duration_ms=round(seconds * 1000, 2),
                             org_id=principal.scope.org_id if principal else None,
                             sub=principal.subject if principal else None)

            return logged

        if method.startswith(OPEN_SERVICES):  # probes: no access log, but no parser text either
            return wrap_unary(await continuation(details), _refusing_undecodable, method=method)
        return wrap_unary(await continuation(details), around, method=method)


def _refusing_undecodable(behavior: Behavior) -> Behavior:
    async def checked(request, context):
        if isinstance(request, Undecodable):
            await context.abort_with_status(status_for(errors.UndecodableRequest(request.message_name)))
        return await behavior(request, context)

    return checked


class ServiceToken(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <service token>` when a token is configured."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_SERVICES):
            return await continuation(details)

        def around(behavior: Behavior) -> Behavior:
            async def checked(request, context):
                given = (metadata_value(context, "authorization") or "").encode()
                if not hmac.compare_digest(given, self._expected):
                    raise errors.Unauthenticated("detector service token missing or wrong",
                                                 reason="SERVICE_TOKEN_REJECTED")
                return await behavior(request, context)

            return checked

        return wrap_unary(await continuation(details), around)
