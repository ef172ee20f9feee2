"""The machine a report was measured on, as every report under assets/ names it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (this project's CPUs differ by session: a number is only this one's)."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path(cpuinfo).read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> dict:
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
