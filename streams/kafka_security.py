"""How every client reaches an external Kafka that authenticates its clients: SASL (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512) and TLS, from the `kafka_*` settings.

`client_security` gives the keyword arguments every aiokafka client of the engine takes beside
`bootstrap_servers` (producers, consumers, admin clients); `faust_credentials` gives the Faust
worker's `broker_credentials`, which Faust turns into the same arguments for its own clients
(faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth). The bundled broker takes
PLAINTEXT only.

SASL PLAIN sends the password itself, so it is taken over SASL_SSL only: PLAIN over
SASL_PLAINTEXT is a settings error, and no setting allows it. SCRAM is taken over SASL_PLAINTEXT:
it never sends the password (the records still cross the network in the clear).
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.helpers import create_ssl_context

_SASL = ("SASL_PLAINTEXT", "SASL_SSL")
_TLS = ("SSL", "SASL_SSL")


def _check(settings: Any) -> None:
    protocol = settings.kafka_security_protocol
    if protocol in _SASL and not (settings.kafka_sasl_username and settings.kafka_sasl_password):
        raise ValueError(f"kafka_security_protocol {protocol} needs kafka_sasl_username and kafka_sasl_password")
    if protocol == "SASL_PLAINTEXT" and settings.kafka_sasl_mechanism == "PLAIN":
        raise ValueError("kafka_sasl_mechanism PLAIN sends the password in the clear with kafka_security_protocol "
                         "SASL_PLAINTEXT: use SASL_SSL, or SCRAM-SHA-256 / SCRAM-SHA-512")
    tls_files = [name for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")
                 if getattr(settings, name) is not None]
    if protocol not in _TLS and tls_files:
        raise ValueError(f"{', '.join(tls_files)} set but kafka_security_protocol is {protocol}: "
                         "TLS is used only with SSL or SASL_SSL")
    if settings.kafka_ssl_keyfile is not None and settings.kafka_ssl_certfile is None:
        raise ValueError("kafka_ssl_keyfile needs kafka_ssl_certfile (the client certificate it belongs to)")


def ssl_context(settings: Any) -> ssl.SSLContext | None:
    """The TLS context of SSL and SASL_SSL (hostnames checked; the system's CAs unless
    kafka_ssl_cafile), else None."""
    _check(settings)
    if settings.kafka_security_protocol not in _TLS:
        return None
    password = settings.kafka_ssl_key_password
    return create_ssl_context(cafile=settings.kafka_ssl_cafile, certfile=settings.kafka_ssl_certfile,
                              keyfile=settings.kafka_ssl_keyfile,
                              password=password.get_secret_value() if password is not None else None)


def client_security(settings: Any) -> dict[str, Any]:
    """aiokafka's security arguments (never log them: they hold the SASL password)."""
    _check(settings)
    protocol = settings.kafka_security_protocol
    kwargs: dict[str, Any] = {"security_protocol": protocol}
    if protocol in _TLS:
        kwargs["ssl_context"] = ssl_context(settings)
    if protocol in _SASL:
        kwargs.update(sasl_mechanism=settings.kafka_sasl_mechanism,
                      sasl_plain_username=settings.kafka_sasl_username,
                      sasl_plain_password=settings.kafka_sasl_password.get_secret_value())
    return kwargs


def faust_credentials(settings: Any):
    """Faust's `broker_credentials` for the same settings: None for PLAINTEXT."""
    import faust

    _check(settings)
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context(settings))
    # SASLCredentials is SASL_SSL when it has a TLS context, SASL_PLAINTEXT when not.
    return faust.SASLCredentials(username=settings.kafka_sasl_username,
                                 password=settings.kafka_sasl_password.get_secret_value(),
                                 ssl_context=ssl_context(settings), mechanism=settings.kafka_sasl_mechanism)
