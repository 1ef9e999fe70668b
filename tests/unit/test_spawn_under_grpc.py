"""Spawning children (the way the embedded stack does) while gRPC calls are in flight.

gRPC core's fork handlers used to abort about one child in 150 here (grpc/grpc#43055); every
entry point disables them (entrypoints.embedded.process.disable_grpc_fork_handlers). The
scenario runs in a fresh interpreter because the setting is read once, when gRPC initialises.
"""

from __future__ import annotations

import subprocess
import sys

_SCENARIO = """
import signal, subprocess, sys, threading
from concurrent import futures

from entrypoints.embedded.process import disable_grpc_fork_handlers
disable_grpc_fork_handlers()  # must come first: before gRPC initialises
import grpc

from entrypoints.embedded.process import child_preexec

server = grpc.server(futures.ThreadPoolExecutor(4))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
done = threading.Event()

def call_forever():
    method = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/probe.Probe/Call")
    while not done.is_set():
        try:
            method(b"", timeout=0.5)
        except grpc.RpcError:
            pass

for _ in range(4):
    threading.Thread(target=call_forever, daemon=True).start()
codes = [subprocess.Popen(["/bin/true"], start_new_session=True,
                          preexec_fn=child_preexec(signal.SIGTERM)).wait()
         for _ in range(int(sys.argv[1]))]
done.set()
print(sum(code != 0 for code in codes))
"""


def test_children_spawned_during_grpc_calls_all_start() -> None:
    out = subprocess.run([sys.executable, "-c", _SCENARIO, "600"], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split()[-1] == "0", out.stderr[-2000:]


def test_an_explicit_fork_support_setting_is_kept() -> None:
    probe = ("import os; from entrypoints.embedded.process import disable_grpc_fork_handlers; "
             "disable_grpc_fork_handlers(); print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={"GRPC_ENABLE_FORK_SUPPORT": "true", "PATH": "/usr/bin:/bin"},
                         check=True)
    assert out.stdout.strip() == "true"


def test_importing_the_package_changes_nothing_in_the_process() -> None:
    probe = "import os, context_engine; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT', 'unset'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "unset"


def test_the_command_line_entry_point_turns_the_handlers_off() -> None:
    probe = ("import os, sys; sys.argv = ['context-engine', '--help']\n"
             "import entrypoints.__main__ as entry\n"
             "try:\n    entry.main()\nexcept SystemExit:\n    pass\n"
             "print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip().splitlines()[-1] == "false"
