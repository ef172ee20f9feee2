"""The memory-bandwidth bound beside every step: how fast could this step be, here?

A one-token decode step of a model bigger than the caches reads every weight once, so it can take no less than
(bytes of weights read) / (memory bandwidth). The bandwidth is measured as STREAM's triad measures it
(a = b + s·c over arrays far larger than the caches, counted as three arrays moved), on the threads the run
uses; the best of a few passes, since a bound is what the machine can do, not what it did on average.
A step's fraction of its bound (bound / measured step) says how much of the machine a kernel uses: near 1,
only fewer bytes (a smaller dtype, quantized weights) make it faster.
"""

from __future__ import annotations

import time

import torch

TRIAD_BYTES = 256 * 2**20  # per array: far beyond any last-level cache


def triad_bandwidth(array_bytes: int = TRIAD_BYTES, passes: int = 5, device: torch.device | str = "cpu") -> float:
    """Bytes per second of the triad a = b + s·c in float32 on `device` (on a CPU, torch's threads; best of
    `passes`)."""
    from specviz.models.kernel_timing import sync

    device = torch.device(device)
    n = array_bytes // 4
    b, c = torch.rand(n, device=device), torch.rand(n, device=device)
    a = torch.empty(n, device=device)
    best = float("inf")
    for _ in range(passes + 1):  # the first pass faults the pages in
        sync(device)
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 3 * n * 4 / best


def step_bound(step_bytes: int, bandwidth: float, step_s: float) -> dict:
    """A step against its bound: the bytes it reads, the time they take at `bandwidth`, the fraction of it."""
    bound = step_bytes / bandwidth
    return {"weight_bytes": step_bytes, "bound_ms": round(1e3 * bound, 4), "step_ms": round(1e3 * step_s, 4),
            "fraction_of_bound": round(bound / step_s, 3)}


def anchors(cost, cost_pair, bandwidth: float, tuning) -> dict:
    """The bench report's anchors: the measured bandwidth, each model's step against its bound, and where the
    target's kernel table came from (`tuning`; None: the kernels as loaded)."""
    from torch import nn

    from specviz.models.resident import step_bytes

    steps = {}
    if cost is not None:  # (a 'self' drafter's step is the target's first layers: no weights of its own)
        steps = {"target": step_bound(step_bytes(cost_pair.target), bandwidth, cost.target_step_s),
                 **({"draft": step_bound(step_bytes(cost_pair.draft), bandwidth, cost.draft_step_s)}
                    if isinstance(cost_pair.draft, nn.Module) else {})}
    return {"bandwidth_gb_s": round(bandwidth / 1e9, 2), **steps,
            "kernel_table": None if tuning is None else {
                "path": str(tuning.path), "cached": tuning.cached,
                "one_row": {shape: [plan[1].kernel, plan[1].rows] for shape, plan in tuning.plans.items()},
                "verify_9": {shape: [plan[9].kernel, plan[9].rows]
                             for shape, plan in tuning.plans.items() if 9 in plan},
                # per shape: what one copy of the weight costs at a race's widths (0: the fastest plan needs one)
                "one_copy_cost": {shape: round(x, 4) for shape, x in tuning.one_copy_cost.items()}}}
