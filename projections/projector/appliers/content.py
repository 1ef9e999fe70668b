"""The raw content an event carries."""

from __future__ import annotations

import base64


def decoded(content_b64: str) -> bytes:
    return base64.b64decode(content_b64, validate=True)
