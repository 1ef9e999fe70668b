"""What `up` is bringing back and what it brought back lately (entrypoints/recovery.py), as
`status` reads it. The kills themselves are in tests/integration/test_up.py."""

from __future__ import annotations

from context_engine.config import Settings
from entrypoints.recovery import RECENT_S, RecoveryRecord, describe, recent_recoveries, recovery_file
from entrypoints.supervisor import Child, Stack


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_death_is_recovering_until_the_process_is_back_then_says_how_long_it_took(tmp_path):
    clock = Clock()
    record = RecoveryRecord(tmp_path, clock=clock)
    record.died("postgres", 1)
    [entry] = recent_recoveries(tmp_path, now=clock.now)
    assert entry["state"] == "recovering" and describe(entry).startswith("postgres recovering since ")
    assert "(restart 1 in the last minute)" in describe(entry)

    clock.now += 2
    record.waiting("postgres", "a restart failed; trying again in 1s")
    record.died("postgres", 2)  # the next try: still recovering since the death
    clock.now += 1.5
    record.waiting("postgres", "a restart failed; trying again in 2s")
    [entry] = recent_recoveries(tmp_path, now=clock.now)
    assert entry["died_at"] == clock.now - 3.5 and entry["restarts_last_minute"] == 2
    assert describe(entry).endswith("(restart 2 in the last minute; a restart failed; trying again in 2s)")

    record.recovered("postgres")
    record.recovered("postgres")  # said twice: the first time counts
    [entry] = recent_recoveries(tmp_path, now=clock.now)
    assert (entry["state"], entry["seconds"]) == ("recovered", 3.5)
    assert describe(entry).endswith("(3.5 s)") and " back at " in describe(entry)
    assert recent_recoveries(tmp_path, now=clock.now + RECENT_S + 1) == []  # an hour on: not news
    record.died("broker", 1)
    assert [e["process"] for e in recent_recoveries(tmp_path, now=clock.now + RECENT_S + 1)] == ["broker"]


def test_a_new_up_starts_with_no_record_and_a_bad_file_reads_as_none(tmp_path):
    RecoveryRecord(tmp_path).died("worker", 1)
    assert recent_recoveries(tmp_path)
    RecoveryRecord(tmp_path).start_afresh()
    assert not recovery_file(tmp_path).exists() and recent_recoveries(tmp_path) == []
    recovery_file(tmp_path).write_text("{not json")
    assert recent_recoveries(tmp_path) == []


class DeadChild(Child):
    """A child that has exited with -9 and 'starts' without a process."""

    started = 0

    @property
    def exited(self) -> int | None:
        return -9

    def start(self, env: dict[str, str]) -> int:
        self.started += 1
        return 4242


def test_the_supervisor_records_a_childs_death_and_its_restart(tmp_path):
    stack = Stack(Settings(home=tmp_path))
    detector, worker = DeadChild("detector", [], tmp_path / "d.log"), DeadChild("worker", [], tmp_path / "w.log")
    assert stack.supervise(detector) and stack.supervise(worker)  # the first restarts: at once
    assert (detector.started, worker.started) == (1, 1)
    states = {e["process"]: e["state"] for e in recent_recoveries(tmp_path)}
    # the worker is back only when it projects again (the monitor watches its ready mark)
    assert states == {"detector": "recovered", "worker": "recovering"}


def test_the_lines_docs_show_are_the_lines_status_prints(tmp_path):
    import pathlib
    import re

    clock = Clock()
    record = RecoveryRecord(tmp_path, clock=clock)
    record.died("postgres", 1)
    record.died("worker", 1)
    clock.now += 4.6
    record.recovered("worker")
    printed = {e["process"]: describe(e) for e in recent_recoveries(tmp_path, now=clock.now)}
    docs = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"
    shown = {line.split()[1]: line.removeprefix("recovery: ")
             for line in docs.read_text().splitlines() if line.startswith("recovery: ")}
    assert set(shown) == set(printed)
    for process, line in shown.items():  # the same words, the times apart
        assert re.sub(r"\d\d:\d\d:\d\d", "T", line) == re.sub(r"\d\d:\d\d:\d\d", "T", printed[process])


def test_a_record_it_cannot_write_is_kept_and_said_never_raised(tmp_path):
    (tmp_path / "run").write_text("a file where the directory should be")
    said: list[str] = []
    record = RecoveryRecord(tmp_path, say=said.append)
    record.died("postgres", 1)  # a full disk, a read-only directory: the restart goes on
    assert record.recovering("postgres") and record.unwritten.startswith(("FileExistsError", "NotADirectoryError"))
    assert said == [f"could not write {tmp_path}/run/recovery.json ({record.unwritten}); "
                    "status will not show this recovery"]
