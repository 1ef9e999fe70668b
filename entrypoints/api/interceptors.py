"""The API's authentication interceptor: verifies the bearer JWT, checks that `request.scope`
equals the token's scope, makes the Principal available to handlers through
`current_principal()`, and keeps each token's refused-call budget (commands/refusal_budget.py).
The interceptors both services share (errors, access log, the detector's service token) are in
entrypoints/serving/interceptors.py.
"""

from __future__ import annotations

from typing import Any

import grpc

from commands.refusal_budget import RefusalBudget
from context_engine import errors
from context_engine.auth import Principal, TokenVerifier
from context_engine.scope import Scope
from entrypoints.serving.interceptors import (
    OPEN_SERVICES,
    Behavior,
    current_caller,
    metadata_value,
    set_caller,
    wrap_unary,
)


def current_principal() -> Principal:
    """The verified caller of the RPC being served."""
    principal = current_caller()
    if principal is None:  # a handler wired without the Authentication interceptor
        raise errors.Unauthenticated("no authenticated principal", reason="NO_PRINCIPAL")
    return principal


class Authentication(grpc.aio.ServerInterceptor):
    def __init__(self, verifier: TokenVerifier, refusals: RefusalBudget | None = None) -> None:
        self._verifier = verifier
        self._refusals = refusals or RefusalBudget(0, 1)

    async def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_SERVICES):
            return await continuation(details)

        def around(behavior: Behavior) -> Behavior:
            async def authenticated(request, context):
                principal = self._authenticate(context)
                _check_scope(request, principal)
                set_caller(principal)
                self._refusals.admit(principal)
                try:
                    return await behavior(request, context)
                except (errors.NotFound, errors.PermissionDenied):
                    self._refusals.charge(principal)
                    raise

            return authenticated

        return wrap_unary(await continuation(details), around)

    def _authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        header = metadata_value(context, "authorization")
        if not header:
            raise errors.Unauthenticated("missing authorization metadata (Bearer <JWT>)",
                                         reason="TOKEN_MISSING")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.Unauthenticated("authorization must be 'Bearer <JWT>'", reason="TOKEN_MALFORMED")
        return self._verifier.verify(token.strip())


def _check_scope(request: Any, principal: Principal) -> None:
    """Every ContextEngine request carries `scope`; it must equal the token's scope."""
    if not hasattr(request, "scope"):
        return
    if not request.HasField("scope"):
        raise errors.InvalidArgument("scope", "is required and must equal the token's scope")
    s = request.scope
    claimed = Scope(s.org_id, s.pillar_id, s.team_id, s.agent_id)
    if claimed != principal.scope:
        raise errors.ScopeMismatch(
            f"request scope {claimed.path or '<empty>'!r} differs from the token's scope "
            f"{principal.scope.path!r}",
            metadata={"field": "scope"},
        )
