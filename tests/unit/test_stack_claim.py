"""One `up` per data directory (issue #39, item 3): a second `up` beside a running one deleted the
running one's run/stack.json as it gave up, and every command run beside the stack then said no
stack ran. The two real `up`s are in tests/integration/test_up.py."""

from __future__ import annotations

import os

import pytest

from context_engine.config import Settings
from entrypoints.supervisor import Stack, StackRunning, claim_home, stack_file, write_stack_file


def test_a_claimed_directory_is_refused_naming_the_holder(tmp_path):
    held = claim_home(tmp_path)
    try:
        write_stack_file(tmp_path, "postgresql://postgres:pw@127.0.0.1:5432/db", "127.0.0.1:9092",
                         api_address="127.0.0.1:50051")
        with pytest.raises(StackRunning) as refused:
            claim_home(tmp_path)
        assert f"`up` pid {os.getpid()}, ContextEngine at 127.0.0.1:50051" in str(refused.value)
        assert "--data-dir" in str(refused.value)
    finally:
        os.close(held)
    os.close(claim_home(tmp_path))  # free again once the holder closes it (or exits)


def test_a_refused_up_leaves_the_running_stacks_files_alone(tmp_path, monkeypatch):
    held = claim_home(tmp_path)
    try:
        write_stack_file(tmp_path, "postgresql://postgres:pw@127.0.0.1:5432/db", "127.0.0.1:9092",
                         api_address="127.0.0.1:50051")
        before = stack_file(tmp_path).read_bytes()
        monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
        second = Stack(Settings())
        with pytest.raises(StackRunning):
            second.start()
        second.stop()  # run_stack always stops what it started
        assert stack_file(tmp_path).read_bytes() == before
    finally:
        os.close(held)
