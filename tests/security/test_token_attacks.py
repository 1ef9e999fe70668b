"""Token attacks through real gRPC: every forged, stale, malformed or oversized token is refused
UNAUTHENTICATED with a reason code, and the write it carried changes no row of any table."""

from __future__ import annotations

import base64
import datetime as dt
import json

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from context_engine.auth import MAX_TOKEN_BYTES, TokenVerifier, ensure_dev_key
from context_engine.config import Settings
from context_engine.errors import Unauthenticated
from entrypoints.serving.server import MAX_METADATA_BYTES
from entrypoints.serving.status import error_info
from tests.fixtures.settling import settled
from tests.security.row_counts import unchanged
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

ORG = "token-attacks"


def now() -> int:
    """Read at each use: the suite may run long after this module was imported."""
    return int(dt.datetime.now(dt.UTC).timestamp())


def claims(**overrides) -> dict:
    base = {"sub": "attacker", "org_id": ORG, "pillar_id": "", "team_id": "", "agent_id": "",
            "clearance": 4, "iat": now(), "exp": now() + 600}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(payload: dict, alg: str = "none") -> str:
    header = _b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    return f"{header}.{_b64(json.dumps(payload).encode())}."


def tampered(key: bytes) -> str:
    """A genuine token whose payload was swapped for another org's, its signature kept."""
    header, _, signature = jwt.encode(claims(), key, algorithm="HS256").split(".")
    return f"{header}.{_b64(json.dumps(claims(org_id='victim-org')).encode())}.{signature}"


