"""`alongside`: work started beside a block is cancelled when the block leaves early, and its
result or failure reaches the block when awaited; `background_thread` runs below its caller's
priority."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from context_engine.concurrency import BackgroundProcess, alongside, background_thread


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


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_a_background_thread_runs_below_its_caller_and_threads_it_starts_inherit_that():
    def priorities() -> tuple[int, int]:
        seen = []
        child = threading.Thread(target=lambda: seen.append(_nice(threading.get_native_id())))
        child.start()
        child.join()
        return _nice(threading.get_native_id()), seen[0]

    caller = _nice(threading.get_native_id())
    with background_thread("test-background", 5) as pool:
        own, started = pool.submit(priorities).result()
    assert own == min(19, caller + 5)
    assert started == own
    assert _nice(threading.get_native_id()) == caller  # the caller's own priority is untouched


def test_niceness_zero_leaves_the_priority_alone():
    caller = _nice(threading.get_native_id())
    with background_thread("test-background", 0) as pool:
        assert pool.submit(lambda: _nice(threading.get_native_id())).result() == caller


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
def test_an_idle_background_thread_and_the_threads_it_starts_are_in_sched_idle():
    def policies() -> tuple[int, int]:
        seen = []
        child = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        child.start()
        child.join()
        return os.sched_getscheduler(0), seen[0]

    with background_thread("test-idle", 0, idle=True) as pool:
        assert pool.submit(policies).result() == (os.SCHED_IDLE, os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own class is untouched


def _process_state() -> tuple[int, int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)


async def test_a_background_process_runs_apart_below_its_caller():
    builder = BackgroundProcess(5)
    try:
        pid, nice, _ = await builder.run(_process_state)
    finally:
        builder.shutdown()
    assert pid != os.getpid()
    assert nice == min(19, _nice(threading.get_native_id()) + 5)


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="Linux's process names")
async def test_a_background_process_goes_by_its_name():
    builder = BackgroundProcess(0, name="ce-test-builder-long")
    try:
        pid = await builder.run(os.getpid)
        with open(f"/proc/{pid}/comm") as comm:
            assert comm.read().strip() == "ce-test-builder"  # Linux keeps 15 bytes
    finally:
        builder.shutdown()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
async def test_an_idle_background_process_is_in_sched_idle():
    builder = BackgroundProcess(0, idle=True)
    try:
        assert (await builder.run(_process_state))[2] == os.SCHED_IDLE
    finally:
        builder.shutdown()
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


async def test_a_killed_background_process_fails_one_call_and_is_replaced():
    builder = BackgroundProcess(0)
    try:
        first = (await builder.run(_process_state))[0]
        os.kill(first, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            await builder.run(_process_state)
        second = (await builder.run(_process_state))[0]
    finally:
        builder.shutdown()
    assert second not in (first, os.getpid())


_PARENT = """
import asyncio, os, sys, time
from context_engine.concurrency import BackgroundProcess

async def main():
    print((await BackgroundProcess(0).run(os.getpid)), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_background_process_exits_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 60  # a bound for a loaded machine, not a measurement
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
