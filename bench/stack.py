"""A real stack for a bench: `Stack` runs `context-engine up` exactly as a user does (embedded
PostgreSQL + tansu + worker + API + detector as separate processes) on free ports, in a data
directory the caller chooses; a second Stack on the same directory keeps the data (the broker is
restored from the archive). Also: its processes and their CPU time, and waiting for it to be idle
or for the embedding pipeline to catch up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from server_metrics import ServerMetrics
from tqdm import tqdm

from context_engine.auth import ensure_dev_key, mint_token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int) -> int:
    """A port p with p .. p + n - 1 all free."""
    for _ in range(100):
        first = free_port()
        try:
            with contextlib.ExitStack() as held:
                for port in range(first + 1, first + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


class Stack:
    """`context-engine up --data-dir home` on free ports; `stop()` sends SIGTERM and waits.
    `api_processes` API processes share the gRPC port; process i serves /metrics on
    metrics_port + i (`ServerMetrics` reads them all)."""

    def __init__(self, home: pathlib.Path, *, api_processes: int = 1,
                 settings: dict[str, str] | None = None) -> None:
        self.home = home
        self.api_port, self.detector_port = free_port(), free_port()
        self.metrics_port = free_port_run(api_processes)
        self.api_processes = api_processes
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
        env["CONTEXT_ENGINE_LOG_LEVEL"] = "WARNING"
        env.update(settings or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "context_engine", "up", "--data-dir", str(home),
             "--api-port", str(self.api_port), "--detector-port", str(self.detector_port),
             "--api-processes", str(api_processes), "--metrics-port", str(self.metrics_port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.output: collections.deque[str] = collections.deque(maxlen=50)  # last lines of `up`
        self.postgres_pid: int | None = None

    def metrics(self) -> "ServerMetrics":
        return ServerMetrics([self.metrics_port + i for i in range(self.api_processes)])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    def wait_serving(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            if match := re.search(r"PostgreSQL \(embedded, pid (\d+)\)", line):
                self.postgres_pid = int(match[1])
            if "SERVING after" in line:
                # Keep reading what `up` prints so a full pipe can never block it.
                threading.Thread(target=self._drain, daemon=True).start()
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError("stack did not start:\n" + "\n".join(self.output))

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def endpoints(self) -> dict[str, str]:
        return json.loads((self.home / "run" / "stack.json").read_text())

    def token(self, org: str, *, pillar: str = "", team: str = "", agent: str = "", clearance: int = 1,
              ttl: dt.timedelta = dt.timedelta(hours=6)) -> str:
        key = ensure_dev_key(self.home / "keys" / "jwt-hs256.key")
        return mint_token(key, org=org, pillar=pillar, team=team, agent=agent, clearance=clearance, ttl=ttl)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def stack_pids(stack: Stack) -> list[int]:
    """`up` and everything under it, plus the embedded PostgreSQL server and its backends (pg_ctl
    detaches the postmaster, so it is not under `up`)."""
    roots = [stack.proc.pid] + ([stack.postgres_pid] if stack.postgres_pid else [])
    tree, seen, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo.extend(tree.get(pid, []))
    return seen


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def stack_cpu_seconds(stack: Stack) -> float:
    """User + system CPU seconds used so far by the whole stack (`stack_pids`), from /proc; the
    difference across a phase divided by its calls is the stack-wide CPU per call. A backend that
    exits inside the phase takes its seconds with it, so this is a lower bound."""
    return _cpu_seconds(stack_pids(stack))


def wait_quiet(stack: Stack, *, below: float = 0.5, window: float = 5.0, timeout: float = 900.0) -> float:
    """Wait until the whole stack uses less than `below` of one core over `window` seconds (after a
    restart the API restores the log from the archive and the worker re-projects it; after a load
    the embedding pipeline and autovacuum run on). An idle stack is not at 0: the worker and tansu
    poll each other every few ms (measured ~0.2-0.25 of a core together). Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        pids = stack_pids(stack)
        before = _cpu_seconds(pids)
        time.sleep(window)
        if (_cpu_seconds(pids) - before) / window < below:
            return time.monotonic() - started
    raise TimeoutError(f"the stack was still busy after {timeout:.0f} s")


async def wait_embedded(database_url: str, orgs: list[str], expected_chunks: int | None = None, *,
                        progress: Callable[[int, int], None] | None = None, poll: float = 1.0,
                        timeout: float = 6 * 3600) -> tuple[int, int]:
    """Poll PostgreSQL (admin URL) until every searchable chunk of these orgs has a vector (and,
    when given, at least `expected_chunks` chunks exist; a summary line's chunk is never
    embedded). `progress(embedded, total)` after each poll. Returns (chunks, embedded)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            row = await conn.fetchrow(
                "SELECT count(*) AS total, count(*) FILTER (WHERE embedding IS NOT NULL) AS embedded "
                "FROM chunks WHERE org_id = ANY($1::text[]) AND searchable", orgs)
            total, embedded = row["total"], row["embedded"]
            if progress is not None:
                progress(embedded, total)
            if embedded == total and (expected_chunks is None or total >= expected_chunks):
                return total, embedded
            if time.monotonic() > deadline:
                raise TimeoutError(f"{embedded} of {total} chunks embedded after {timeout:.0f} s")
            await asyncio.sleep(poll)
    finally:
        await conn.close()


def wait_for_vectors(database_url: str, orgs: list[str], expected_chunks: int | None, *, poll: float = 1.0,
                     **bar_options) -> tuple[int, float]:
    """`wait_embedded` with a progress bar: (chunks, seconds waited)."""
    bar = tqdm(desc="embedded", unit="chunk", file=sys.stderr, **bar_options)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    started = time.perf_counter()
    try:
        chunks, _ = asyncio.run(wait_embedded(database_url, orgs, expected_chunks, progress=progress, poll=poll))
    finally:
        bar.close()
    return chunks, time.perf_counter() - started
