"""Batches whose window opens at their first event.

Faust's `take` and `take_events` wake every `within` seconds to look at their buffer, whether or not
anything arrived: the session projector's 2 ms window alone woke the worker's event loop ~500 times
a second on an idle stack, and with the job agents' 20 ms windows that cost ~0.1 of a core doing
nothing (docs/operations.md, "An idle stack"). Here an empty stream sleeps until an event arrives;
a batch then closes when it holds `max_` events or `within` seconds after its first event,
whichever comes first. So no event waits longer than `within` to be handed on (with Faust's, an
event waits up to `within` too, from wherever the timer happens to be).

Events are acknowledged once the code consuming their batch has finished with it, as with Faust's.
While a full batch waits to be consumed, further events wait in the stream, so at most one batch
is buffered beside the one being processed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import faust
from faust.types import ChannelT, EventT
from mode.utils.times import Seconds, want_seconds


class WindowedStream(faust.Stream):
    """A `faust.Stream` whose `take` and `take_events` batch as the module says."""

    async def take(self, max_: int, within: Seconds) -> AsyncIterator[Sequence[Any]]:  # type: ignore[override]
        async for batch in self._batches(max_, within):
            yield [value for value, _event in batch]

    async def take_events(self, max_: int, within: Seconds) -> AsyncIterator[Sequence[EventT]]:  # type: ignore[override]
        async for batch in self._batches(max_, within):
            yield [event for _value, event in batch]

    async def _batches(self, max_: int, within: Seconds) -> AsyncIterator[list[tuple[Any, EventT]]]:
        window = want_seconds(within)
        if max_ < 1 or not window > 0:
            raise ValueError("a batch needs max_ >= 1 and a window within > 0")
        loop = asyncio.get_running_loop()
        pending: list[tuple[Any, EventT]] = []
        first_at = 0.0  # loop time of the pending batch's first event
        arrived = asyncio.Event()  # the pending batch has an event
        full = asyncio.Event()  # the pending batch has max_ events
        room = asyncio.Event()  # cleared while a full batch waits to be taken
        room.set()

        async def collect(value: Any) -> Any:
            nonlocal first_at
            await room.wait()
            event = self.current_event
            if event is None:
                raise RuntimeError("a batched stream received a value without its event")
            if not pending:
                first_at = loop.time()
                arrived.set()
            pending.append((value, event))
            if len(pending) >= max_:
                full.set()
                room.clear()
            return value

        acks_were_enabled = self.enable_acks
        self.enable_acks = False  # acked below, once the batch has been consumed
        self.add_processor(collect)
        self._enable_passive(cast(ChannelT, aiter(self.channel)))  # drains the channel through `collect`
        try:
            while not self.should_stop:
                await self.wait_for_stopped(arrived)  # type: ignore[arg-type]  # mode waits on any Event; its hint names its own
                remaining = first_at + window - loop.time()
                if not full.is_set() and remaining > 0:
                    await self.wait_for_stopped(full, timeout=remaining)  # type: ignore[arg-type]  # as above
                if not pending:
                    continue  # woken by the stream stopping
                batch = pending[:]
                pending.clear()
                arrived.clear()
                full.clear()
                try:
                    yield batch
                finally:
                    for _value, event in batch:
                        await self.ack(event)
                    if len(pending) < max_:  # the next batch may have filled meanwhile
                        room.set()
        finally:
            self.enable_acks = acks_were_enabled
            self._processors.remove(collect)
