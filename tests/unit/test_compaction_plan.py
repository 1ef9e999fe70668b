"""inference/compaction.py, the sliding window both the Compact RPC and the worker run, with a
summarizer given at the seam; and the worker's job handling that reads nothing (duplicates, an
unsupported strategy, compaction on threshold off)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from context_engine.errors import FailedPrecondition, Unavailable
from inference.compaction import plan_sliding_window
from inference.summarizers import SummarizerError, Summary, SummaryLine
from inference.summarizers.extractive import ExtractiveSummarizer
from streams.compaction_worker import CompactionWorker


@dataclass(frozen=True)
class T:
    event_id: str
    content: bytes
    role: str = "user"
    token_count: int = 7
    summary: bool = False


def turns(n: int) -> list[T]:
    return [T(f"e{i}", f"Hello there, good morning! Order INV-{1000 + i} ships on day {i + 1}. Thanks a lot, "
                       "that is great to hear.".encode(), token_count=25) for i in range(n)]


class Fixed:
    name = "fixed"

    def __init__(self, answer: str | Exception) -> None:
        self.answer = answer

    async def summarize(self, turns) -> Summary:
        if isinstance(self.answer, Exception):
            raise self.answer
        return Summary(tuple(SummaryLine(0, line) for line in self.answer.splitlines()))


async def plan(summarizer, items, keep=3, limit=1 << 20, session_tokens=None, min_savings=0.1):
    total = sum(t.token_count for t in items) if session_tokens is None else session_tokens
    return await plan_sliding_window(summarizer, "s", items, keep_recent=keep, max_content_bytes=limit,
                                     session_tokens=total, min_savings=min_savings)


@pytest.mark.parametrize("n", [0, 1, 3, 4])
async def test_fewer_than_two_turns_older_than_the_window_is_nothing_to_compact(n) -> None:
    with pytest.raises(FailedPrecondition) as refused:
        await plan(ExtractiveSummarizer(), turns(n))
    assert refused.value.reason == "NOTHING_TO_COMPACT"


async def test_the_turns_before_the_window_are_replaced_by_one_scored_summary() -> None:
    items = turns(7)
    done = await plan(ExtractiveSummarizer(), items)
    assert done.replaced == ("e0", "e1", "e2", "e3")
    assert done.original_tokens == 4 * 25 and 0 < done.compacted_tokens < done.original_tokens
    assert done.score.score == 1.0 and b"INV-1003" in done.summary and b"INV-1004" not in done.summary
    body = done.event_body("v0", "sliding_window", "extractive")
    assert body.summary == done.summary and body.base_version == "v0" and body.replaced == done.replaced
    assert body.stands_for == done.replaced  # a line per turn, each standing for its turn
    assert len(body.line_tokens) == 4 and sum(body.line_tokens) == body.compacted_tokens
    assert body.compaction_id == done.compaction_id


async def test_two_plans_of_one_state_are_two_compactions() -> None:
    a, b = [await plan(ExtractiveSummarizer(), turns(7)) for _ in range(2)]
    assert a.summary == b.summary and a.compaction_id != b.compaction_id
    body_a, body_b = (p.event_body("v0", "sliding_window", "extractive") for p in (a, b))
    assert body_a.to_payload() != body_b.to_payload()  # their events hash, and so version, apart


async def test_an_earlier_summary_s_lines_are_not_summarised_again() -> None:
    items = [T("l0", b"user: Order INV-9 ships on day 9.", summary=True), *turns(6)]
    done = await plan(ExtractiveSummarizer(), items)
    assert "l0" not in done.replaced and done.replaced == ("e0", "e1", "e2")


async def test_a_compaction_that_saves_too_little_is_refused() -> None:
    items = turns(7)
    with pytest.raises(FailedPrecondition) as small:
        await plan(ExtractiveSummarizer(), items, session_tokens=100_000)  # the saving is < 10 % of the session
    assert small.value.reason == "INSUFFICIENT_SAVINGS"
    assert small.value.metadata["session_tokens"] == "100000"
    same = "\n".join(t.content.decode() for t in items[:4])
    with pytest.raises(FailedPrecondition) as nothing:
        await plan(Fixed(same), items)  # the turns themselves: nothing saved
    assert nothing.value.reason == "INSUFFICIENT_SAVINGS"


async def test_a_summary_that_loses_a_fact_a_failing_summarizer_and_a_huge_summary_are_refused() -> None:
    items = turns(6)
    lossy = " ".join(f"Order INV-{1000 + i} ships on day {i + 1}." for i in range(2))  # INV-1002 and day 3 lost
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
    on = worker(enabled=True)
    assert await on.job("m2", "org", "s", "summarize_everything") == "unsupported_strategy"
    assert await on.job("m2", "org", "s", "sliding_window") == "duplicate"
