"""The dtype `--dtype auto` picks on a CPU: the one whose tuned one-token step is measured fastest here.

No /proc/cpuinfo flag says it: a CPU with AVX512-BF16 had one-row bf16 products slower than two-row ones, one
without bf16 units emulates them. So one decoder layer is timed in each dtype on this machine's best kernel for
one row (padding included), once, and the answer cached beside the kernel tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from specviz.models.kernel_table import KernelKey, kept_or_measured, table_path
from specviz.models.kernel_timing import Timer, time_group
from specviz.models.kernels import kernels_of
from specviz.models.plans import choose

log = logging.getLogger(__name__)

# One decoder layer of the embedded target (Qwen2.5-Coder-1.5B: q/o 1536x1536, k/v 256x1536, gate/up 8960x1536,
# down 1536x8960), over 100 MB in float32: which dtype multiplies one row fastest is the machine's answer.
REFERENCE_LAYER = ((1536, 1536, 2), (256, 1536, 2), (8960, 1536, 2), (1536, 8960, 1))
DTYPE_CANDIDATES = (torch.float32, torch.bfloat16)


def layer_step_seconds(dtype: torch.dtype, timer: Timer = time_group) -> float:
    """The reference layer's one-row products on this machine's fastest kernel for them (padding included)."""
    total = 0.0
    for out, inp, count in REFERENCE_LAYER:
        linear = nn.Linear(inp, out, bias=False, dtype=dtype)
        costs = timer([kernels_of(linear)], inp, dtype, torch.device("cpu"), [1, 2, 3, 4])
        best = choose(costs, 4)[1]
        total += costs[best.kernel][best.rows] * count
    return total


def cpu_dtype_timings(folder: Path | None = None, cpu: str | None = None,
                      measure: Callable[[torch.dtype], float] = layer_step_seconds) -> dict[str, float]:
    """Seconds of the reference layer's tuned one-token step per dtype, measured once per machine and cached."""
    # the candidate kernels are part of the answer: timed again when they change
    key = KernelKey.of([f"dtype:{d}|{'+'.join(kernels_of(nn.Linear(64, 64, bias=False, dtype=d)))}"
                        for d in DTYPE_CANDIDATES], torch.device("cpu"), [1, 2, 3, 4], cpu)
    path = table_path(key, folder).with_name(f"dtype-{key.digest()}.json")

    def measured() -> dict:
        with torch.inference_mode():
            return {"seconds": {str(d).removeprefix("torch."): measure(d) for d in DTYPE_CANDIDATES}}
    return kept_or_measured(path, key, "The dtype timings", measured, log.warning)[0]["seconds"]


def fastest_cpu_dtype(**kw) -> torch.dtype:
    seconds = cpu_dtype_timings(**kw)
    return getattr(torch, min(seconds, key=seconds.get))
