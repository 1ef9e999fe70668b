"""The LoCoMo conversations (../shared/benchmarks/locomo): turns and questions with their evidence."""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass, field

LOCOMO_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "locomo"
# Every weight, floor or rule fitted on LoCoMo is fitted on the first six conversations and judged
# on the last four (issue #38).
FIT = ("26", "30", "41", "42", "43", "44")
HELD_OUT = ("47", "48", "49", "50")
SPLITS = (("fit", FIT), ("held out", HELD_OUT))
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised dia_ids ("D8:6"), de-duplicated, in order


@dataclass(frozen=True)
class Conversation:
    name: str  # the file's stem ("26")
    turns: tuple[tuple[str, str], ...]  # (dia_id, "speaker: text") in dialogue order
    questions: tuple[Question, ...]  # every question of the file, all categories
    times: dict[str, str] = field(default_factory=dict, compare=False)  # dia_id -> its session's date_time


def normalise_evidence(entries: list[str]) -> tuple[str, ...]:
    """`"D8:6; D9:17"`, `D:11:26`, `D30:05` -> D8:6, D9:17, D11:26, D30:5; a bare "D" -> nothing."""
    ids = [f"D{int(a)}:{int(b)}" for entry in entries for a, b in _EVIDENCE.findall(entry)]
    return tuple(dict.fromkeys(ids))


def load_locomo(directory: pathlib.Path = LOCOMO_DIR, limit: int | None = None) -> list[Conversation]:
    """The LoCoMo conversations: documents are dialog turns "speaker: text" (no image captions)."""
    conversations = []
    for path in sorted(directory.glob("*.json"), key=lambda p: p.stem)[:limit]:
        data = json.loads(path.read_text())
        sessions = sorted((k for k in data if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k[8:]))
        turns = tuple((t["dia_id"], f"{t['speaker']}: {t['text']}") for k in sessions for t in data[k])
        questions = tuple(Question(q["question"], int(q["category"]), normalise_evidence(q.get("evidence") or []))
                          for q in data["qa"])
        times = {t["dia_id"]: data.get(f"{k}_date_time", "") for k in sessions for t in data[k]}
        conversations.append(Conversation(path.stem, turns, questions, times))
    return conversations


def org_of(c: Conversation) -> str:
    """The org a LoCoMo bench puts conversation `c` in (one org per conversation)."""
    return f"locomo-{c.name}"
