"""`alongside`: work started beside a block is cancelled when the block leaves early, and its
result or failure reaches the block when awaited."""

import asyncio

import pytest

from context_engine.concurrency import alongside


async def test_the_block_gets_the_result_when_it_awaits():
    async def work():
        await asyncio.sleep(0)
        return 42

    async with alongside(work()) as task:
        assert await task == 42


async def test_unfinished_work_is_cancelled_when_the_block_fails_first():
    started = asyncio.Event()

    async def slow():
        started.set()
        await asyncio.sleep(60)

    with pytest.raises(RuntimeError, match="block failed"):
        async with alongside(slow()) as task:
            await started.wait()
            raise RuntimeError("block failed")
    await asyncio.sleep(0)
    assert task.cancelled()


async def test_a_failure_of_finished_work_is_seen_even_if_the_block_never_awaited_it():
    async def failing():
        raise ValueError("work failed")

    with pytest.raises(RuntimeError):
        async with alongside(failing()) as task:
            await asyncio.sleep(0)
            raise RuntimeError("block failed")
    assert task.done() and isinstance(task.exception(), ValueError)
    assert task._log_traceback is False  # asyncio will not report it as never retrieved
