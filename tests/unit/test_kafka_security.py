"""An external Kafka's SASL and TLS settings become the same arguments for every aiokafka client
and for Faust (streams/kafka_security.py). Faust's own translation of its credentials is the
check: what the worker's consumers get is what every other client gets."""

from __future__ import annotations

import datetime as dt
import ssl

import faust
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from context_engine.config import Settings
from streams.kafka_security import client_security, faust_credentials
from tests.fixtures.compose import _compose


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA certificate and a client certificate with its (encrypted) key, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "context-engine test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "client.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"key-secret")))
    return d


def settings(**fields) -> Settings:
    return Settings(**fields)


def test_plaintext_is_the_default():
    s = settings()
    assert client_security(s) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(s) is None
    assert credentials_to_aiokafka_auth(faust_credentials(s)) == client_security(s)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])  # PLAIN: refused, below
def test_sasl_without_tls(mechanism):
    s = settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism=mechanism,
                 kafka_sasl_username="engine", kafka_sasl_password="s3cret")
    assert client_security(s) == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                                  "sasl_plain_username": "engine", "sasl_plain_password": "s3cret"}
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert credentials_to_aiokafka_auth(creds) == {**client_security(s), "ssl_context": None}
    assert "s3cret" not in repr(creds) and "s3cret" not in repr(s)


def _without_context(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "ssl_context"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_over_tls_with_a_private_ca(pki, mechanism):
    s = settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism=mechanism, kafka_sasl_username="engine",
                 kafka_sasl_password="s3cret", kafka_ssl_cafile=pki / "ca.pem")
    kwargs = client_security(s)
    assert _without_context(kwargs) == {"security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
                                        "sasl_plain_username": "engine", "sasl_plain_password": "s3cret"}
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "context-engine test"),),)]
    faust_kwargs = credentials_to_aiokafka_auth(faust_credentials(s))
    assert _without_context(faust_kwargs) == _without_context(kwargs)
    assert faust_kwargs["ssl_context"].get_ca_certs() == context.get_ca_certs()


def test_tls_with_a_client_certificate(pki):
    s = settings(kafka_security_protocol="SSL", kafka_ssl_cafile=pki / "ca.pem", kafka_ssl_certfile=pki / "client.pem",
                 kafka_ssl_keyfile=pki / "client.key", kafka_ssl_key_password="key-secret")
    kwargs = client_security(s)
    assert _without_context(kwargs) == {"security_protocol": "SSL"}
    assert kwargs["ssl_context"].get_ca_certs()
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SSLCredentials)
    assert _without_context(credentials_to_aiokafka_auth(creds)) == {"security_protocol": "SSL"}
    with pytest.raises(ssl.SSLError):  # the key's password is used, not ignored
        client_security(settings(kafka_security_protocol="SSL", kafka_ssl_certfile=pki / "client.pem",
                                 kafka_ssl_keyfile=pki / "client.key", kafka_ssl_key_password="wrong"))


def test_tls_with_the_systems_cas():
    kwargs = client_security(settings(kafka_security_protocol="SSL"))
    assert kwargs["security_protocol"] == "SSL" and kwargs["ssl_context"].check_hostname


@pytest.mark.parametrize("fields, message", [
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "engine"}, "needs kafka_sasl_username and"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_password": "x"}, "needs kafka_sasl_username and"),
    ({"kafka_ssl_cafile": "/etc/ssl/ca.pem"}, "TLS is used only with SSL or SASL_SSL"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u", "kafka_sasl_password": "p",
      "kafka_ssl_cafile": "/etc/ssl/ca.pem"}, "TLS is used only"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_keyfile": "/k.pem"}, "needs kafka_ssl_certfile"),
    # the password itself, unencrypted: the error names both fields and what to use instead
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN", "kafka_sasl_username": "u",
      "kafka_sasl_password": "p"},
     "kafka_sasl_mechanism PLAIN .* kafka_security_protocol SASL_PLAINTEXT: use SASL_SSL, or SCRAM"),
], ids=["sasl-no-password", "sasl-no-username", "ca-without-tls", "ca-with-sasl-plaintext", "key-without-cert",
        "plain-over-sasl-plaintext"])
