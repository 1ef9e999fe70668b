"""Input checks shared by the command handlers. Each failure names the field; nothing is
written before every check has passed."""

from __future__ import annotations

import re
from collections.abc import Mapping

from context_engine.errors import InvalidArgument
from context_engine.hashing import is_sha256_hex
from context_engine.scope import ID_PATTERN

_SESSION_ID = ID_PATTERN
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 4096


def session_id(value: str, field: str = "session_id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not _SESSION_ID.match(value):
        raise InvalidArgument(field, "must be 1-128 characters of [A-Za-z0-9._:@-], starting alphanumeric")
    return value


def one_of(value: str, allowed: tuple[str, ...], field: str) -> str:
    if value not in allowed:
        raise InvalidArgument(field, f"must be one of {', '.join(allowed)}; got {value!r}")
    return value


def content(value: bytes, limit: int, field: str = "content") -> bytes:
    if not value:
        raise InvalidArgument(field, "is empty")
    if len(value) > limit:
        raise InvalidArgument(field, f"is {len(value)} bytes; the limit is {limit}",
                              reason="CONTENT_TOO_LARGE")
    return value


def metadata(value: Mapping[str, str], field: str = "metadata") -> dict[str, str]:
    if len(value) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(field, f"has {len(value)} entries; at most {MAX_METADATA_ENTRIES}")
    for key, item in value.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise InvalidArgument(field, f"keys must be 1-{MAX_METADATA_KEY} characters")
        if len(item) > MAX_METADATA_VALUE:
            raise InvalidArgument(f"{field}[{key}]", f"is longer than {MAX_METADATA_VALUE} characters")
    return dict(value)


def version_hash(value: str, field: str) -> str:
    if not is_sha256_hex(value):
        raise InvalidArgument(field, "must be a lowercase hex SHA-256 (64 characters)")
    return value


def name(value: str, field: str) -> str:
    if not value or not _NAME.match(value):
        raise InvalidArgument(field, "must be 1-128 printable characters")
    return value
