"""The dtype `--dtype auto` picks on a CPU: the one whose speculative lane is measured fastest here.

No /proc/cpuinfo flag says it: a CPU with AVX512-BF16 had one-row bf16 products slower than two-row ones, one
without bf16 units emulates them, and below AVX-512 a bf16 verify of many rows costs more multiplies than its
bytes. The speculative lane's target cost is its verify (the draft's steps do not change with the target's dtype),
and the race's baseline is the fastest target alone whatever dtype that takes; so one decoder layer is timed in each
dtype for a verify of `VERIFY_ROWS` rows, on the kernels that sum a row alike at every row count where the dtype has
one (the race's verify is invariant), and for one row (the target alone's step, reported beside it). Once per
machine, the answer cached beside the kernel tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from specviz.models.kernel_table import KernelKey, kept_or_measured, table_path
from specviz.models.kernel_timing import Timer, time_group
from specviz.models.kernels import INVARIANT, kernels_of
from specviz.models.plans import choose

log = logging.getLogger(__name__)

# One decoder layer of the embedded target (Qwen2.5-Coder-1.5B: q/o 1536x1536, k/v 256x1536, gate/up 8960x1536,
# down 1536x8960), over 100 MB in float32: which dtype multiplies one row fastest is the machine's answer.
REFERENCE_LAYER = ((1536, 1536, 2), (256, 1536, 2), (8960, 1536, 2), (1536, 8960, 1))
DTYPE_CANDIDATES = (torch.float32, torch.bfloat16)
VERIFY_ROWS = 13  # the default K = 12's verify (engine.config's K + 1: a test keeps the two equal)
ROWS = (1, 2, 3, 4, VERIFY_ROWS)


def layer_seconds(dtype: torch.dtype, timer: Timer = time_group) -> dict[str, float]:
    """The reference layer's products for one row ("step", on the fastest kernel, padding included) and for a
    verify's `VERIFY_ROWS` rows ("verify", on the fastest invariant kernel where the dtype has one)."""
    step = verify = 0.0
    for out, inp, count in REFERENCE_LAYER:
        linear = nn.Linear(inp, out, bias=False, dtype=dtype)
        costs = timer([kernels_of(linear)], inp, dtype, torch.device("cpu"), list(ROWS))
        best = choose(costs, 4)[1]
        step += costs[best.kernel][best.rows] * count
        invariant = {k: per for k, per in costs.items() if k in INVARIANT} or costs
        verify += min(per[VERIFY_ROWS] for per in invariant.values()) * count
    return {"step": step, "verify": verify}


def cpu_dtype_timings(folder: Path | None = None, cpu: str | None = None,
                      measure: Callable[[torch.dtype], dict[str, float]] = layer_seconds) -> dict[str, dict]:
    """Seconds of the reference layer's step and verify per dtype, measured once per machine and cached."""
    # the candidate kernels are part of the answer: timed again when they change
    key = KernelKey.of([f"dtype:{d}|{'+'.join(kernels_of(nn.Linear(64, 64, bias=False, dtype=d)))}"
                        for d in DTYPE_CANDIDATES], torch.device("cpu"), ROWS, cpu)
    path = table_path(key, folder).with_name(f"dtype-{key.digest()}.json")

    def measured() -> dict:
        with torch.inference_mode():
            return {"seconds": {str(d).removeprefix("torch."): measure(d) for d in DTYPE_CANDIDATES}}
    return kept_or_measured(path, key, "The dtype timings", measured, log.warning)[0]["seconds"]


def race_dtype(**kw) -> tuple[torch.dtype, str]:
    """The dtype whose verify is fastest here, and one sentence saying so with both dtypes' times."""
    seconds = cpu_dtype_timings(**kw)
    name = min(seconds, key=lambda d: seconds[d]["verify"])
    each = ", ".join(f"{d} {s['verify'] * 1e3:.2f} ms (a step {s['step'] * 1e3:.2f})" for d, s in seconds.items())
    return getattr(torch, name), (f"dtype auto: {name}, whose verify of {VERIFY_ROWS} rows, the speculative lane's "
                                  f"cost, is the fastest on this CPU (a decoder layer's products: {each}; measured "
                                  "once, cached)")


def fastest_cpu_dtype(**kw) -> torch.dtype:
    return race_dtype(**kw)[0]
