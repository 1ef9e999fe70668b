"""Where a call's bearer token comes from: a fixed string, a callable asked before every call (a
token your identity provider refreshes), or `DevTokens`, minted from a development data
directory's HS256 key as `context-engine token` does (needs the `dev-token` extra: PyJWT)."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

from context_engine_client.scope import Scope

TokenSource = str | Callable[[], str]


def token_getter(source: TokenSource) -> Callable[[], str]:
    if callable(source):
        return source
    if not isinstance(source, str) or not source.strip():
        raise ValueError("token must be a non-empty string or a callable that returns one")
    return lambda: source


class DevTokens:
    """Tokens for `scope` signed with `<data_dir>/keys/jwt-hs256.key` (the key `up` makes), each
    valid for `ttl_s` and minted again a minute before it expires. Development only: anyone who
    can read the key can be any scope."""

    def __init__(self, data_dir: str | pathlib.Path, scope: str | Scope, *, clearance: int = 2,
                 ttl_s: int = 3600, clock: Callable[[], float] = time.time) -> None:
        key_file = pathlib.Path(data_dir) / "keys" / "jwt-hs256.key"
        try:
            self._key = key_file.read_text().strip().encode()
        except OSError as err:
            raise FileNotFoundError(f"no development key at {key_file}: start the stack with `context-engine up "
                                    f"--data-dir {data_dir}` first, or pass a token") from err
        try:
            import jwt  # noqa: F401  (the dev-token extra; said now, not at the first call)
        except ImportError as err:
            raise ImportError("DevTokens needs PyJWT: pip install 'context-engine-client[dev-token]'") from err
        if not 1 <= clearance <= 4:
            raise ValueError(f"clearance must be 1..4, got {clearance}")
        self.scope, self.clearance, self._ttl, self._clock = Scope.parse(scope), clearance, ttl_s, clock
        self._token, self._expires = "", 0.0

    def __call__(self) -> str:
        now = self._clock()
        if now > self._expires - 60:
            import jwt  # the dev-token extra

            s = self.scope
            claims = {"sub": f"dev:{s.path}", "org_id": s.org, "pillar_id": s.pillar, "team_id": s.team,
                      "agent_id": s.agent, "clearance": self.clearance, "iat": int(now), "exp": int(now) + self._ttl}
            self._token, self._expires = jwt.encode(claims, self._key, algorithm="HS256"), now + self._ttl
        return self._token
