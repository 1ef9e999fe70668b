"""The entry point of every engine process: the `context-engine` command and `python -m
context_engine` (context_engine/__main__.py, how the supervisor starts the API, the worker and the
detector), and nothing else."""

from __future__ import annotations


def main() -> None:
    from entrypoints.embedded.process import disable_grpc_fork_handlers

    disable_grpc_fork_handlers()  # before the command line's imports load gRPC
    from entrypoints.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
