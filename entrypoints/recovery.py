"""What `up` is bringing back, and what it brought back lately: run/recovery.json, written by the
supervisor as it restarts a process and read by `status` (issue #41: health says what is
recovering). A process dies and comes back within a second or two; without this record nothing
outside `up`'s own output would say it happened.

One entry per process (the last time it died): `recovering` from its death until it is back (the
worker: its partitions assigned again, its ready mark; PostgreSQL and the broker: accepting
connections; an API process or the detector: started again), then `recovered` with how long that
took. Writing it is best effort: a failure (a full disk) is told and kept in `unwritten`, never
raised.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

RECENT_S = 3600.0  # `status` shows a recovery this recent


def recovery_file(home: Path) -> Path:
    return home / "run" / "recovery.json"


class RecoveryRecord:
    """The supervisor's side: `died`, `waiting` (a restart failed or is delayed), `recovered`."""

    def __init__(self, home: Path, *, clock=time.time, say=lambda message: None) -> None:
        """`say(message)`: where a failed write is told (up's output)."""
        self.path, self._clock, self._say = recovery_file(home), clock, say
        self.entries: dict[str, dict[str, Any]] = {}
        self.unwritten = ""  # why the last write failed, if it did

    def start_afresh(self) -> None:
        """A new `up`: an earlier stack's record is not this one's."""
        self.entries.clear()
        self.path.unlink(missing_ok=True)

    def died(self, process: str, restarts_last_minute: int) -> None:
        """`process` died, or a restart of it failed (then it is still recovering since it died)."""
        died_at = self.entries[process]["died_at"] if self.recovering(process) else self._clock()
        self.entries[process] = {"process": process, "state": "recovering", "died_at": died_at,
                                 "restarts_last_minute": restarts_last_minute, "detail": ""}
        self._write()

    def waiting(self, process: str, detail: str) -> None:
        if entry := self.entries.get(process):
            entry["detail"] = detail
            self._write()

    def recovered(self, process: str) -> None:
        entry = self.entries.get(process)
        if entry is None or entry["state"] != "recovering":
            return
        now = self._clock()
        entry.update(state="recovered", recovered_at=now, seconds=round(now - entry["died_at"], 1), detail="")
        self._write()

    def recovering(self, process: str) -> bool:
        return self.entries.get(process, {}).get("state") == "recovering"

    def _write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(json.dumps(sorted(self.entries.values(), key=lambda e: e["died_at"])))
            os.replace(tmp, self.path)  # a reader sees the old record or the new, never half of one
        except OSError as exc:  # a full disk must not stop the restart this only describes
            self.unwritten = f"{type(exc).__name__}: {exc}"
            self._say(f"could not write {self.path} ({self.unwritten}); status will not show this recovery")


def recent_recoveries(home: Path, *, now: float | None = None) -> list[dict[str, Any]]:
    """`status`'s side: every process still recovering, and those recovered in the last hour."""
    try:
        entries = json.loads(recovery_file(home).read_text())
    except (OSError, ValueError):
        return []
    now = time.time() if now is None else now
    return [e for e in entries if e.get("state") == "recovering" or now - e.get("recovered_at", 0) <= RECENT_S]


def describe(entry: dict[str, Any]) -> str:
    """One line of `status`: 'postgres recovering since 12:03:05 (restart 1 in the last minute)'."""
    died = time.strftime("%H:%M:%S", time.localtime(entry["died_at"]))
    if entry["state"] == "recovering":
        detail = f"; {entry['detail']}" if entry.get("detail") else ""
        return (f"{entry['process']} recovering since {died} "
                f"(restart {entry['restarts_last_minute']} in the last minute{detail})")
    back = time.strftime("%H:%M:%S", time.localtime(entry["recovered_at"]))
    return f"{entry['process']} died at {died}, back at {back} ({entry['seconds']:.1f} s)"
