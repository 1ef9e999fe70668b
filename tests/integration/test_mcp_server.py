"""The MCP server (`context-engine-mcp`, clients/python) as an MCP client sees it, with the `mcp`
package's own client: its tools listed and called over stdio and over streamable HTTP against a
real deployment, each server acting in the scope of its token, so a tool call for another team's
session answers as the API would."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from context_engine.auth import mint_token
from entrypoints.embedded.process import free_port
from tests.fixtures.calls import wait_embedded
from tests.fixtures.engine import Engine, unique

TOOLS = {"remember", "remember_memory", "search", "assemble_context", "session_history"}


def server_command(engine: Engine, scope: str, *extra: str) -> tuple[list[str], dict[str, str]]:
    org, pillar, team = (scope.split("/") + ["", ""])[:3]
    env = {**os.environ, "CE_TOKEN": mint_token(engine.key, org=org, pillar=pillar, team=team, clearance=3)}
    return ([sys.executable, "-m", "context_engine_client.mcp_server", "--address", engine.address,
             "--scope", scope, "--token-env", "CE_TOKEN", *extra], env)


def stdio(engine: Engine, scope: str) -> Client:
    command, env = server_command(engine, scope)
    return Client(StdioServerParameters(command=command[0], args=command[1:], env=env), read_timeout_seconds=120)


@pytest.fixture
async def http_server(engine: Engine, tmp_path) -> AsyncIterator[tuple[str, str]]:
    """A streamable-HTTP server for one org's sales/emea team: its URL and the org."""
    org, port = unique("mcp-http"), free_port()
    command, env = server_command(engine, f"{org}/sales/emea", "--transport", "http", "--port", str(port))
    log = tmp_path / "mcp-http.log"
    with log.open("wb") as stderr:  # the child keeps its own descriptor
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 120
    while True:  # listening once a connection is accepted (a bound hang, not a verdict)
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert time.monotonic() < deadline, "the MCP server never listened"
            await asyncio.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}/mcp", org
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def exercise(client: Client, engine: Engine, org: str) -> None:
    """The agent loop through the tools: remember turns, find them, assemble, keep a memory."""
    assert {t.name for t in (await client.list_tools()).tools} >= TOOLS
    said = await client.call_tool("remember", {"session_id": "deal-42", "text": "the Globex renewal is due on "
                                                                                 "12 January", "role": "user"})
    assert not said.is_error and said.structured_content["event_id"]
    await client.call_tool("remember", {"session_id": "deal-42", "text": "Noted.", "role": "assistant"})
    await wait_embedded(engine, org)
    found = await client.call_tool("search", {"query": "When is the Globex renewal due?"})
    assert not found.is_error
    top = found.structured_content["results"][0]
    assert "12 January" in top["content"] and "engine.score.vector" in top["why"]
    prompt = await client.call_tool("assemble_context", {"session_id": "deal-42", "task": "the renewal date",
                                                         "token_budget": 500})
    assert "12 January" in prompt.content[0].text
    history = await client.call_tool("session_history", {"session_id": "deal-42"})
    assert "assistant: Noted." in history.content[0].text
    kept = await client.call_tool("remember_memory", {"session_id": "deal-42", "text": "Globex renews on 12 January."})
    assert not kept.is_error and kept.structured_content["version_hash"]


async def test_the_tools_over_stdio(engine: Engine) -> None:
    org = unique("mcp-stdio")
    async with stdio(engine, f"{org}/sales/emea") as client:
        await exercise(client, engine, org)


async def test_the_tools_over_streamable_http(engine: Engine, http_server) -> None:
    url, org = http_server
    async with Client(url, read_timeout_seconds=120) as client:
        await exercise(client, engine, org)


async def test_a_tool_call_into_another_teams_session_answers_as_the_api_would(engine: Engine) -> None:
    org = unique("mcp-scope")
    async with stdio(engine, f"{org}/sales/emea") as emea:
        await emea.call_tool("remember", {"session_id": "emea-deal", "text": "emea only"})
    async with stdio(engine, f"{org}/sales/apac") as apac:
        written = await apac.call_tool("remember", {"session_id": "emea-deal", "text": "apac was here"})
        read = await apac.call_tool("session_history", {"session_id": "emea-deal"})
    assert written.is_error and "PERMISSION_DENIED (SESSION_OUT_OF_SCOPE)" in written.content[0].text
    assert read.is_error and "NOT_FOUND" in read.content[0].text  # a sibling's session does not exist for it


def test_the_http_endpoint_listens_on_loopback_only() -> None:
    from context_engine_client.mcp_server import main

    with pytest.raises(SystemExit, match="not a loopback address"):
        main(["--scope", "acme", "--transport", "http", "--host", "0.0.0.0"])
