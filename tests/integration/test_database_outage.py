"""PostgreSQL going away under a running API (issue #18 item 5): every call answers UNAVAILABLE
(reason DATABASE_UNAVAILABLE, or another UNAVAILABLE reason of the engine's own) and never
INTERNAL: during a fast shutdown with calls in flight, once the server is down, and after a
SIGKILL; and the API serves again once PostgreSQL is back.

The PostgreSQL here is the test's own (bundled binaries): stopping the session's shared one
would take it away from every other test. The broker is the session's (own topics)."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import pathlib
import time

import grpc
import pytest

from entrypoints.embedded.postgres import EmbeddedPostgres
from entrypoints.serving.status import error_info
from tests.fixtures.engine import running_engine, unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

TEST_BUDGET_S = 240  # a hang fails with the stack of the await it hung in
FAST_PG = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def every_rpc(caller, version: str, event_id: str):
    """One call of each implemented RPC that reads or writes PostgreSQL, as (name, coroutine) makers."""
    return {
        "IngestEvent": lambda: caller("IngestEvent", pb.IngestEventRequest(
            session_id="s", event_type="message", content=b"during the outage")),
        "PushContext": lambda: caller("PushContext", pb.PushContextRequest(
            session_id="s", memory_type="semantic", content=b"{}")),
        "PullContext": lambda: caller("PullContext", pb.PullContextRequest(agent_id="bot")),
        "PullContext session": lambda: caller("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s")),
        "CreateSnapshot": lambda: caller("CreateSnapshot", pb.CreateSnapshotRequest(
            session_id="s", snapshot_name="v9")),
        "RollbackContext": lambda: caller("RollbackContext", pb.RollbackContextRequest(
            session_id="s", target_version_hash=version)),
        "AssembleContext": lambda: caller("AssembleContext", pb.AssembleContextRequest(
            session_id="s", task_description="what happened", token_budget=500,
            hints={"must_include": f"event:{event_id}"})),
        "Search": lambda: caller("Search", pb.SearchRequest(query="outage")),
        "Embed": lambda: caller("Embed", pb.EmbedRequest(texts=["outage"])),
        "ResolveGuardrailLayers": lambda: caller("ResolveGuardrailLayers", pb.ResolveGuardrailLayersRequest()),
        "ValidatePrompt": lambda: caller("ValidatePrompt", pb.ValidatePromptRequest(
            prompt="hello", layer_hashes=[hashlib.sha256(b"l1").hexdigest()])),
    }


async def answer(make) -> tuple[str, str, str]:
    """(status code name, ErrorInfo reason, details) of one call."""
    try:
        await make()
        return "OK", "", ""
    except grpc.aio.AioRpcError as err:
        info = error_info(err)
        return err.code().name, info.reason if info else "", err.details() or ""


WRITES = ("IngestEvent", "PushContext", "CreateSnapshot", "RollbackContext")


def assert_only_unavailable(answers: dict[str, tuple[str, str, str]]) -> None:
    wrong = {name: a for name, a in answers.items() if a[0] != "UNAVAILABLE"}
    assert not wrong, wrong
    for name, (_, reason, details) in answers.items():
        if name in WRITES:  # a write may also be refused by the log's own guard (e.g. NOT_DURABLE_YET)
            assert reason, (name, details)
        else:
            assert reason == "DATABASE_UNAVAILABLE", (name, reason, details)
        for leaked in ("asyncpg", "Errno", "Traceback", "127.0.0.1", "administrator command"):
            assert leaked not in details, (name, details)


async def until(condition, tasks: list[asyncio.Task]) -> None:
    """Wait for `condition`; a task that ended first (an assertion in a reader) fails the test."""
    while not condition():
        if ended := [t for t in tasks if t.done()]:
            await ended[0]  # raises what the task raised
            raise AssertionError("a reader stopped before it was told to")
        await asyncio.sleep(0.01)


@pytest.fixture
def own_postgres(service_tmp_path: pathlib.Path):
    server = EmbeddedPostgres(service_tmp_path / "pg" / "data", settings=FAST_PG)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_postgres_stopped_or_killed_under_the_api_is_unavailable_never_internal(
        own_postgres, kafka_bootstrap, service_tmp_path):
    home = service_tmp_path / "home"
    home.mkdir()
    async with asyncio.timeout(TEST_BUDGET_S), \
            running_engine(own_postgres.dsn, kafka_bootstrap, home,
                           extra_env={"CONTEXT_ENGINE_RPC_TIMEOUT_SECONDS": "60"}) as engine:
        org = unique("org")
        caller = engine.caller(org, "p", "t", "bot", clearance=4)
        ingested = await caller("IngestEvent", pb.IngestEventRequest(session_id="s", event_type="message",
                                                                     content=b"before the outage"))
        await caller("PushContext", pb.PushContextRequest(session_id="s", memory_type="semantic", content=b"{}"))
        rpcs = every_rpc(caller, ingested.version_hash, ingested.event_id)
        healthy = {name: await answer(make) for name, make in rpcs.items()}
        assert "INTERNAL" not in {a[0] for a in healthy.values()}, healthy

        # 1. A fast shutdown with reads in flight: each answers, and only OK or UNAVAILABLE.
        during: collections.Counter = collections.Counter()
        stop = asyncio.Event()

        async def reader(make) -> None:
            while not stop.is_set():
                code, reason, details = await answer(make)
                assert code in ("OK", "UNAVAILABLE"), (code, reason, details)
                during[(code, reason)] += 1

        readers = [asyncio.create_task(reader(rpcs[n])) for n in ("PullContext", "Search", "ValidatePrompt",
                                                                  "ResolveGuardrailLayers") for _ in range(2)]
        await until(lambda: sum(during.values()) >= 16, readers)  # under way before the shutdown
        await asyncio.to_thread(own_postgres.stop)  # SIGINT: backends get 57P01, new connects 57P03/refused
        await until(lambda: any(code == "UNAVAILABLE" for code, _ in during), readers)
        stop.set()
        await asyncio.gather(*readers)
        assert ("UNAVAILABLE", "DATABASE_UNAVAILABLE") in during, during

        # 2. Down: every RPC, each once.
        assert_only_unavailable({name: await answer(make) for name, make in rpcs.items()})

        # 3. Back: the API serves again without a restart of its own.
        await asyncio.to_thread(own_postgres.start)
        deadline = time.monotonic() + 60
        while (back := await answer(rpcs["PullContext"]))[0] != "OK":
            assert back[0] == "UNAVAILABLE", back
            assert time.monotonic() < deadline, f"the API never served again: {back}"
            await asyncio.sleep(0.1)

        # 4. SIGKILL: connections die without a goodbye.
        await asyncio.to_thread(own_postgres.kill)
        assert_only_unavailable({name: await answer(make) for name, make in rpcs.items()})
