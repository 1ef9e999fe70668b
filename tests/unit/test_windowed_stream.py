"""WindowedStream: a batch closes `within` after its first event or when full, an idle stream does
not wake, and events are acknowledged only after their batch was consumed. Runs a real Faust app
and agent over an in-memory channel (Faust's agent test context); no broker is involved."""

import asyncio

import faust
import pytest

from streams.windowed_stream import WindowedStream


def make_app() -> faust.App:
    return faust.App("windowed-test", broker="kafka://127.0.0.1:9", store="memory://", autodiscover=False,
                     web_enabled=False, Stream=WindowedStream)


class Recorder:
    """An agent body that records each batch, when it came and what its events' acks were."""

    def __init__(self, app: faust.App, max_: int, within: float, events: bool = False,
                 consume_s: float = 0.0) -> None:
        self.batches: list[list] = []
        self.times: list[float] = []
        self.acked_while_consumed: list[list[bool]] = []
        self.event_batches: list[list] = []
        self.waits = 0

        async def body(stream):
            counted = stream.wait_for_stopped

            async def counting(*args, **kwargs):
                self.waits += 1
                return await counted(*args, **kwargs)

            stream.wait_for_stopped = counting
            take = stream.take_events if events else stream.take
            async for batch in take(max_, within=within):
                self.times.append(asyncio.get_running_loop().time())
                if events:
                    self.acked_while_consumed.append([e.message.acked for e in batch])
                    self.event_batches.append(list(batch))
                    self.batches.append([e.value for e in batch])
                else:
                    self.batches.append(list(batch))
                await asyncio.sleep(consume_s)

        self.agent = app.agent(app.channel(), name=f"recorder-{id(self)}")(body)


async def until(condition, timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (what the agent does in its own time), failing after
    `timeout`: no verdict here depends on how fast a busy machine schedules the agent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the agent did not get there"
        await asyncio.sleep(0.005)


async def test_a_burst_is_one_batch_closed_a_window_after_its_first_event():
    app = make_app()
    rec = Recorder(app, max_=100, within=0.5)  # a window far longer than five puts take, however busy
    async with rec.agent.test_context() as agent:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.06)  # idle: nothing may be yielded
        assert rec.batches == []
        start = loop.time()
        for i in range(5):
            await agent.put(i)
        await until(lambda: rec.batches)
    assert rec.batches == [[0, 1, 2, 3, 4]]
    assert rec.times[0] - start >= 0.45  # not before its window (less the puts' own time)


async def test_a_full_batch_is_handed_on_at_once():
    app = make_app()
    rec = Recorder(app, max_=3, within=60.0)
    async with rec.agent.test_context() as agent:
        for i in range(7):
            await agent.put(i)
        await until(lambda: len(rec.batches) >= 2)  # long before the window: full batches go at once
        assert rec.batches == [[0, 1, 2], [3, 4, 5]]  # the seventh waits for its window


async def test_a_slow_consumer_never_gets_more_than_max_events_at_once():
    app = make_app()
    rec = Recorder(app, max_=3, within=0.01, consume_s=0.5)
    async with rec.agent.test_context() as agent:
        await agent.put(0)
        await until(lambda: rec.batches)  # [0] is being consumed while the next five arrive
        for i in range(1, 6):
            await agent.put(i)
        await until(lambda: len(rec.batches) >= 3)
    assert rec.batches == [[0], [1, 2, 3], [4, 5]]


async def test_an_idle_stream_does_not_wake_for_its_window():
    app = make_app()
    rec = Recorder(app, max_=500, within=0.002)
    async with rec.agent.test_context() as agent:
        await asyncio.sleep(0.3)  # Faust's own take would look at its buffer ~150 times
        assert rec.waits <= 1
        await agent.put("x")
        await asyncio.sleep(0.05)
        assert rec.batches == [["x"]]
        assert rec.waits <= 3


async def test_events_are_acknowledged_after_their_batch_was_consumed():
    app = make_app()
    rec = Recorder(app, max_=4, within=60.0, events=True)  # batches close full, never by their window
    async with rec.agent.test_context() as agent:
        for i in range(4):
            await agent.put(i)
        await until(lambda: rec.batches)
        for i in range(4):  # the consumer's loop returns to the stream: the first batch is acked
            await agent.put(f"next {i}")
        await until(lambda: len(rec.batches) >= 2)
    assert rec.batches == [[0, 1, 2, 3], [f"next {i}" for i in range(4)]]
    assert rec.acked_while_consumed[0] == [False] * 4
    assert [e.message.acked for e in rec.event_batches[0]] == [True] * 4


def test_a_window_must_be_positive():
    app = make_app()
    stream = app.stream(app.channel())

    async def first():
        async for _ in stream.take(10, within=0):
            pass

    with pytest.raises(ValueError, match="within"):
        asyncio.run(first())