def test_settings_that_would_not_do_what_they_say_are_refused(fields, message):
    s = settings(**fields)
    with pytest.raises(ValueError, match=message):
        client_security(s)
    with pytest.raises(ValueError, match=message):
        faust_credentials(s)


def test_compose_gives_the_engine_what_its_broker_and_database_ask_for(monkeypatch):
    """compose.yaml cannot run here (no Docker): its engine's settings are read as the engine
    would and checked against the SCRAM user its Redpanda makes and the password its PostgreSQL
    takes."""
    from urllib.parse import urlsplit

    secrets = {"KAFKA_PASSWORD": "from-the-env-file", "POSTGRES_PASSWORD": "another-from-the-env-file",
               "DETECTOR_TOKEN": "t"}
    compose = _compose(secrets)
    environments = [compose["services"][name]["environment"] for name in ("migrate", "worker", "api")]
    assert all(e.items() >= environments[0].items() for e in environments)  # one engine environment
    for name, value in environments[0].items():
        monkeypatch.setenv(name, str(value))
    user, secret, mechanism = compose["services"]["redpanda"]["environment"]["RP_BOOTSTRAP_USER"].split(":")
    s = Settings()
    assert client_security(s) == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                                  "sasl_plain_username": user, "sasl_plain_password": secret}
    assert secret == secrets["KAFKA_PASSWORD"]
    assert credentials_to_aiokafka_auth(faust_credentials(s)) == {**client_security(s), "ssl_context": None}
    assert "enable_sasl=true" in compose["services"]["redpanda"]["command"]
    assert f'superusers=["{user}"]' in compose["services"]["redpanda"]["command"]
    database = compose["services"]["postgres"]["environment"]
    url = urlsplit(s.database_url)
    assert (url.username, url.password) == (database["POSTGRES_USER"], database["POSTGRES_PASSWORD"])
    assert database["POSTGRES_PASSWORD"] == secrets["POSTGRES_PASSWORD"]


@pytest.mark.parametrize("missing", ["KAFKA_PASSWORD", "POSTGRES_PASSWORD", "DETECTOR_TOKEN"])
def test_compose_has_no_default_secret(missing):
    """Without the variable compose stops (`${VAR:?...}`), instead of a password everyone knows."""
    with pytest.raises(LookupError, match=missing):
        _compose({"KAFKA_PASSWORD": "k", "POSTGRES_PASSWORD": "p", "DETECTOR_TOKEN": "t", missing: ""})


def test_compose_publishes_the_database_and_the_broker_on_the_loopback_at_most():
    """The engine reaches them on the compose network; a port published on every interface would
    put the superuser's login and the broker on the host's network."""
    services = _compose({"KAFKA_PASSWORD": "k", "POSTGRES_PASSWORD": "p", "DETECTOR_TOKEN": "t"})["services"]
    for name in ("postgres", "redpanda"):
        for port in services[name].get("ports", []):
            assert str(port.get("host_ip") if isinstance(port, dict) else port).startswith("127.0.0.1"), (name, port)


def test_the_worker_bootstraps_from_every_broker_a_cluster_names(monkeypatch, tmp_path):
    """CONTEXT_ENGINE_KAFKA_BOOTSTRAP lists a cluster's brokers, comma-separated (aiokafka's form);
    Faust takes one URL per broker (compose.kafka-cluster.yaml)."""
    from streams.app import _worker_app

    monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
    app = _worker_app(Settings(), "redpanda:9092, redpanda-1:9092,redpanda-2:9092")
    assert [(u.scheme, u.host, u.port) for u in app.conf.broker] == [
        ("kafka", "redpanda", 9092), ("kafka", "redpanda-1", 9092), ("kafka", "redpanda-2", 9092)]
