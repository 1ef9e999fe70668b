"""The worker's word that it is projecting, for `context-engine up`.

The API answers as soon as it listens, but an IngestEvent is acknowledged only once the worker
has archived and projected it, and the worker needs ~3 s to join its consumer group. `up` says
SERVING only after the worker has written `run/worker.ready` in the data directory, which it does
when the domain-event topic's partitions are assigned to it; the supervisor removes the file
before it starts the worker, so a file left by an earlier run never counts.
"""

from __future__ import annotations

import pathlib


def ready_file(home: pathlib.Path) -> pathlib.Path:
    return home / "run" / "worker.ready"


def mark_ready(home: pathlib.Path, partitions: list[int]) -> None:
    path = ready_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"event partitions {' '.join(map(str, partitions))}\n")  # for a reader; only existence counts


def clear(home: pathlib.Path) -> None:
    ready_file(home).unlink(missing_ok=True)


def is_ready(home: pathlib.Path) -> bool:
    return ready_file(home).exists()
