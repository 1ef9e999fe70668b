"""`mcp`: the client distribution's MCP server (`context-engine-mcp`, clients/python) beside this
stack: its address and development tokens from the data directory unless `--address` and a
token are given. Every other option is the server's own (`context-engine mcp --help-server`)."""

from __future__ import annotations

import typer

from entrypoints.cli.options import DataDir

EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def mcp(
    ctx: typer.Context,
    data_dir: DataDir = None,
    help_server: bool = typer.Option(False, "--help-server", help="the MCP server's own options"),
) -> None:
    """Run the MCP server for agents (Claude Code, Cursor, any MCP client): tools remember,
    remember_memory, search, assemble_context, session_history in one scope, over stdio or
    streamable HTTP. E.g. `context-engine mcp --scope acme/sales/emea` or
    `context-engine mcp --scope acme/sales/emea --transport http --port 8765`."""
    try:
        from context_engine_client.mcp_server import main
    except ImportError as err:
        raise typer.BadParameter(f"the MCP server needs `pip install 'clients/python[mcp]'` ({err})") from None
    from entrypoints.cli.settings import command_settings

    args = list(ctx.args)
    if help_server:
        args = ["--help"]
    elif not any(a == "--address" or a.startswith("--address=") for a in args):
        args = ["--data-dir", str(command_settings(home=data_dir).home_dir), *args]
    main(args)
