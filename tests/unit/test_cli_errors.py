"""A command that fails prints one line, with a hint, not a traceback (issue #23, item 6)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
    base.update(CONTEXT_ENGINE_DATABASE_URL=f"postgresql://u:p@127.0.0.1:{closed}/db",
                CONTEXT_ENGINE_KAFKA_BOOTSTRAP=f"127.0.0.1:{closed}", **env)
    return subprocess.run([sys.executable, "-m", "context_engine", *args], capture_output=True, text=True,
                          timeout=60, env=base)


def test_a_command_whose_database_is_down_says_so_in_one_line_with_a_hint(tmp_path):
    ran = run("stats", "savings", "--data-dir", str(tmp_path))
    assert ran.returncode == 1
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 2, ran.stderr
    assert lines[0].startswith("error: ConnectionRefusedError: ") and "context-engine status" in lines[0]
    assert "CONTEXT_ENGINE_LOG_LEVEL=DEBUG" in lines[1]


def test_the_traceback_is_there_at_debug(tmp_path):
    ran = run("stats", "savings", "--data-dir", str(tmp_path), CONTEXT_ENGINE_LOG_LEVEL="DEBUG")
    assert ran.returncode == 1 and "Traceback (most recent call last)" in ran.stderr
