"""JWT verification and development-token minting (PyJWT).

HS256 with a key generated into the data directory is the development setup; production
verifies RS256 or EdDSA signatures with a configured public key and never holds a signing key.
"""

from __future__ import annotations

import datetime as dt
import math
import pathlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

import jwt

from context_engine import keyfiles, validation
from context_engine.clearance import MAX_CLEARANCE, MIN_CLEARANCE
from context_engine.config import Settings
from context_engine.errors import InvalidArgument, Unauthenticated
from context_engine.scope import Scope

REQUIRED_CLAIMS = ("sub", "org_id", "clearance", "exp")
VERIFIED_CACHE_SIZE = 10_000
# A token of ours is ~400 characters; an identity provider's with extra claims a few KiB. Larger
# is refused before any parsing (a base64 megabyte costs the decoder; the cache holds tokens).
MAX_TOKEN_BYTES = 8 * 1024
MAX_SUBJECT = 256  # the actor recorded in every event the token writes


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as the verified token says."""

    subject: str
    scope: Scope
    clearance: int


def ensure_secret(path: pathlib.Path) -> str:
    """Return the secret in `path` (64 hex digits from `secrets`), creating the file on first use:
    mode 0600, in a directory created 0700, published atomically (a concurrent creator's file
    wins and both read it). Used for the HS256 key and the PostgreSQL passwords (docs/security.md);
    the log's keyring is made the same way (context_engine/keyfiles.py)."""
    return keyfiles.ensure(path, lambda: secrets.token_hex(32).encode()).decode().strip()


def ensure_dev_key(path: pathlib.Path) -> bytes:
    """Return the HS256 development key, creating it (0600) on first use."""
    return ensure_secret(path).encode()


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
        self._keys: dict[str, str | bytes] = {}  # HS256's secret; the PEM of the asymmetric ones
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
        self._max_lifetime = settings.jwt_max_lifetime_seconds
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
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated(f"token is {len(token)} characters; at most {MAX_TOKEN_BYTES}",
                                  reason="TOKEN_TOO_LARGE")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"malformed token: {exc}", reason="TOKEN_MALFORMED") from exc
        alg = header.get("alg")
        if alg not in self._keys:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted",
                                  reason="TOKEN_ALGORITHM_REJECTED")
        # The claims' types first, unverified: PyJWT coerces times (exp "123") and reports a bad
        # one as it reports a bad payload. Refusing a forgery here or after the signature check
        # tells its maker nothing more; its reason is then exact.
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"malformed token: {exc}", reason="TOKEN_MALFORMED") from exc
        _check_time_types(unverified)
        try:
            # verify_aud on even when no audience is configured: then a token naming one is
            # another service's, and refused.
            claims = jwt.decode(
                token, self._keys[alg], algorithms=[alg], issuer=self._issuer,
                audience=self._audience, leeway=self._leeway,
                options={"require": list(REQUIRED_CLAIMS), "verify_aud": True},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token has expired", reason="TOKEN_EXPIRED") from exc
        except jwt.InvalidSignatureError as exc:
            raise Unauthenticated("token signature does not verify", reason="TOKEN_BAD_SIGNATURE") from exc
        except jwt.ImmatureSignatureError as exc:
            raise Unauthenticated("token is not valid yet (nbf or iat in the future)",
                                  reason="TOKEN_NOT_YET_VALID") from exc
        except jwt.InvalidIssuerError as exc:
            raise Unauthenticated("token issuer is not the configured one", reason="TOKEN_ISSUER_REJECTED") from exc
        except jwt.InvalidAudienceError as exc:
            raise Unauthenticated("token audience is not the configured one",
                                  reason="TOKEN_AUDIENCE_REJECTED") from exc
        except jwt.exceptions.InvalidSubjectError as exc:
            raise _claim_error("sub must be a non-empty string") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"token lacks a required claim: {exc.claim}", reason="TOKEN_CLAIM_MISSING") from exc
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"token rejected: {exc}", reason="TOKEN_INVALID") from exc
        expires = float(claims["exp"])
        lifetime = expires - float(claims.get("iat", time.time()))
        if self._max_lifetime and lifetime > self._max_lifetime + self._leeway:
            raise Unauthenticated(f"token lives {lifetime / 3600:.1f} h; at most {self._max_lifetime / 3600:g} h "
                                  "(jwt_max_lifetime_seconds)", reason="TOKEN_LIFETIME_TOO_LONG")
        return _principal(claims), expires


SCOPE_CLAIMS = ("org_id", "pillar_id", "team_id", "agent_id")
TIME_CLAIMS = ("exp", "nbf", "iat")


def _claim_error(message: str) -> Unauthenticated:
    return Unauthenticated(f"token claims are invalid: {message}", reason="TOKEN_CLAIMS_INVALID")


MAX_TIME_CLAIM = 2**53  # JSON's safe integers; a 400-digit exp overflows float (OverflowError)


def _check_time_types(claims: dict) -> None:
    """exp, nbf and iat, where present, are finite numbers of a sane size (not strings, booleans,
    null, or integers beyond 2**53)."""
    for name in TIME_CLAIMS:
        value = claims.get(name)
        if name not in claims:
            continue
        if type(value) is int:
            ok = abs(value) <= MAX_TIME_CLAIM
        else:
            ok = type(value) is float and math.isfinite(value) and abs(value) <= MAX_TIME_CLAIM
        if not ok:
            raise _claim_error(f"{name} must be a number (seconds since the epoch)")


def _principal(claims: dict) -> Principal:
    """Claims of strict types only: PyJWT takes exp "123" or True for a time, Python takes True
    for clearance 1 and str() makes an id of anything; none of these is what the issuer meant."""
    clearance = claims.get("clearance")
    if type(clearance) is not int or not MIN_CLEARANCE <= clearance <= MAX_CLEARANCE:
        raise _claim_error(f"clearance must be an integer {MIN_CLEARANCE}..{MAX_CLEARANCE}")
    ids = []  # (the time claims' types were checked before the signature: _decode)
    for name in SCOPE_CLAIMS:
        value = claims.get(name, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise _claim_error(f"{name} must be a string")
        ids.append(value)
    try:
        scope = Scope.parse(*ids, field="token")
    except InvalidArgument as exc:
        raise _claim_error(exc.message) from exc
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise _claim_error("sub must be a non-empty string")
    try:
        validation.label(subject, "sub", MAX_SUBJECT)
    except InvalidArgument as exc:
        raise _claim_error(exc.message) from exc
    return Principal(subject=subject, scope=scope, clearance=clearance)

