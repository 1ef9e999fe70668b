"""An MCP server over the client: the agent-facing calls as tools, so Claude Code, Cursor or any
MCP client remembers, searches and assembles through Context Engine. Every call carries the
configured token and acts in its scope; a call the engine refuses is a tool error that says
what the API said (status, reason code, message).

    context-engine-mcp --data-dir .context-engine --scope acme/sales/emea          # stdio, development
    context-engine-mcp --address api:50051 --scope acme/sales/emea --token-env CE_TOKEN \\
                       --transport http --port 8765                                 # streamable HTTP at /mcp

The HTTP endpoint has no authentication of its own: whoever reaches it acts with the configured
token. It listens on loopback only; put an authenticating proxy in front to serve other hosts.

Needs the `mcp` extra (`pip install 'context-engine-client[mcp]'`); `context-engine mcp` runs it
beside a stack.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from context_engine_client.aio import AsyncClient
from context_engine_client.errors import EngineError

INSTRUCTIONS = (
    "Context Engine keeps this agent's conversations and memories. Call `remember` with each turn "
    "of the conversation (user and assistant), `assemble_context` before answering to get the prompt "
    "context for the task, `search` to look something up, `remember_memory` for a fact worth keeping "
    "beyond the conversation, and `session_history` for the latest turns of a session.")


Positive = Annotated[int, Field(ge=1)]
Key = Annotated[str | None, Field(description="the same key on a retry writes once (1-128 printable ASCII)")]
READ_ONLY = ToolAnnotations(read_only_hint=True)


def build_server(client: AsyncClient) -> MCPServer:
    """The MCP server whose tools call `client` (one scope, one token)."""
    server = MCPServer("context-engine", instructions=INSTRUCTIONS)

    async def engine(call: Any) -> Any:
        try:
            return await call
        except EngineError as err:
            reason = f" ({err.reason})" if err.reason else ""
            raise ToolError(f"{err.code.name}{reason}: {err.message}") from None

    @server.tool()
    async def remember(session_id: str, text: str, role: Literal["user", "assistant", "tool"] = "user",
                       idempotency_key: Key = None) -> dict[str, Any]:
        """Store one turn of a conversation in session `session_id`."""
        reply = await engine(client.ingest(session_id, text, metadata={"role": role},
                                           idempotency_key=idempotency_key))
        return {"event_id": reply.event_id, "version_hash": reply.version_hash, "token_count": reply.token_count}

    @server.tool()
    async def remember_memory(session_id: str, text: str,
                              memory_type: Literal["semantic", "episodic", "working"] = "semantic",
                              idempotency_key: Key = None) -> dict[str, Any]:
        """Store a memory of session `session_id` beyond its turns: `semantic` (a fact), `episodic` (what
        happened) or `working` (the latest replaces the one before)."""
        reply = await engine(client.push_context(session_id, text, memory_type=memory_type,
                                                 idempotency_key=idempotency_key))
        return {"version_hash": reply.version_hash, "created_at": reply.created_at.ToJsonString()}

    @server.tool(annotations=READ_ONLY)
    async def search(query: str, top_k: Positive = 5) -> dict[str, Any]:
        """Search everything this scope may read; each result says why it was returned (its scores)."""
        reply = await engine(client.search(query, top_k=top_k))
        results = [{"content": r.content, "score": round(r.score, 4), "chunk_id": r.chunk_id, "source": r.source,
                    "why": {k: v for k, v in r.metadata.items() if k.startswith("engine.score")}}
                   for r in reply.results]
        out: dict[str, Any] = {"results": results, "effective_min_score": reply.effective_min_score}
        if reply.quarantined_matches:
            out["held_back"] = f"{reply.quarantined_matches} matching items held back: {reply.quarantine_reason}"
        return out

    @server.tool(annotations=READ_ONLY)
    async def assemble_context(session_id: str, task: str, token_budget: Positive = 2000,
                               model_id: str = "gpt-4o") -> str:
        """The prompt context for `task` in session `session_id`: relevant memory and the latest turns,
        within `token_budget` tokens of `model_id`'s tokenizer."""
        reply = await engine(client.assemble_context(session_id, task, token_budget=token_budget, model_id=model_id))
        return str(reply.assembled_prompt)

    @server.tool(annotations=READ_ONLY)
    async def session_history(session_id: str, token_budget: Positive = 2000, model_id: str = "gpt-4o") -> str:
        """The latest turns of session `session_id`, newest last, as many as fit in `token_budget` tokens."""
        reply = await engine(client.assemble_context(session_id, "", token_budget=token_budget, model_id=model_id,
                                                     hints={"recent_share": "1"}))
        return str(reply.assembled_prompt)

    return server


def client_from_args(args: argparse.Namespace) -> AsyncClient:
    if args.data_dir is not None:
        return AsyncClient.from_data_dir(args.data_dir, args.scope, clearance=args.clearance)
    token = os.environ.get(args.token_env, "")
    if not token.strip():
        sys.exit(f"context-engine-mcp: ${args.token_env} holds no token (or pass --data-dir for development)")
    return AsyncClient(args.address or "127.0.0.1:50051", scope=args.scope, token=token)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="context-engine-mcp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scope", required=True, help="the caller's scope, org[/pillar[/team[/agent]]]")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--address", help="the API's host:port (default 127.0.0.1:50051), with a token")
    where.add_argument("--data-dir", type=pathlib.Path, help="development: a running stack's data directory (its "
                       "address, and tokens minted from its key) instead of --address and a token")
    p.add_argument("--token-env", default="CONTEXT_ENGINE_TOKEN", help="the environment variable holding the JWT")
    p.add_argument("--clearance", type=int, default=2, help="with --data-dir: the minted tokens' clearance")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: the loopback address to listen on")
    p.add_argument("--port", type=int, default=8765, help="http: the port (the endpoint is /mcp)")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.transport == "http" and not loopback(args.host):
        sys.exit(f"context-engine-mcp: --host {args.host} is not a loopback address; the endpoint acts with the "
                 "configured token for whoever reaches it: serve other hosts through an authenticating proxy")
    server = build_server(client_from_args(args))
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
