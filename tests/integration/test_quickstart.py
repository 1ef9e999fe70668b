"""What a new user runs first, verbatim, against a running `up`: the README's quick start (the
agent loop in the Python client) and docs/client.md's worked example of every RPC, each as the
reader would paste it into a file beside the stack's data directory; and `context-engine mcp`
beside the stack, as an MCP client starts it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.fixtures.up import Up

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_blocks(doc: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def stack() -> Iterator[Up]:
    """`up` on the default data directory (./.context-engine) of a directory of its own, outside
    pytest's root as the embedded PostgreSQL needs (tests/fixtures/infra.py service_tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="context-engine-test-") as path:
        here = pathlib.Path(path)
        up = Up(here / ".context-engine", cwd=here)
        try:
            up.wait_serving()
            yield up
        finally:
            up.stop()


def run(stack: Up, code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=stack.home.parent, env=stack.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_up_keeps_its_data_directory_to_its_user(stack: Up) -> None:
    """Logs name every caller's org and subject; keys sign tokens (issue #41, item 5)."""
    assert stack.home.stat().st_mode & 0o066 == 0  # o+x at most: the embedded PostgreSQL's user passes
    private = [p for p in (stack.home / "keys").iterdir() if p.suffix != ".pub"]  # a public key may be read
    for path in [*(stack.home / "logs").iterdir(), *private, stack.home / "run" / "stack.json"]:
        assert path.stat().st_mode & 0o077 == 0, path
    assert (stack.home / "keys").stat().st_mode & 0o777 == 0o700


def test_the_readme_quick_start_runs_as_written(stack: Up) -> None:
    quick = re.search(r"## Quick start.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert quick, "the README has no quick start"
    printed = run(stack, quick[1])
    assert "Globex renewal is due on 12 January" in printed  # the user's turn is in the prompt it printed


def test_every_rpc_example_in_the_client_guide_runs_as_written(stack: Up) -> None:
    printed = run(stack, "\n".join(python_blocks(ROOT / "docs" / "client.md"))).splitlines()
    assert "True semantic Initech: 12% discount, delivery by March." in printed  # PullContext returns the push
    assert "True" in printed  # the rollback restored the snapshot's version
    assert any("We agreed on a 12% discount for Initech." in line for line in printed)  # in the assembled prompt
    assert any("Hello from asyncio." in line for line in printed)


async def test_context_engine_mcp_beside_the_stack_serves_the_tools(stack: Up) -> None:
    command = [sys.executable, "-m", "context_engine", "mcp", "--data-dir", str(stack.home),
               "--scope", "acme/sales/emea"]
    async with Client(StdioServerParameters(command=command[0], args=command[1:], env=stack.env),
                      read_timeout_seconds=120) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        said = await client.call_tool("remember", {"session_id": "mcp-cli", "text": "hello from MCP"})
        history = await client.call_tool("session_history", {"session_id": "mcp-cli"})
    assert tools == {"remember", "remember_memory", "search", "assemble_context", "session_history"}
    assert not said.is_error and "hello from MCP" in history.content[0].text


def test_the_client_distribution_alone_in_an_empty_venv_talks_to_the_stack(stack: Up, tmp_path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                f"{ROOT / 'clients' / 'python'}[dev-token]"], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr
    script = """
import importlib.util
from context_engine_client import Client
server_packages = [p for p in ("commands", "projections", "streams", "inference", "entrypoints", "upsquad",
                               "context_engine", "faust", "asyncpg", "onnxruntime") if importlib.util.find_spec(p)]
print("server packages:", server_packages)
with Client.from_data_dir(".context-engine", scope="acme/sales/venv") as engine:
    engine.ingest("venv-1", "installed alone, and it talks")
    print(engine.assemble_context("venv-1", "what did it say?", token_budget=300).assembled_prompt)
"""
    done = subprocess.run([str(python), "-c", script], cwd=stack.home.parent, capture_output=True, text=True,
                          timeout=300, env={"PATH": str(venv / "bin")})
    assert done.returncode == 0, done.stderr
    assert "server packages: []" in done.stdout and "installed alone, and it talks" in done.stdout
