"""A consumer fetch wait that lengthens while the log is idle.

The bundled broker holds every fetch for the consumer's full fetch wait, so the wait bounds how
soon an appended event is projected (5 ms by default). But a consumer with nothing to read then
asks 200 times a second, and each ask costs the broker more the more record batches it holds:
an idle 100,000-chunk stack spent a third of a core (broker ~19 %, worker ~15 %) answering empty
fetches. After `idle_after` empty fetches in a row the wait becomes `idle_ms`; the first fetch
that brings records restores `busy_ms`. Only the first event after a quiet spell waits longer.

Records of `background_topics` count as nothing: telemetry nobody waits for (the baseline
metric that 5 % of AssembleContext calls publish) would otherwise keep the wait short under a
read-only load, at ~0.09 of the two cores in the broker and the worker (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any


class AdaptiveFetchWait:
    def __init__(self, busy_ms: int, idle_ms: int, idle_after: int,
                 background_topics: frozenset[str] = frozenset()) -> None:
        self.busy_ms = busy_ms
        self.idle_ms = max(busy_ms, idle_ms)
        self.idle_after = idle_after
        self.background_topics = background_topics
        self.empty_in_a_row = 0

    def after_fetch(self, brought_records: bool) -> int:
        """The wait for the next fetch, given what this one brought."""
        self.empty_in_a_row = 0 if brought_records else self.empty_in_a_row + 1
        return self.idle_ms if self.empty_in_a_row >= self.idle_after else self.busy_ms

    def install(self, fetcher: Any) -> None:
        """Drive an aiokafka Fetcher's wait: it reads `_fetch_max_wait_ms` for every request it
        builds, `_proc_fetch_request` returns whether a response added records, and `_records`
        holds the buffered records by TopicPartition."""
        fetch = fetcher._proc_fetch_request

        async def fetch_and_adapt(assignment: Any, node_id: Any, request: Any) -> bool:
            brought = await fetch(assignment, node_id, request)
            awaited = bool(brought) and any(tp.topic not in self.background_topics for tp in fetcher._records)
            fetcher._fetch_max_wait_ms = self.after_fetch(awaited)
            return brought

        fetcher._fetch_max_wait_ms = self.busy_ms
        fetcher._proc_fetch_request = fetch_and_adapt