def with_embedded_key() -> str:
    """Signed by the attacker's RSA key, which the header carries as a `jwk`."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    numbers = private.public_key().public_numbers()
    jwk = {"kty": "RSA", "n": _b64(numbers.n.to_bytes(256, "big")), "e": _b64(numbers.e.to_bytes(3, "big"))}
    return jwt.encode(claims(), private, algorithm="RS256", headers={"jwk": jwk, "kid": "../../etc/passwd"})


def _not_json_payload(key: bytes) -> str:
    """A correctly signed token whose payload is not a JSON object."""
    import hashlib
    import hmac

    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{_b64(b'[1, 2, 3]')}"
    return f"{signing_input}.{_b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())}"


# name -> (token from the deployment's real key, the reason code it must be refused with)
ATTACKS = {
    "alg none": (lambda key: unsigned(claims()), "TOKEN_ALGORITHM_REJECTED"),
    "alg NONE": (lambda key: unsigned(claims(), "NONE"), "TOKEN_ALGORITHM_REJECTED"),
    "alg HS512 with the real key": (lambda key: jwt.encode(claims(), key, algorithm="HS512"),
                                    "TOKEN_ALGORITHM_REJECTED"),
    "RS256 with an embedded jwk": (lambda key: with_embedded_key(), "TOKEN_ALGORITHM_REJECTED"),
    "another HS256 key": (lambda key: jwt.encode(claims(), b"k" * 64, algorithm="HS256"), "TOKEN_BAD_SIGNATURE"),
    "payload swapped, signature kept": (tampered, "TOKEN_BAD_SIGNATURE"),
    "signature stripped": (lambda key: jwt.encode(claims(), key, algorithm="HS256").rsplit(".", 1)[0] + ".",
                           "TOKEN_BAD_SIGNATURE"),
    "expired": (lambda key: jwt.encode(claims(iat=now() - 7200, exp=now() - 3600), key, algorithm="HS256"),
                "TOKEN_EXPIRED"),
    "not before in an hour": (lambda key: jwt.encode(claims(nbf=now() + 3600), key, algorithm="HS256"),
                              "TOKEN_NOT_YET_VALID"),
    "issued in an hour": (lambda key: jwt.encode(claims(iat=now() + 3600), key, algorithm="HS256"),
                          "TOKEN_NOT_YET_VALID"),
    "no exp": (lambda key: jwt.encode(claims(exp=_DROP), key, algorithm="HS256"), "TOKEN_CLAIM_MISSING"),
    "no sub": (lambda key: jwt.encode(claims(sub=_DROP), key, algorithm="HS256"), "TOKEN_CLAIM_MISSING"),
    "no org_id": (lambda key: jwt.encode(claims(org_id=_DROP), key, algorithm="HS256"), "TOKEN_CLAIM_MISSING"),
    "no clearance": (lambda key: jwt.encode(claims(clearance=_DROP), key, algorithm="HS256"),
                     "TOKEN_CLAIM_MISSING"),
    "malformed": (lambda key: "not.a.jwt", "TOKEN_MALFORMED"),
    "payload not an object, signed": (_not_json_payload, "TOKEN_MALFORMED"),
    "oversized": (lambda key: jwt.encode(claims(padding="x" * MAX_TOKEN_BYTES), key, algorithm="HS256"),
                  "TOKEN_TOO_LARGE"),
}
# Larger than any metadata the server takes: refused by gRPC itself, before the engine sees it.
TRANSPORT_REFUSED = {
    "a 64 KiB token": lambda key: jwt.encode(claims(padding="x" * 64 * 1024), key, algorithm="HS256"),
    "a token just over the metadata limit": lambda key: "a." * (MAX_METADATA_BYTES // 2),
}

def bad_claims() -> dict[str, tuple[dict, str]]:
    """Claims of the wrong type or shape, each to be signed with the real key, and the reason
    each is refused with (made at each use: some hold times)."""
    rows = {
        "clearance true": {"clearance": True},
        "clearance false": {"clearance": False},
        "clearance '4'": {"clearance": "4"},
        "clearance 4.0": {"clearance": 4.0},
        "clearance 0": {"clearance": 0},
        "clearance 5": {"clearance": 5},
        "clearance null": ({"clearance": None}, "TOKEN_CLAIM_MISSING"),  # PyJWT: null is absent
        "clearance list": {"clearance": [4]},
        "org_id a number": {"org_id": 12345},
        "org_id a list": {"org_id": [ORG]},
        "org_id empty": {"org_id": ""},
        "org_id _system": {"org_id": "_system"},
        "org_id _platform": {"org_id": "_platform"},
        "org_id with NUL": {"org_id": ORG + "\x00x"},
        "org_id with a slash": {"org_id": f"{ORG}/sales"},
        "org_id of 129 characters": {"org_id": "a" * 129},
        "team without pillar": {"team_id": "emea"},
        "team_id a number": {"pillar_id": "sales", "team_id": 7},
        "agent_id an object": {"pillar_id": "p", "team_id": "t", "agent_id": {"id": "a"}},
        "exp a numeric string": {"exp": str(now() + 600)},
        "exp a word": {"exp": "later"},
        "exp a list": {"exp": [now() + 600]},
        "exp true": {"exp": True},
        "exp infinite": {"exp": float("inf")},
        "exp of 401 digits": {"exp": 10**400},
        "nbf of 401 digits, negative": {"nbf": -(10**400)},
        "exp null": {"exp": None},
        "nbf a string": {"nbf": str(now() - 10)},
        "nbf a word": {"nbf": "soon"},
        "iat a string": {"iat": str(now())},
        "iat an object": {"iat": {"t": now()}},
        "sub a number": {"sub": 42},
        "sub empty": {"sub": ""},
        "sub with NUL": {"sub": "a\x00b"},
        "sub with a newline": {"sub": "a\nINFO forged log line"},
        "sub of 300 characters": {"sub": "s" * 300},
        "aud of another service (none configured)": ({"aud": "billing-service"}, "TOKEN_AUDIENCE_REJECTED"),
    }
    return {name: row if isinstance(row, tuple) else (row, "TOKEN_CLAIMS_INVALID") for name, row in rows.items()}


async def _ingest(engine, metadata):
    stub = context_pb2_grpc.ContextEngineStub(engine.channel)
    return await stub.IngestEvent(pb.IngestEventRequest(
        scope=pb.ScopePath(org_id=ORG), session_id="s", event_type="message", content=b"forged write"),
        metadata=metadata)


async def _refused(engine, token: str) -> tuple[grpc.StatusCode, str]:
    try:
        await _ingest(engine, (("authorization", f"Bearer {token}"),))
    except grpc.aio.AioRpcError as err:
        return err.code(), error_info(err).reason if error_info(err) else ""
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
async def settled_engine(quiet_engine):
    await settled(quiet_engine.settings.database_url)
    return quiet_engine


async def test_every_token_attack_is_refused_and_writes_nothing(settled_engine) -> None:
    key = ensure_dev_key(settled_engine.settings.hs256_key_path)
    outcomes = {}
    async with unchanged(settled_engine.settings.database_url):
        for name, (make, reason) in ATTACKS.items():
            outcomes[name] = (await _refused(settled_engine, make(key)), reason)
        for name, (bad, reason) in bad_claims().items():
            token = jwt.encode(claims(**bad), key, algorithm="HS256")
            outcomes[name] = (await _refused(settled_engine, token), reason)
        for name, make in TRANSPORT_REFUSED.items():
            outcomes[name] = ((await _refused(settled_engine, make(key)))[0], grpc.StatusCode.RESOURCE_EXHAUSTED)
    wrong = {name: got for name, (got, want) in outcomes.items()
             if got != (want if name in TRANSPORT_REFUSED else (grpc.StatusCode.UNAUTHENTICATED, want))}
    assert wrong == {}
    assert len(outcomes) == len(ATTACKS) + len(bad_claims()) + len(TRANSPORT_REFUSED)


async def test_the_genuine_token_still_writes(settled_engine) -> None:
    """The control: the same request with a well-formed token of the deployment is accepted."""
    key = ensure_dev_key(settled_engine.settings.hs256_key_path)
    token = jwt.encode(claims(), key, algorithm="HS256")
    reply = await _ingest(settled_engine, (("authorization", f"Bearer {token}"),))
    assert reply.event_id


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer  ", "Basic YTpi", "bearer", "Token abc",
                                    "Bearer a b c"])
async def test_authorization_headers_that_are_not_a_bearer_token(settled_engine, header) -> None:
    metadata = (("authorization", header),) if header else ()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _ingest(settled_engine, metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(err.value).reason in {"TOKEN_MISSING", "TOKEN_MALFORMED"}


# -- configurations the shared deployment does not have: the verifier itself -----------------------


def _verifier(tmp_path, **settings) -> TokenVerifier:
    return TokenVerifier(Settings(home=tmp_path, **settings))


def _public_pem(private) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize("make_key, alg", [
    (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
    (ed25519.Ed25519PrivateKey.generate, "EdDSA"),
])
def test_key_confusion_hs256_signed_with_the_public_key(tmp_path, make_key, alg) -> None:
    """The classic: the server's public key used as an HMAC secret. Refused whether HS256 is off
    (the algorithm) or on beside the asymmetric one (HS256 verifies with its own key only)."""
    private = make_key()
    pem = _public_pem(private)
    (tmp_path / "pub.pem").write_bytes(pem)
    forged = _hs256_with_raw_secret(claims(), pem)
    only_asymmetric = _verifier(tmp_path, jwt_algorithms=[alg], jwt_public_key_file=tmp_path / "pub.pem")
    with pytest.raises(Unauthenticated) as err:
        only_asymmetric.verify(forged)
    assert err.value.reason == "TOKEN_ALGORITHM_REJECTED"
    both = _verifier(tmp_path, jwt_algorithms=["HS256", alg], jwt_public_key_file=tmp_path / "pub.pem")
    with pytest.raises(Unauthenticated) as err:
        both.verify(forged)
    assert err.value.reason == "TOKEN_BAD_SIGNATURE"
    assert both.verify(jwt.encode(claims(), private, algorithm=alg)).scope.org_id == ORG  # the control


def _hs256_with_raw_secret(payload: dict, secret: bytes) -> str:
    """HS256 by hand: PyJWT refuses a PEM as an HMAC secret, an attacker's tool does not."""
    import hashlib
    import hmac

    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{_b64(json.dumps(payload).encode())}"
    return f"{signing_input}.{_b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


@pytest.mark.parametrize("token_claims, reason", [
    (dict(iss="https://evil.example"), "TOKEN_ISSUER_REJECTED"),
    (dict(iss=_DROP), "TOKEN_CLAIM_MISSING"),
    (dict(aud="another-service"), "TOKEN_AUDIENCE_REJECTED"),
    (dict(aud=_DROP), "TOKEN_CLAIM_MISSING"),
    (dict(aud=["another-service", "context-engine-x"]), "TOKEN_AUDIENCE_REJECTED"),
])
def test_wrong_issuer_or_audience_when_configured(tmp_path, token_claims, reason) -> None:
    verifier = _verifier(tmp_path, jwt_issuer="https://idp.example", jwt_audience="context-engine")
    key = ensure_dev_key(Settings(home=tmp_path).hs256_key_path)
    good = {"iss": "https://idp.example", "aud": "context-engine"}
    assert verifier.verify(jwt.encode(claims(**good), key, algorithm="HS256")).subject == "attacker"
    with pytest.raises(Unauthenticated) as err:
        verifier.verify(jwt.encode(claims(**{**good, **token_claims}), key, algorithm="HS256"))
    assert err.value.reason == reason
