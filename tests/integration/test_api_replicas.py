"""Read-your-writes across API replicas (issue #25): two API processes on different ports (no
SO_REUSEPORT), the in-process one of the test deployment and a `context-engine serve api`
process. A write is acknowledged only once the worker has projected it into PostgreSQL, which
every replica reads, so a read on the other replica right after the acknowledgement sees it
with no position passed (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from entrypoints.embedded.process import child_preexec, free_port
from tests.fixtures.engine import Caller, unique
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

ROUNDS = 10


async def test_a_write_on_one_replica_is_read_on_the_other_at_once(engine, tmp_path):
    port = free_port()
    env = {**engine.worker.env, "CONTEXT_ENGINE_API_PORT": str(port), "CONTEXT_ENGINE_METRICS_PORT": "-1"}
    with open(tmp_path / "api-b.log", "wb") as log:
        replica = subprocess.Popen([sys.executable, "-m", "context_engine", "serve", "api"], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, preexec_fn=child_preexec())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await channel.channel_ready()
            org = unique("replicas")
            a = engine.caller(org, "p", "t", "bot", clearance=1)
            b = Caller(context_pb2_grpc.ContextEngineStub(channel), a.token, a.scope)
            for i in range(ROUNDS):
                writer, reader = (a, b) if i % 2 == 0 else (b, a)
                await writer("IngestEvent", pb.IngestEventRequest(
                    session_id="s", event_type="message", content=f"user: round {i} marker-{i}".encode()))
                await writer("PushContext", pb.PushContextRequest(
                    session_id="s", memory_type="working", content=f"working note {i}".encode()))
                # at once, on the other replica: the turn is in the session's history, the memory pulled
                reply = await reader("AssembleContext", pb.AssembleContextRequest(
                    session_id="s", token_budget=4000, model_id="gpt-4o"))
                assert f"marker-{i}" in reply.assembled_prompt, (i, reply.assembled_prompt[-300:])
                pulled = await reader("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s"))
                assert pulled.content == f"working note {i}".encode(), i
    finally:
        replica.terminate()
        replica.wait(timeout=30)
    assert replica.returncode in (0, -15), (tmp_path / "api-b.log").read_text()[-2000:]
