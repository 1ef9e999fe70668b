"""JWT verification and development-token minting (PyJWT).

HS256 with a key generated into the data directory is the development setup; production
verifies RS256 or EdDSA signatures with a configured public key and never holds a signing key.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

import jwt

from context_engine.clearance import MAX_CLEARANCE, MIN_CLEARANCE
from context_engine.config import Settings
from context_engine.errors import Unauthenticated
from context_engine.scope import Scope

REQUIRED_CLAIMS = ("sub", "org_id", "clearance", "exp")
VERIFIED_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as the verified token says."""

    subject: str
    scope: Scope
    clearance: int


def ensure_dev_key(path: pathlib.Path) -> bytes:
    """Return the HS256 development key, creating it (0600) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.replace(tmp, path)
    return path.read_text().strip().encode()


def mint_token(key: bytes, *, org: str, clearance: int, pillar: str = "", team: str = "",
               agent: str = "", subject: str | None = None, ttl: dt.timedelta = dt.timedelta(hours=1),
               now: dt.datetime | None = None) -> str:
    scope = Scope.parse(org, pillar, team, agent, field="token")
    if not MIN_CLEARANCE <= clearance <= MAX_CLEARANCE:
        raise ValueError(f"clearance must be {MIN_CLEARANCE}..{MAX_CLEARANCE}, got {clearance}")
    issued = now or dt.datetime.now(dt.UTC)
    claims = {
        "sub": subject or f"dev:{scope.path}",
        "org_id": scope.org_id,
        "pillar_id": scope.pillar_id,
        "team_id": scope.team_id,
        "agent_id": scope.agent_id,
        "clearance": clearance,
        "iat": int(issued.timestamp()),
        "exp": int((issued + ttl).timestamp()),
    }
    return jwt.encode(claims, key, algorithm="HS256")


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        self._algorithms = list(settings.jwt_algorithms)
        self._keys: dict[str, object] = {}
        if "HS256" in self._algorithms:
            self._keys["HS256"] = ensure_dev_key(settings.hs256_key_path)
        asymmetric = [a for a in self._algorithms if a != "HS256"]
        if asymmetric:
            if settings.jwt_public_key_file is None:
                raise ValueError(f"{asymmetric} configured but jwt_public_key_file is not set")
            public = settings.jwt_public_key_file.read_bytes()
            for alg in asymmetric:
                self._keys[alg] = public  # PyJWT parses the PEM for the algorithm
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._leeway = settings.jwt_leeway_seconds
        # Agents send the same token on every call: a verified token is remembered until it expires.
        self._verified: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def verify(self, token: str) -> Principal:
        if (hit := self._verified.get(token)) is not None:
            principal, expires = hit
            if time.time() < expires + self._leeway:
                return principal
            del self._verified[token]
        principal, expires = self._decode(token)
        self._verified[token] = (principal, expires)
        if len(self._verified) > VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)
        return principal

    def _decode(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"malformed token: {exc}", reason="TOKEN_MALFORMED") from exc
        alg = header.get("alg")
        if alg not in self._keys:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted",
                                  reason="TOKEN_ALGORITHM_REJECTED")
        try:
            claims = jwt.decode(
                token, self._keys[alg], algorithms=[alg], issuer=self._issuer,
                audience=self._audience, leeway=self._leeway,
                options={"require": list(REQUIRED_CLAIMS), "verify_aud": self._audience is not None},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token has expired", reason="TOKEN_EXPIRED") from exc
        except jwt.InvalidSignatureError as exc:
            raise Unauthenticated("token signature does not verify", reason="TOKEN_BAD_SIGNATURE") from exc
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"token rejected: {exc}", reason="TOKEN_INVALID") from exc
        return _principal(claims), float(claims["exp"])


def _principal(claims: dict) -> Principal:
    clearance = claims.get("clearance")
    if not isinstance(clearance, int) or not MIN_CLEARANCE <= clearance <= MAX_CLEARANCE:
        raise Unauthenticated("token clearance must be an integer 1..4", reason="TOKEN_INVALID")
    try:
        scope = Scope.parse(*(str(claims.get(k) or "") for k in ("org_id", "pillar_id", "team_id", "agent_id")),
                            field="token")
    except Exception as exc:
        raise Unauthenticated(f"token scope claims are invalid: {exc}", reason="TOKEN_INVALID") from exc
    return Principal(subject=str(claims["sub"]), scope=scope, clearance=clearance)

