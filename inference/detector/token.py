"""The detector's service token: what its server requires and what every client of it sends.

`detector_service_token` when set (CONTEXT_ENGINE_DETECTOR_SERVICE_TOKEN); else the secret in
`detector_service_token_file` (default `<home>/keys/detector-service.token`): 64 hex digits from
`secrets`, made mode 0600 on first use by whoever needs it first (`up` before it starts anything,
else the detector or a client of it; a concurrent creator's file wins, `auth.ensure_secret`). Both
sides of one home therefore agree without being told. The token is never logged: callers keep it
out of every log line, and settings hold it as a SecretStr.
"""

from __future__ import annotations

import re

from context_engine.auth import ensure_secret
from context_engine.config import Settings

# What may stand after "Bearer ": visible ASCII, no spaces. An empty token would let an empty
# bearer in; one with spaces or controls cannot travel in gRPC metadata.
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")


def service_token(settings: Settings) -> str:
    """The token, generating the home's file when it is the one used and is missing. ValueError
    for a configured token that could not be sent (empty, spaces, not ASCII)."""
    if settings.detector_service_token is not None:
        token = settings.detector_service_token.get_secret_value()
        source = "detector_service_token"
    else:
        token = ensure_secret(settings.detector_service_token_path)
        source = str(settings.detector_service_token_path)
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"the detector service token ({source}) must be 1-4096 visible ASCII characters "
                         "without spaces")
    return token


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries it."""
    return (("authorization", f"Bearer {token}"),)
