"""The `context-engine` command line: the app, assembled from one module per command group."""

from __future__ import annotations

import logging
import os
import sys
import traceback

import typer

from entrypoints.cli.audit import audit
from entrypoints.cli.call import call
from entrypoints.cli.guardrail import guardrail_app
from entrypoints.cli.history import history
from entrypoints.cli.keys import keys_app
from entrypoints.cli.mcp import EXTRA_ARGS, mcp
from entrypoints.cli.models import models_app
from entrypoints.cli.pii import pii_app
from entrypoints.cli.processes import migrate, serve_app, up, worker
from entrypoints.cli.reindex import reindex
from entrypoints.cli.replay import replay, verify
from entrypoints.cli.stats import stats_app
from entrypoints.cli.status import status
from entrypoints.cli.token import token_app

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Context Engine: event-sourced context and memory for LLM agents.")
# `--help` lists the commands, then the groups, each in the order registered here.
for command in (up, status, call, history, replay, verify, reindex, worker, migrate, audit):
    app.command()(command)
app.command(context_settings=EXTRA_ARGS)(mcp)
app.add_typer(token_app, name="token")
app.add_typer(serve_app, name="serve")
app.add_typer(pii_app, name="pii")
app.add_typer(stats_app, name="stats")
app.add_typer(models_app, name="models", help="Import and inspect the ML detector's model weights.")
app.add_typer(guardrail_app, name="guardrail")
app.add_typer(keys_app, name="keys")


def main() -> None:
    """Run the app; an error that escapes a command is one line on stderr, with its reason code
    and a hint, and exit 1 (the traceback with CONTEXT_ENGINE_LOG_LEVEL=DEBUG, and in a service
    process's JSON log as its `exception` field)."""
    # What a command creates is its user's alone: the data directory, keys, logs (which name
    # every caller's org and subject), and everything the processes of `up` write.
    os.umask(0o077)
    try:
        app()
    except Exception as exc:  # click's own usage errors and exits never get here
        if logging.root.handlers:  # a service process (configure_logging): its JSON log keeps the traceback
            logging.getLogger("context_engine").exception("process failed")
        reason = getattr(exc, "reason", None)
        hint = _hint(exc)
        print(f"error: {type(exc).__name__}: {exc}" + (f" (reason {reason})" if reason else "")
              + (f"; {hint}" if hint else ""), file=sys.stderr)
        if os.environ.get("CONTEXT_ENGINE_LOG_LEVEL", "").upper() == "DEBUG":
            traceback.print_exc()
        else:
            print("(the traceback: set CONTEXT_ENGINE_LOG_LEVEL=DEBUG)", file=sys.stderr)
        raise SystemExit(1) from None


def _hint(exc: Exception) -> str:
    if isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__module__.startswith(("asyncpg", "aiokafka")):
        return "is the stack running, and are its database and broker where the settings say? (context-engine status)"
    return ""
