"""inference/compaction.py, the sliding window both the Compact RPC and the worker run, with a
summarizer given at the seam; and the worker's job handling that reads nothing (duplicates, an
unsupported strategy, compaction on threshold off)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from context_engine.errors import FailedPrecondition, Unavailable
from inference.compaction import plan_sliding_window
from inference.summarizers import SummarizerError
from inference.summarizers.extractive import ExtractiveSummarizer
from streams.compaction_worker import CompactionWorker


@dataclass(frozen=True)
class T:
    event_id: str
    content: bytes
    role: str = "user"
    token_count: int = 7


def turns(n: int) -> list[T]:
    return [T(f"e{i}", f"order INV-{1000 + i} ships on day {i + 1}".encode()) for i in range(n)]


class Fixed:
    name = "fixed"

    def __init__(self, answer: str | Exception) -> None:
        self.answer = answer

    async def summarize(self, _turns) -> str:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def plan(summarizer, items, keep=3, limit=1 << 20):
    return await plan_sliding_window(summarizer, "s", items, keep_recent=keep, max_content_bytes=limit)


@pytest.mark.parametrize("n", [0, 1, 3, 4])
async def test_fewer_than_two_turns_older_than_the_window_is_nothing_to_compact(n) -> None:
    with pytest.raises(FailedPrecondition) as refused:
        await plan(ExtractiveSummarizer(), turns(n))
    assert refused.value.reason == "NOTHING_TO_COMPACT"


async def test_the_turns_before_the_window_are_replaced_by_one_scored_summary() -> None:
    items = turns(7)
    done = await plan(ExtractiveSummarizer(), items)
    assert done.replaced == ("e0", "e1", "e2", "e3")
    assert done.original_tokens == 4 * 7 and done.compacted_tokens > 0
    assert done.score.score == 1.0 and b"INV-1003" in done.summary and b"INV-1004" not in done.summary
    body = done.event_body("v0", "sliding_window", "extractive")
    assert body.summary == done.summary and body.base_version == "v0" and body.replaced == done.replaced


async def test_a_summary_that_loses_a_fact_a_failing_summarizer_and_a_huge_summary_are_refused() -> None:
    items = turns(6)
    lossy = " ".join(f"order INV-{1000 + i} ships on day {i + 1}" for i in range(2))  # INV-1002 and day 3 lost
    with pytest.raises(FailedPrecondition) as low:
        await plan(Fixed(lossy), items)
    assert low.value.reason == "QUALITY_GUARDRAIL_TRIGGERED" and "'inv-1002'" in low.value.metadata["missing"]
    with pytest.raises(Unavailable) as down:
        await plan(Fixed(SummarizerError("503 from the backend")), items)
    assert down.value.reason == "SUMMARIZER_UNAVAILABLE" and "503" in str(down.value)
    with pytest.raises(FailedPrecondition) as big:
        await plan(ExtractiveSummarizer(), items, limit=10)
    assert big.value.reason == "SUMMARY_TOO_LARGE"


def worker(enabled: bool) -> CompactionWorker:
    async def send(_event) -> None:
        raise AssertionError("nothing may be written")

    return CompactionWorker(None, Fixed("unused"), send, enabled=enabled, keep_recent=3,  # type: ignore[arg-type]
                            max_content_bytes=1 << 20, verdict_timeout_s=1.0)


async def test_the_worker_handles_a_message_id_once_and_reads_nothing_for_what_it_may_not_do() -> None:
    off = worker(enabled=False)
    assert await off.job("m1", "org", "s", "sliding_window") == "disabled"
    assert await off.job("m1", "org", "s", "sliding_window") == "duplicate"
    on = worker(enabled=True)
    assert await on.job("m2", "org", "s", "summarize_everything") == "unsupported_strategy"
    assert await on.job("m2", "org", "s", "sliding_window") == "duplicate"
