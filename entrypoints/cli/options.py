"""Options and values several commands take: the data directory, and durations (90s, 30m, 1h, 7d)."""

from __future__ import annotations

import datetime as dt
import pathlib
import re
from typing import Annotated, Optional

import typer

DataDir = Annotated[Optional[pathlib.Path], typer.Option(
    "--data-dir", help="Data directory (env CONTEXT_ENGINE_HOME; default ./.context-engine)")]


def parse_duration(text: str) -> dt.timedelta:
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise typer.BadParameter("use a number and a unit: 90s, 30m, 1h, 7d")
    amount, unit = int(match[1]), match[2]
    return dt.timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount})
