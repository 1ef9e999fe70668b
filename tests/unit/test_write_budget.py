"""The per-org write budget, with the real `limits` counter (no clock is faked: every assertion
holds however long the test takes, as long as it takes less than the window)."""

from __future__ import annotations

import pytest

from context_engine.commands.write_budget import MIN_CHARGE_BYTES, WriteBudget, write_bytes
from context_engine.errors import ResourceExhausted


def test_an_org_over_its_burst_is_refused_and_the_others_are_not():
    budget = WriteBudget(bytes_per_second=1_000, burst_bytes=3_600_000)  # a window of an hour
    for _ in range(3):
        budget.charge("org-a", 1_000_000)
    with pytest.raises(ResourceExhausted) as refused:
        budget.charge("org-a", 1_000_000)
    assert refused.value.reason == "ORG_WRITE_RATE_EXCEEDED"
    assert float(refused.value.metadata["retry_after_seconds"]) > 0
    assert "nothing was written" in refused.value.message
    budget.charge("org-b", 1_000_000)  # another org's budget is its own
    budget.charge("org-a", 500_000)  # a refusal counted nothing: what was left is still there
    with pytest.raises(ResourceExhausted):
        budget.charge("org-a", 200_000)


def test_small_calls_pay_a_minimum_and_no_budget_refuses_nothing():
    budget = WriteBudget(bytes_per_second=1, burst_bytes=10 * MIN_CHARGE_BYTES)
    for _ in range(10):
        budget.charge("org", 1)
    with pytest.raises(ResourceExhausted):
        budget.charge("org", 1)
    unlimited = WriteBudget(0, 1)
    for _ in range(1000):
        unlimited.charge("org", 10**9)


def test_a_write_is_charged_its_content_and_metadata_bytes():
    assert write_bytes(b"abc", {"kéy": "välue"}) == 3 + len("kéy".encode()) + len("välue".encode())


def test_the_burst_must_hold_the_largest_content():
    from context_engine.config import Settings

    with pytest.raises(ValueError, match="org_write_burst_bytes"):
        Settings(max_content_bytes=2_000_000, org_write_burst_bytes=1_000_000)
    Settings(max_content_bytes=2_000_000, org_write_burst_bytes=1_000_000, org_write_bytes_per_second=0)
