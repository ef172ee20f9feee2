"""Was the CPU contended while we measured? Linux pressure stall information says.

/proc/pressure/cpu "some total" counts the microseconds during which at least one runnable task
waited for a CPU. On a 2-core machine running 2 torch threads, anything else that wakes up makes
the threads wait on each other at every parallel region, and a decode step can take 5-10x longer.
The benchmark records the stall seen during every timed call, reports it, and re-measures a
prompt whose calls were disturbed, so a noisy neighbour shows up in the report instead of
silently bending the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PSI_CPU = Path("/proc/pressure/cpu")


def stall_seconds(path: Path = PSI_CPU) -> float | None:
    """Cumulative CPU stall ("some"), in seconds; None where the kernel does not report it."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some"):
                fields = dict(part.split("=") for part in line.split()[1:])
                return int(fields["total"]) / 1e6
    except (OSError, ValueError, KeyError):
        return None
    return None


@dataclass
class Stall:
    """CPU stall accumulated over an interval, as a fraction of the interval's wall time."""

    seconds: float | None
    wall: float

    @property
    def fraction(self) -> float | None:
        if self.seconds is None or self.wall <= 0:
            return None
        return self.seconds / self.wall


def stall_between(before: float | None, after: float | None, wall: float) -> Stall:
    return Stall(None if before is None or after is None else max(0.0, after - before), wall)
