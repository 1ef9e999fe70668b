"""The consumer's fetch wait: short while records flow, long after a run of empty fetches, short
again as soon as a fetch brings records that someone waits for (telemetry does not count)."""

from aiokafka.structs import TopicPartition

from streams.fetch_wait import AdaptiveFetchWait
from streams.topics import LogTopics


class FakeFetcher:
    """aiokafka's Fetcher as far as AdaptiveFetchWait touches it: the wait it reads for each
    request, the coroutine that performs one (True when it added records) and the buffered
    records by partition. Each answer names the topics whose records a fetch brings."""

    def __init__(self, answers: list[list[str]]) -> None:
        self._fetch_max_wait_ms = 1500
        self._records: dict[TopicPartition, object] = {}
        self.answers = iter(answers)
        self.waits_sent: list[int] = []

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:
        self.waits_sent.append(self._fetch_max_wait_ms)
        self._records = {TopicPartition(topic, 0): object() for topic in next(self.answers)}  # drained in between
        return bool(self._records)


async def test_the_wait_lengthens_after_a_run_of_empty_fetches_and_shortens_on_records():
    fetcher = FakeFetcher([["events"], [], [], [], [], ["events"], []])
    AdaptiveFetchWait(busy_ms=5, idle_ms=50, idle_after=3).install(fetcher)
    results = [await fetcher._proc_fetch_request(None, 0, None) for _ in range(7)]
    assert results == [True, False, False, False, False, True, False]  # answers pass through
    #                         after: rec  e1  e2  e3(idle) e4  rec  e1
    assert fetcher.waits_sent == [5, 5, 5, 5, 50, 50, 5]
    assert fetcher._fetch_max_wait_ms == 5


async def test_records_of_background_topics_count_as_an_empty_fetch():
    topics = LogTopics("ce", 4, 4)
    baseline = topics.jobs["metrics:baseline"]
    fetcher = FakeFetcher([[baseline], [baseline], [], [baseline], [baseline, topics.events], [baseline]])
    AdaptiveFetchWait(busy_ms=5, idle_ms=50, idle_after=3, background_topics=topics.telemetry).install(fetcher)
    results = [await fetcher._proc_fetch_request(None, 0, None) for _ in range(6)]
    assert results == [True, True, False, True, True, True]  # the consumer still gets every record
    #                         after: bg  bg  e(idle) bg  events  bg
    assert fetcher.waits_sent == [5, 5, 5, 50, 50, 5]
    assert fetcher._fetch_max_wait_ms == 5


def test_only_the_telemetry_streams_are_background():
    topics = LogTopics("ce", 4, 4)
    assert topics.telemetry == {"ce.metrics-baseline", "ce.audit-access"}
    assert topics.events not in topics.telemetry


def test_the_idle_wait_is_never_shorter_than_the_busy_one():
    wait = AdaptiveFetchWait(busy_ms=20, idle_ms=5, idle_after=1)
    assert wait.after_fetch(False) == 20
