import datetime as dt

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from context_engine.auth import TokenVerifier, ensure_dev_key, mint_token
from context_engine.config import Settings
from context_engine.errors import Unauthenticated
from context_engine.scope import Scope


@pytest.fixture
def settings(tmp_path):
    return Settings(home=tmp_path)


def test_dev_key_is_created_once_with_private_mode(tmp_path):
    path = tmp_path / "keys" / "jwt.key"
    first = ensure_dev_key(path)
    assert ensure_dev_key(path) == first
    assert len(first) == 64
    assert path.stat().st_mode & 0o777 == 0o600


def test_minted_token_verifies_to_principal(settings):
    key = ensure_dev_key(settings.hs256_key_path)
    token = mint_token(key, org="acme", pillar="sales", team="emea", clearance=3)
    principal = TokenVerifier(settings).verify(token)
    assert principal.scope == Scope("acme", "sales", "emea")
    assert principal.clearance == 3
    assert principal.subject == "dev:acme/sales/emea"


def test_expired_token_is_rejected(settings):
    key = ensure_dev_key(settings.hs256_key_path)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    token = mint_token(key, org="acme", clearance=1, now=past)
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(token)
    assert err.value.reason == "TOKEN_EXPIRED"


def test_token_signed_with_another_key_is_rejected(settings):
    ensure_dev_key(settings.hs256_key_path)
    token = mint_token(b"not-the-key" * 4, org="acme", clearance=1)
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(token)
    assert err.value.reason == "TOKEN_BAD_SIGNATURE"


@pytest.mark.parametrize("claims, reason", [
    ({"sub": "x", "org_id": "acme", "clearance": 5}, "TOKEN_CLAIMS_INVALID"),
    ({"sub": "x", "org_id": "acme", "clearance": "3"}, "TOKEN_CLAIMS_INVALID"),
    ({"sub": "x", "clearance": 2}, "TOKEN_CLAIM_MISSING"),
    ({"org_id": "acme", "clearance": 2}, "TOKEN_CLAIM_MISSING"),
    ({"sub": "x", "org_id": "acme", "team_id": "t", "clearance": 2}, "TOKEN_CLAIMS_INVALID"),
])
def test_bad_claims_are_rejected(settings, claims, reason):
    key = ensure_dev_key(settings.hs256_key_path)
    exp = int((dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).timestamp())
    token = jwt.encode({**claims, "exp": exp}, key, algorithm="HS256")
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(token)
    assert err.value.reason == reason


def test_missing_exp_is_rejected(settings):
    key = ensure_dev_key(settings.hs256_key_path)
    token = jwt.encode({"sub": "x", "org_id": "acme", "clearance": 2}, key, algorithm="HS256")
    with pytest.raises(Unauthenticated):
        TokenVerifier(settings).verify(token)


@pytest.mark.parametrize("garbage", ["", "abc", "a.b.c", "Bearer x"])
def test_malformed_token(settings, garbage):
    with pytest.raises(Unauthenticated):
        TokenVerifier(settings).verify(garbage)


def test_alg_none_is_rejected(settings):
    ensure_dev_key(settings.hs256_key_path)
    token = jwt.encode({"sub": "x", "org_id": "acme", "clearance": 4, "exp": 9999999999}, None, algorithm="none")
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(token)
    assert err.value.reason == "TOKEN_ALGORITHM_REJECTED"


@pytest.mark.parametrize("alg, make_key", [
    ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    ("EdDSA", ed25519.Ed25519PrivateKey.generate),
])
def test_asymmetric_production_keys(tmp_path, alg, make_key):
    private = make_key()
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "pub.pem").write_bytes(pem)
    settings = Settings(home=tmp_path, jwt_algorithms=[alg], jwt_public_key_file=tmp_path / "pub.pem")
    exp = int((dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).timestamp())
    claims = {"sub": "svc", "org_id": "acme", "agent_id": "", "clearance": 2, "exp": exp}
    principal = TokenVerifier(settings).verify(jwt.encode(claims, private, algorithm=alg))
    assert principal.scope == Scope("acme")
    # An HS256 token is not accepted by a server configured for asymmetric keys only.
    with pytest.raises(Unauthenticated):
        TokenVerifier(settings).verify(jwt.encode(claims, b"k" * 32, algorithm="HS256"))
    other = make_key()
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(jwt.encode(claims, other, algorithm=alg))
    assert err.value.reason == "TOKEN_BAD_SIGNATURE"


def test_a_remembered_token_still_expires(settings):
    key = ensure_dev_key(settings.hs256_key_path)
    verifier = TokenVerifier(settings)
    # exp + leeway is one second from now: valid now, expired after the sleep.
    issued = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3600 - 1 + settings.jwt_leeway_seconds)
    token = mint_token(key, org="acme", clearance=1, now=issued)
    assert verifier.verify(token).scope == Scope("acme")
    import time
    time.sleep(1.5)
    with pytest.raises(Unauthenticated):
        verifier.verify(token)


@pytest.mark.parametrize("lifetime, issued_at, accepted", [
    (dt.timedelta(hours=1), True, True),
    (dt.timedelta(hours=24), True, True),                 # the default maximum itself
    (dt.timedelta(hours=25), True, False),
    (dt.timedelta(days=100_000), True, False),            # `token mint --ttl 100000d` before the limit
    (dt.timedelta(days=30), False, False),                # no iat: what is left of it counts
])
def test_a_token_may_live_at_most_the_configured_lifetime(settings, lifetime, issued_at, accepted):
    key = ensure_dev_key(settings.hs256_key_path)
    now = dt.datetime.now(dt.UTC)
    claims = {"sub": "x", "org_id": "acme", "clearance": 2, "exp": int((now + lifetime).timestamp())}
    if issued_at:
        claims["iat"] = int(now.timestamp())
    token = jwt.encode(claims, key, algorithm="HS256")
    if accepted:
        assert TokenVerifier(settings).verify(token).scope == Scope("acme")
    else:
        with pytest.raises(Unauthenticated) as err:
            TokenVerifier(settings).verify(token)
        assert err.value.reason == "TOKEN_LIFETIME_TOO_LONG" and "jwt_max_lifetime_seconds" in err.value.message


def test_no_maximum_lifetime_when_the_setting_is_zero(tmp_path):
    settings = Settings(home=tmp_path, jwt_max_lifetime_seconds=0)
    token = mint_token(ensure_dev_key(settings.hs256_key_path), org="acme", clearance=1,
                       ttl=dt.timedelta(days=3650))
    assert TokenVerifier(settings).verify(token).clearance == 1
