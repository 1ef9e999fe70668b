"""One record as read from the log, independent of the client that read it (Faust, aiokafka,
or the event archive during replay)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogRecord:
    topic: str
    partition: int
    offset: int
    raw: bytes  # the record value: canonical event bytes (Event.to_bytes())
