"""Was the CPU contended while we measured? Linux pressure stall information says.

/proc/pressure/cpu "some total" counts the microseconds during which at least one runnable task
waited for a CPU. On a 2-core machine running 2 torch threads, anything else that wakes up makes
the threads wait on each other at every parallel region, and a decode step can take 5-10x longer.
The benchmark records the stall seen during every timed call, reports it, and re-measures a
prompt whose calls were disturbed, so a noisy neighbour shows up in the report instead of
silently bending the numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specviz.engine.plumbing import clock

PSI_CPU = Path("/proc/pressure/cpu")

T = TypeVar("T")


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


def stall_between(before: float | None, after: float | None, wall: float) -> float | None:
    """The CPU stall accumulated between two readings, as a fraction of the interval's wall time."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, after - before) / wall


def timed(fn: Callable[[], T], device) -> tuple[T, float, float | None]:
    """fn()'s result, its wall seconds (queued device work included) and the CPU stall meanwhile."""
    s0, t0 = stall_seconds(), clock(device)
    out = fn()
    seconds = clock(device) - t0
    return out, seconds, stall_between(s0, stall_seconds(), seconds)


def calmest(measure: Callable[[], T], stall_of: Callable[[T], float | None], max_stall: float, retries: int,
            on_retry: Callable[[], None] = lambda: None) -> tuple[T, int]:
    """`measure()` again while its stall exceeds `max_stall`, at most `retries` more times.

    Returns the least disturbed measurement and how many were taken. An unknown stall (no PSI)
    counts as calm: there is nothing to wait for.
    """
    best, best_stall, attempt = None, 0.0, 0
    while True:
        attempt += 1
        out = measure()
        stall = stall_of(out)
        if best is None or (stall or 0.0) < best_stall:
            best, best_stall = out, stall or 0.0
        if stall is None or stall <= max_stall or attempt > retries:
            return best, attempt
        on_retry()
