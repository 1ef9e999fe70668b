"""Each org's write budget: the bytes of content and metadata its IngestEvent and PushContext
calls may write, so that one tenant writing megabytes as fast as it can never fills the log, the
projector or the database for everyone.

Counted per org in each API process with a sliding-window counter (the `limits` library): at most
`org_write_burst_bytes` in any window of burst / rate seconds, i.e. `org_write_bytes_per_second`
sustained, with bursts up to the burst. A call over the budget writes nothing and answers
RESOURCE_EXHAUSTED (ORG_WRITE_RATE_EXCEEDED) with `retry_after_seconds` in its ErrorInfo, after
holding it back up to a second (`charge`). With N
API processes an org may write up to N times the budget (each counts its own calls): the
budget bounds what one tenant can do to the shared parts, it is not a billing meter.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time

from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from context_engine.config import Settings
from context_engine.errors import ResourceExhausted

# A call is charged at least this much, so that a flood of empty-ish writes has a price too.
MIN_CHARGE_BYTES = 256
HOLD_REFUSAL_S = 1.0
HELD_PER_ORG = 8  # held refusals keep their request in memory: at most this many per org


class WriteBudget:
    def __init__(self, bytes_per_second: int, burst_bytes: int, *, hold_refusal_s: float = HOLD_REFUSAL_S) -> None:
        self.bytes_per_second = bytes_per_second
        self.hold_refusal_s = hold_refusal_s
        self.burst_bytes = burst_bytes
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage()) if bytes_per_second > 0 else None
        window = max(1, math.ceil(burst_bytes / bytes_per_second)) if bytes_per_second > 0 else 1
        self._item = RateLimitItemPerSecond(burst_bytes, window)
        self._held: collections.Counter[str] = collections.Counter()  # refusals being held, per org

    @classmethod
    def from_settings(cls, settings: Settings) -> "WriteBudget":
        return cls(settings.org_write_bytes_per_second, settings.org_write_burst_bytes)

    async def charge(self, org_id: str, nbytes: int) -> None:
        """Count a write of `nbytes` against `org_id`'s budget, or refuse it (nothing counted).

        A refusal is held back for up to HOLD_REFUSAL_S (never longer than the retry-after it
        states) while fewer than HELD_PER_ORG of the org's refusals are held: a client that
        honours retry_after_seconds loses nothing, and one that retries at once, as fast as
        it can, sends a megabyte a second instead of hundreds (measured: ~300 MiB/s of refused
        requests took 0.67 of a core from every tenant's API process)."""
        if self._limiter is None:
            return
        cost = max(nbytes, MIN_CHARGE_BYTES)
        if self._limiter.hit(self._item, org_id, cost=cost):
            return
        reset_at, _remaining = self._limiter.get_window_stats(self._item, org_id)
        retry_after = max(0.1, reset_at - time.time())
        if self._held[org_id] < HELD_PER_ORG:
            self._held[org_id] += 1
            try:
                await asyncio.sleep(min(retry_after, self.hold_refusal_s))
            finally:
                self._held[org_id] -= 1
                if not self._held[org_id]:
                    del self._held[org_id]
        raise ResourceExhausted(
            f"org {org_id} is over its write budget ({self.bytes_per_second} bytes/s, bursts up to "
            f"{self.burst_bytes} bytes); nothing was written: retry after {retry_after:.1f} s",
            reason="ORG_WRITE_RATE_EXCEEDED",
            metadata={"retry_after_seconds": f"{retry_after:.1f}", "bytes": str(cost)})


def write_bytes(content: bytes, metadata: dict[str, str]) -> int:
    """What a write is charged: its content and its metadata's UTF-8."""
    return len(content) + sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
