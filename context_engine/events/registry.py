"""The event types the engine knows: type name -> body class, and the schema versions and
upcasters read from those classes.

A body class (`EventBody`) names its type and current schema version, turns itself into the
payload dict written to the log (`to_payload`) and back (`from_payload`), and keeps the upcasters
of its older versions beside it. `CURRENT_VERSIONS` and `UPCASTERS` are plain dicts built from
the classes, so `decode` (and a test that registers a type of its own) reads one table.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, ClassVar, Self, TypeVar

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]


class EventBody:
    """What an event says, typed. Subclasses are frozen dataclasses registered with `event_type`."""

    __slots__ = ()

    TYPE: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int]
    # from_version -> the function producing from_version + 1
    UPCASTERS: ClassVar[dict[int, Upcaster]] = {}

    def to_payload(self) -> Payload:
        raise NotImplementedError

    @classmethod
    def from_payload(cls, payload: Payload) -> Self:
        raise NotImplementedError


def content_b64(content: bytes) -> str:
    """How an event carries raw content (any bytes): standard base64, in its `content_b64` field."""
    return base64.b64encode(content).decode("ascii")


def carried_content(encoded: str) -> bytes:
    """The raw content back; anything but valid base64 is a ValueError (binascii.Error)."""
    return base64.b64decode(encoded, validate=True)


BODY_TYPES: dict[str, type[EventBody]] = {}
# type -> current schema version (an event type without a body class may be added, e.g. by a test)
CURRENT_VERSIONS: dict[str, int] = {}
# (type, from_version) -> function producing from_version + 1
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


B = TypeVar("B", bound=type[EventBody])


def event_type(cls: B) -> B:
    """Register a body class: its type, its version and its upcasters."""
    if cls.TYPE in BODY_TYPES:
        raise ValueError(f"event type {cls.TYPE!r} registered twice")
    BODY_TYPES[cls.TYPE] = cls
    CURRENT_VERSIONS[cls.TYPE] = cls.SCHEMA_VERSION
    UPCASTERS.update({(cls.TYPE, v): f for v, f in cls.UPCASTERS.items()})
    return cls
