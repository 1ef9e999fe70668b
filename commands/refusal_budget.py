"""Each principal's refused-call budget: how many refused calls a token may make, so that a client
probing other scopes as fast as it can neither floods the audit trail (one row per refusal:
386-796 rows a second from one L2 client, issue #41) nor keeps an API process busy refusing it.

Counted per principal (org, scope path, token subject) in each API process with a sliding-window
counter (the `limits` library): `refused_calls_per_second` sustained, bursts up to
`refused_calls_burst`. Every call answered NOT_FOUND or PERMISSION_DENIED is charged (`charge`),
whether or not what it named exists, so the budget tells nothing about other scopes. While a
token is over its budget, each of its calls is answered RESOURCE_EXHAUSTED
(REFUSED_CALL_RATE_EXCEEDED, `retry_after_seconds`) before anything is read (`admit`), and counted;
the count goes to the audit trail as one summary row per token (`refused_attempts_not_recorded`:
how many, from when to when) once a second while there are any (`flush`), and at shutdown. So the
trail never loses an attempt silently. The interceptor that calls both is
entrypoints/api/interceptors.py `Authentication`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from context_engine.auth import Principal
from context_engine.config import Settings
from context_engine.errors import ResourceExhausted
from context_engine.scope import Scope

SUMMARY_OPERATION = "refused_attempts_not_recorded"
SUMMARY_REASON = "refused_call_budget_exceeded"


@dataclass
class Dropped:
    """The refusals of one principal not written to the trail since its last summary."""

    scope: Scope
    count: int
    first: float  # time.time() of the first and the last
    last: float


class RefusalBudget:
    def __init__(self, per_second: int, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage()) if per_second > 0 else None
        self._item = RateLimitItemPerSecond(burst, max(1, math.ceil(burst / per_second)) if per_second > 0 else 1)
        self._dropped: dict[str, Dropped] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> "RefusalBudget":
        return cls(settings.refused_calls_per_second, settings.refused_calls_burst)

    @staticmethod
    def _key(principal: Principal) -> str:
        return f"{principal.scope.path}\x00{principal.subject}"

    def admit(self, principal: Principal) -> None:
        """RESOURCE_EXHAUSTED, counted for the summary row, while `principal`'s refusals are over budget."""
        if self._limiter is None:
            return
        key = self._key(principal)
        if self._limiter.test(self._item, key):
            return
        now = time.time()
        dropped = self._dropped.get(key)
        if dropped is None:
            self._dropped[key] = Dropped(principal.scope, 1, now, now)
        else:
            dropped.count, dropped.last = dropped.count + 1, now
        reset_at, _remaining = self._limiter.get_window_stats(self._item, key)
        retry_after = max(0.1, reset_at - now)
        raise ResourceExhausted(
            f"this token's refused calls are over their budget ({self.per_second}/s, bursts up to {self.burst}): "
            f"the call was not served; retry after {retry_after:.1f} s",
            reason="REFUSED_CALL_RATE_EXCEEDED", metadata={"retry_after_seconds": f"{retry_after:.1f}"})

    def charge(self, principal: Principal) -> None:
        """Count one refused call of `principal`'s."""
        if self._limiter is not None:
            self._limiter.hit(self._item, self._key(principal))

    def flush(self) -> list[Dropped]:
        """The counts of unwritten rows since the last flush, one per principal, and reset them."""
        out, self._dropped = list(self._dropped.values()), {}
        return out
