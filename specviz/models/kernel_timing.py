"""Timing the candidate kernels of a linear shape (`kernels.tune` measures its table with `time_group`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch

from specviz.models.kernel_table import Costs

Kernel = Callable[[torch.Tensor], torch.Tensor]  # 2-D input rows -> 2-D output rows, bias included


def sync(device: torch.device) -> None:
    """Wait for the device: CUDA runs asynchronously, so a clock read before its work is done reads too early."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_group(group: list[dict[str, Kernel]], width: int, dtype: torch.dtype, device: torch.device,
               row_counts: Iterable[int], reps: int = 5) -> Costs:
    """Seconds for one pass of n rows through every linear of `group` in turn (so the weights come from memory,
    as in a forward), per kernel and row count: the median of `reps` passes, interleaved, after a warm-up."""
    row_counts = list(row_counts)
    xs = {n: torch.randn(n, width, dtype=dtype, device=device) for n in row_counts}
    names = list(group[0])
    samples: dict[str, dict[int, list[float]]] = {k: {n: [] for n in row_counts} for k in names}
    with torch.inference_mode():
        for rep in range(reps + 1):  # the first pass warms up and is dropped
            for n in row_counts:
                for k in names:
                    sync(device)
                    t0 = time.perf_counter()
                    for kernels in group:
                        kernels[k](xs[n])
                    sync(device)
                    if rep:
                        samples[k][n].append(time.perf_counter() - t0)
    return {k: {n: statistics.median(ts) / len(group) for n, ts in per.items()} for k, per in samples.items()}


Timer = Callable[[list[dict[str, Kernel]], int, torch.dtype, torch.device, list[int]], Costs]
