"""What every bench report says beside its numbers: the machine, how busy it was, percentiles."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    cpu = "unknown cpu"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def load_average() -> str:
    """The 1/5/15-minute load averages: the machine is shared, so say how busy it was."""
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
