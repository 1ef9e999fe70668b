"""The consumer's fetch wait: short while records flow, long after a run of empty fetches, short
again as soon as a fetch brings records."""

from context_engine.streams.fetch_wait import AdaptiveFetchWait


class FakeFetcher:
    """aiokafka's Fetcher as far as AdaptiveFetchWait touches it: the wait it reads for each
    request, and the coroutine that performs one (True when it added records)."""

    def __init__(self, answers: list[bool]) -> None:
        self._fetch_max_wait_ms = 1500
        self.answers = iter(answers)
        self.waits_sent: list[int] = []

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:
        self.waits_sent.append(self._fetch_max_wait_ms)
        return next(self.answers)


async def test_the_wait_lengthens_after_a_run_of_empty_fetches_and_shortens_on_records():
    fetcher = FakeFetcher([True, False, False, False, False, True, False])
    AdaptiveFetchWait(busy_ms=5, idle_ms=50, idle_after=3).install(fetcher)
    results = [await fetcher._proc_fetch_request(None, 0, None) for _ in range(7)]
    assert results == [True, False, False, False, False, True, False]  # answers pass through
    #                         after: rec  e1  e2  e3(idle) e4  rec  e1
    assert fetcher.waits_sent == [5, 5, 5, 5, 50, 50, 5]
    assert fetcher._fetch_max_wait_ms == 5


def test_the_idle_wait_is_never_shorter_than_the_busy_one():
    wait = AdaptiveFetchWait(busy_ms=20, idle_ms=5, idle_after=1)
    assert wait.after_fetch(False) == 20
