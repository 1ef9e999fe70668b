"""Command-line options the benches share."""

from __future__ import annotations

import pathlib

from locomo import LOCOMO_DIR


def client_counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_load_options(parser, *, clients: list[int], unit: str) -> None:
    """bench/search.py's and bench/assemble.py's corpus, stack and load-phase options."""
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--ingest-concurrency", type=int, default=32)
    parser.add_argument("--home", type=pathlib.Path, default=None, help="data directory (reused when it exists)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory at the end")
    parser.add_argument("--api-processes", type=int, default=1, help="API processes sharing the port")
    parser.add_argument("--connections", type=int, default=8,
                        help="client connections the calls are spread over (one lands on one API process)")
    parser.add_argument("--rate", type=float, default=50.0, help=f"open loop: {unit}/s offered")
    parser.add_argument("--open-seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=client_counts, default=clients,
                        help="closed loop client counts, comma-separated")
    parser.add_argument("--closed-seconds", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    add_setting_option(parser)


def add_setting_option(parser) -> None:
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a CONTEXT_ENGINE_* setting for the stack, e.g. QUERY_VECTORS_REMEMBERED=0 (repeatable)")


def stack_settings(args) -> dict[str, str]:
    """--setting NAME=VALUE options as the stack's environment (CONTEXT_ENGINE_ prefix optional)."""
    if bad := [s for s in args.setting if "=" not in s]:
        raise SystemExit(f"--setting takes NAME=VALUE, got {bad[0]!r}")
    return dict(("CONTEXT_ENGINE_" + name.removeprefix("CONTEXT_ENGINE_").upper(), value)
                for name, value in (s.split("=", 1) for s in args.setting))


def add_locomo_options(parser) -> None:
    """bench/locomo_search.py's and bench/locomo_assembly.py's data and stack options."""
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N",
                        help="only the first N conversations (files in name order)")
    parser.add_argument("--locomo-dir", type=pathlib.Path, default=LOCOMO_DIR)
    parser.add_argument("--home", type=pathlib.Path, default=None,
                        help="data directory for the stack (default: a scratch directory, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="do not remove the data directory")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the numbers as JSON")
