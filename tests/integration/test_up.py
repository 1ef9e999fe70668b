"""`context-engine up` as a user runs it: start → SERVING → calls → SIGTERM → nothing left behind."""

import asyncio
import concurrent.futures
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def command_line(pid: int) -> list[str]:
    """A process's arguments, or none if it has exited since it was listed (postgres workers come and go)."""
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def free_port_pair() -> int:
    """A port p with p + 1 free too (process i of the API serves metrics on p + i)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def rpc_count(text: str, method: str, code: str) -> float:
    """The value of context_engine_rpc_seconds_count{code=..., method=...} (labels in any order)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("context_engine_rpc_seconds_count{") and f'method="{method}"' in line \
                and f'code="{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Up:
    def __init__(self, home: pathlib.Path, *options: str) -> None:
        self.home = home
        self.api_port, self.detector_port = free_port(), free_port()
        self.lines: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
        if "--metrics-port" not in options:
            options = (*options, "--metrics-port", "0")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "context_engine.cli", "up", "--data-dir", str(home),
             "--api-port", str(self.api_port), "--detector-port", str(self.detector_port), *options],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def wait_serving(self) -> float:
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any("SERVING after" in line for line in self.lines):
                return time.monotonic() - started
            assert self.proc.poll() is None, "up exited early:\n" + "".join(self.lines)
            time.sleep(0.1)
        raise AssertionError("up never reached SERVING:\n" + "".join(self.lines))

    def database_url(self) -> str:
        for line in self.lines:
            if match := re.search(r"PostgreSQL \(embedded, pid \d+\) at (\S+)", line):
                return match[1]
        raise AssertionError("no database line:\n" + "".join(self.lines))

    def finish(self, timeout: float = 30) -> str:
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return "".join(self.lines)


def health(port: int, service: str = "") -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2).status


def reflected_services(port: int) -> set[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=2)
        return {s.name for reply in replies for s in reply.list_services_response.service}


def mint(home: pathlib.Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "context_engine.cli", "token", "mint", "--data-dir", str(home),
                          *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def search(port: int, metadata=None, org="acme") -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            context_pb2_grpc.ContextEngineStub(channel).Search(
                pb.SearchRequest(scope=pb.ScopePath(org_id=org), query="q"), metadata=metadata, timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def ingest_at_once(port: int, token: str, n: int) -> list[grpc.StatusCode]:
    """`n` IngestEvents in one session, all in flight together; their status codes."""
    def one(i: int) -> grpc.StatusCode:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                context_pb2_grpc.ContextEngineStub(channel).IngestEvent(
                    pb.IngestEventRequest(scope=pb.ScopePath(org_id="acme"), session_id="first-writes",
                                          event_type="message", content=f"turn {i}".encode()),
                    metadata=(("authorization", f"Bearer {token}"),), timeout=30)
            except grpc.RpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


async def run_sql(url: str, sql: str):
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_up_serves_stops_cleanly_and_keeps_its_data(service_tmp_path):
    home = service_tmp_path / "home"

    # First run, with two API processes on one port: everything comes up, answers, says where its
    # time went on /metrics, and SIGTERM leaves no process behind.
    metrics_port = free_port_pair()
    up = Up(home, "--api-processes", "2", "--metrics-port", str(metrics_port))
    try:
        up.wait_serving()
        assert health(up.api_port) == health_pb2.HealthCheckResponse.SERVING
        assert health(up.detector_port) == health_pb2.HealthCheckResponse.SERVING
        assert health(up.api_port, "upsquad.context.v1.ContextEngine") == health_pb2.HealthCheckResponse.SERVING
        assert health(up.detector_port, "upsquad.ml.v1.MLDetectorService") == health_pb2.HealthCheckResponse.SERVING
        assert "upsquad.context.v1.ContextEngine" in reflected_services(up.api_port)
        assert "upsquad.ml.v1.MLDetectorService" in reflected_services(up.detector_port)

        # SERVING means the worker projects: writes sent at once are all acknowledged, none is
        # told to retry while the worker is still joining its consumer group.
        assert (home / "run" / "worker.ready").exists()
        writer = mint(home, "--org", "acme", "--clearance", "1")
        assert ingest_at_once(up.api_port, writer, 6) == [grpc.StatusCode.OK] * 6

        assert search(up.api_port) == grpc.StatusCode.UNAUTHENTICATED
        other_org = mint(home, "--org", "globex", "--clearance", "4")
        assert search(up.api_port, (("authorization", f"Bearer {other_org}"),)) == grpc.StatusCode.PERMISSION_DENIED
        own = mint(home, "--org", "acme", "--clearance", "1")
        assert search(up.api_port, (("authorization", f"Bearer {own}"),)) == grpc.StatusCode.OK
        search_method = "/upsquad.context.v1.ContextEngine/Search"
        scraped = [metrics_text(metrics_port), metrics_text(metrics_port + 1)]  # one per API process
        assert sum(rpc_count(t, search_method, "OK") for t in scraped) == 1
        assert sum(rpc_count(t, search_method, "UNAUTHENTICATED") for t in scraped) == 1
        assert sum(rpc_count(t, search_method, "PERMISSION_DENIED") for t in scraped) == 1
        assert any('context_engine_stage_seconds_count{operation="search",stage="query_embedding"} 1.0' in t
                   for t in scraped), scraped

        asyncio.run(run_sql(up.database_url(), "CREATE TABLE kept_across_runs (x int)"))
        key = (home / "keys" / "jwt-hs256.key").read_text()
        tree = descendants(up.proc.pid)
        assert len(tree) >= 6, tree  # postgres, broker, worker, 2 x api, detector (+ postgres workers)
    finally:
        up.proc.send_signal(signal.SIGTERM)
    output = up.finish()
    assert up.proc.returncode == 0, output
    assert "stopped" in output
    assert not [pid for pid in tree if alive(pid)], output

    # Second run on the same directory: same key, same database; a child that dies takes the
    # stack down and still leaves nothing behind.
    up = Up(home)
    try:
        up.wait_serving()
        assert (home / "keys" / "jwt-hs256.key").read_text() == key
        assert asyncio.run(run_sql(up.database_url(), "SELECT to_regclass('kept_across_runs')::text")) \
            == "kept_across_runs"
        tree = descendants(up.proc.pid)
        api_pid = next(pid for pid in tree if {"serve", "api"} <= set(command_line(pid)))
        os.kill(api_pid, signal.SIGKILL)
        output = up.finish(timeout=30)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
    assert up.proc.returncode == 1, output
    assert "api exited" in output
    assert not [pid for pid in tree if alive(pid)], output
