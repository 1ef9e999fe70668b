"""How a turn reads in an assembled prompt: its speaker before its text, its time above it.

- speaker: `metadata["role"]`, as `role: text`. A turn without a role is shown as it was
  ingested (content that names its own speaker, `Caroline: ...`, keeps it).
- time: `metadata["time"]` as the caller gave it (the turn's time in the caller's world: a
  replayed or imported conversation keeps its own dates), else the time the engine received the
  turn, in UTC to the minute. A compaction summary's line is dated as the turn it stands for,
  and says it is a summary: `[2024-05-01 10:00, summary of earlier turns]`.

Caller-given labels are cut to one line of at most MAX_LABEL_CHARS characters, so a role or a time
cannot open a section of its own in the prompt. Pure, no I/O.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

MAX_LABEL_CHARS = 64
SUMMARY_LABEL = "summary of earlier turns"
_NOT_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def one_line(value: Any) -> str:
    """`value` as one line: control characters and line breaks become a space, at most MAX_LABEL_CHARS."""
    if not isinstance(value, str):
        return ""
    return " ".join(_NOT_ONE_LINE.sub(" ", value).split())[:MAX_LABEL_CHARS].strip()


def with_speaker(text: str, metadata: Mapping[str, Any]) -> str:
    role = one_line(metadata.get("role"))
    return f"{role}: {text}" if role and text else text


def turn_time(metadata: Mapping[str, Any], received: dt.datetime) -> str:
    return one_line(metadata.get("time")) or received.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def summary_time(time: str) -> str:
    """The time label of a summary line dated `time` (its turn's)."""
    return f"{time}, {SUMMARY_LABEL}"


def header(time: str) -> str:
    """The line above the first turn of a run of turns with this time label."""
    return f"[{time}]"
