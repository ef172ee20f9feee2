"""The machine a report was measured on, as every report under assets/ names it: described from what the process
reads of its own machine (/proc/cpuinfo, the memory it has), never typed in afterwards."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time

import psutil

from specviz.kernels.build import cpu_fields, isa_cap

# the instruction sets that decided which kernels were fast on this project's CPUs, as /proc/cpuinfo names them
FEATURES = (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX"))


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (this project's CPUs differ by session: a number is only this one's)."""
    return cpu_fields(cpuinfo).get("model name") or platform.processor() or platform.machine()


def described(fields: dict[str, str], cores: int | None, memory_bytes: int) -> str:
    """One line naming the machine: the CPU with its family and model (a model name alone, 'AMD EPYC', spans
    generations), the instruction sets that decide the kernels, the cores and the memory."""
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    family = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None
    features = ", ".join(label if flag in flags else f"no {label}" for flag, label in FEATURES) if flags else None
    detail = "; ".join(x for x in (family, features) if x)
    return f"{name}{f' ({detail})' if detail else ''}, {cores} cores, {memory_bytes / 2**30:.0f} GiB"


def machine() -> dict:
    fields, cap = cpu_fields(), isa_cap()
    line = described(fields, os.cpu_count(), psutil.virtual_memory().total)
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "described": line + (f", run below AVX-512 ({cap})" if cap else "")}


def run_meta(described: dict | None = None) -> dict:
    """A report's own account of its run: the machine (`described`, or `machine()`), the date, the command as it was
    typed."""
    return {"machine": described or machine(), "date": time.strftime("%Y-%m-%d"), "time": time.strftime("%H:%M:%S"),
            "command": "specviz " + shlex.join(sys.argv[1:])}
