"""What the worker says of a log record it refused (streams/record_auth.py)."""

from __future__ import annotations

import time

import structlog

from context_engine.metrics import LOG_RECORDS_REFUSED
from streams.record_auth import Refusal
from streams.topics import LogTopics

log = structlog.get_logger("context_engine.worker")

# Refused records logged per minute at most: a process flooding the broker must not flood this log too.
REFUSALS_LOGGED_PER_MINUTE = 60


class RefusalLog:
    """What the worker says of a record it refused: always counted (by stream and reason), logged
    by position and key id only, never its content (it may be anything a forger chose), at most
    REFUSALS_LOGGED_PER_MINUTE a minute, then once how many more were not logged."""

    def __init__(self, topics: LogTopics) -> None:
        self._topics = topics
        self._window_started = -60.0
        self._logged = self._unlogged = 0

    def __call__(self, topic: str, partition: int, offset: int, refusal: Refusal) -> None:
        LOG_RECORDS_REFUSED.labels(self._topics.stream_of(topic), refusal.reason).inc()
        now = time.monotonic()
        if now - self._window_started >= 60.0:
            if self._unlogged:
                log.warning("log records refused and not logged", count=self._unlogged, seconds=60)
            self._window_started, self._logged, self._unlogged = now, 0, 0
        if self._logged >= REFUSALS_LOGGED_PER_MINUTE:
            self._unlogged += 1
            return
        self._logged += 1
        log.warning("log record refused: not from a trusted writer", topic=topic, partition=partition,
                    offset=offset, key_id=refusal.key_id, reason=refusal.reason)
