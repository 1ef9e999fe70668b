"""The per-org write budget, with the real `limits` counter (no clock is faked: every assertion
holds however long the test takes, as long as it takes less than the window)."""

from __future__ import annotations

import asyncio

import pytest

from commands.write_budget import HELD_PER_ORG, MIN_CHARGE_BYTES, WriteBudget, write_bytes
from context_engine.errors import ResourceExhausted


async def test_an_org_over_its_burst_is_refused_and_the_others_are_not():
    budget = WriteBudget(bytes_per_second=1_000, burst_bytes=3_600_000, hold_refusal_s=0)  # a window of an hour
    for _ in range(3):
        await budget.charge("org-a", 1_000_000)
    with pytest.raises(ResourceExhausted) as refused:
        await budget.charge("org-a", 1_000_000)
    assert refused.value.reason == "ORG_WRITE_RATE_EXCEEDED"
    assert float(refused.value.metadata["retry_after_seconds"]) > 0
    assert "nothing was written" in refused.value.message
    await budget.charge("org-b", 1_000_000)  # another org's budget is its own
    await budget.charge("org-a", 500_000)  # a refusal counted nothing: what was left is still there
    with pytest.raises(ResourceExhausted):
        await budget.charge("org-a", 200_000)


async def test_small_calls_pay_a_minimum_and_no_budget_refuses_nothing():
    budget = WriteBudget(bytes_per_second=1, burst_bytes=10 * MIN_CHARGE_BYTES, hold_refusal_s=0)
    for _ in range(10):
        await budget.charge("org", 1)
    with pytest.raises(ResourceExhausted):
        await budget.charge("org", 1)
    unlimited = WriteBudget(0, 1)
    for _ in range(1000):
        await unlimited.charge("org", 10**9)


async def test_refusals_are_held_back_a_few_at_a_time_per_org():
    """A client retrying at once waits before each refusal; past HELD_PER_ORG held refusals of
    one org the rest are answered at once (a held one keeps its request in memory), and another
    org's calls are not held behind them."""
    budget = WriteBudget(bytes_per_second=1, burst_bytes=1_000, hold_refusal_s=30)
    await budget.charge("org", 1_000)
    calls = [asyncio.create_task(budget.charge("org", 1_000)) for _ in range(HELD_PER_ORG + 3)]
    await asyncio.sleep(0)  # every call runs up to its hold, or to its refusal
    done = [c for c in calls if c.done()]
    assert len(done) == 3 and all(isinstance(c.exception(), ResourceExhausted) for c in done)
    await budget.charge("other-org", 1_000)  # not held behind org's refusals
    for c in calls:
        c.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    assert not budget._held


def test_a_write_is_charged_its_content_and_metadata_bytes():
    assert write_bytes(b"abc", {"kéy": "välue"}) == 3 + len("kéy".encode()) + len("välue".encode())


def test_the_burst_must_hold_the_largest_content():
    from context_engine.config import Settings

    with pytest.raises(ValueError, match="org_write_burst_bytes"):
        Settings(max_content_bytes=2_000_000, org_write_burst_bytes=1_000_000)
    Settings(max_content_bytes=2_000_000, org_write_burst_bytes=1_000_000, org_write_bytes_per_second=0)
