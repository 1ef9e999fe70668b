"""`up`'s SIGINT/SIGTERM handler: Python runs a handler in the main thread between two bytecodes,
which may be inside `stopping.wait()` holding the lock `stopping.set()` takes. A handler that set
the event itself then waited for itself, and `up` never stopped (seen once: a bench's stack.stop()
timed out with `up` in Event.set under its own signal handler)."""

from __future__ import annotations

import signal
import threading

from entrypoints.supervisor import stop_on_signal


def test_a_signal_that_lands_inside_stoppings_own_lock_still_stops_the_stack():
    stopping, said = threading.Event(), []
    on_signal = stop_on_signal(stopping, said.append)
    with stopping._cond:  # where the main thread is when the signal lands inside stopping.wait()
        on_signal(signal.SIGTERM, None)  # returns: it does not take the lock itself
        assert not stopping.is_set()
    assert stopping.wait(timeout=30)
    on_signal(signal.SIGINT, None)  # make's and the shell's second signal
    for thread in threading.enumerate():
        if thread.name == "stop-signal":
            thread.join(timeout=30)
    assert said == ["SIGTERM received"]
