"""Measure the prediction model's costs on the device: T1, the draft step, the verify-cost curve.

Each model gets its own fresh KV cache holding a real prompt; every timed forward is cropped
back off, so all are measured at the same context length. Repetitions are interleaved across n
and the median kept, so a burst of machine noise does not bend the curve.
"""

from __future__ import annotations

import statistics

import torch

from specviz.bench.noise import calmest, timed
from specviz.analysis.predict import CostModel
from specviz.compat import forward
from specviz.engine.plumbing import clock, new_cache, rollback


def _forward_times(model, prompt_ids: list[int], sizes: list[int], reps: int, device) -> dict[int, float]:
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    cache = new_cache(model)
    forward(model, ids, cache, 1)
    keep = ids.shape[1]
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(reps + 1):  # the first pass warms up and is dropped
        for n in sizes:
            feed = ids[:, -n:] if n <= keep else ids[:, :1].repeat(1, n)
            t0 = clock(device)
            forward(model, feed, cache, n).logits.float()
            t1 = clock(device)
            rollback(cache, keep)
            if rep:
                times[n].append(t1 - t0)
    return {n: statistics.median(ts) for n, ts in times.items()}


@torch.inference_mode()
def measure_costs_once(pair, prompt_ids: list[int], max_verify: int, reps: int = 9) -> CostModel:
    """T_verify(n) for n = 1..max_verify, T1 = T_verify(1), and the draft's one-token step."""
    sizes = list(range(1, max_verify + 1))
    verify = _forward_times(pair.target, prompt_ids, sizes, reps, pair.device)
    # a draft of another family reads the prompt in its own tokens
    draft_ids = prompt_ids if pair.vocab_map is None else pair.vocab_map.translate(prompt_ids, [])
    draft = _forward_times(pair.draft, draft_ids, [1], reps, pair.device)
    return CostModel(target_step_s=verify[1], draft_step_s=draft[1], verify_s=tuple(verify[n] for n in sizes))


def measure_costs(pair, prompt_ids: list[int], max_verify: int, reps: int = 9, max_stall: float = 0.05,
                  retries: int = 2) -> tuple[CostModel, float | None]:
    """`measure_costs_once`, again while another process disturbed it; the calmest try and its stall."""
    def once() -> tuple[CostModel, float | None]:
        cost, _, stall = timed(lambda: measure_costs_once(pair, prompt_ids, max_verify, reps), pair.device)
        return cost, stall

    best, _ = calmest(once, lambda m: m[1], max_stall, retries)
    return best
