"""Helpers for child processes of the embedded stack."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

_PR_SET_PDEATHSIG = 1


def child_preexec() -> None:
    """Run in the child between fork and exec: die with SIGTERM when the parent dies, and
    leave the parent's process group so a terminal Ctrl-C reaches only `up`, which then
    stops the children in order."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    os.setpgid(0, 0)
