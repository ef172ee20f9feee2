"""Timing a model's one-token step, eager and compiled, the way a run uses it: what `models.steps` chooses by.

Every timing is on the cache the engine would give the model (a compiled model's static cache, from its pool),
at the contexts runs reach, with the device synchronised around each forward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from specviz.models.kernel_timing import sync
from specviz.compat import forward

# The compiled step replaces the eager one only when faster by more than this: on a 2-core Zen 4 the probe chose
# a compiled step that had won by 0.4 % and 0.9 % (noise), which then cost 1.25-1.4x the eager step in the race.
STEP_MARGIN = 0.05
# A wider forward cheaper than this fraction of a one-token step means the one-token step is not the model's
# fastest (any kernel can run one row as two): a target alone timed on it would inflate every speedup.
FLAT_FLOOR = 0.95


@dataclass(frozen=True)
class StepTimes:
    """One model's one-token step, eager (as the pair otherwise runs it) and compiled, in seconds."""

    eager_s: float
    compiled_s: float
    compile_s: float  # the compilation itself, paid once per process
    # a target's verify at each width: (tokens, eager seconds, compiled seconds)
    verify: tuple[tuple[int, float, float], ...] = ()

    @property
    def compiled_wins(self) -> bool:
        return self.compiled_s < (1 - STEP_MARGIN) * self.eager_s

    @property
    def verify_widths(self) -> tuple[int, ...]:
        """The verify widths to compile: the narrowest ones, in order, each faster compiled by the margin (a verify
        is padded to the first width that holds it, so a narrow width that loses would send short verifies to a
        wide one: the widths stop there)."""
        kept = []
        for width, eager_s, compiled_s in sorted(self.verify):
            if compiled_s >= (1 - STEP_MARGIN) * eager_s:
                break
            kept.append(width)
        return tuple(kept)

    @staticmethod
    def of(fields: dict) -> StepTimes:
        """From a kept measurement (JSON lists back to tuples)."""
        return StepTimes(**{**fields, "verify": tuple(tuple(v) for v in fields.get("verify", ()))})


def forward_times(model: nn.Module, prompt_ids: list[int], n: int = 1, reps: int = 9, warmup: int = 3,
                  crop: bool = True) -> list[float]:
    """Seconds of n-token forwards after a prompt, on the cache the engine would give the model (static for a
    compiled one): each cropped back off (so all at one length), or, with `crop=False`, one after another, the
    cache growing as in a run."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    times = []
    with torch.inference_mode():
        cache = getattr(model, "new_cache", DynamicCache)()
        forward(model, ids, cache, 1)
        for rep in range(warmup + reps):
            sync(device)
            t0 = time.perf_counter()
            forward(model, ids[:, -n:], cache, n).logits.float()
            sync(device)
            t1 = time.perf_counter()
            if crop:
                cache.crop(-n)
            if rep >= warmup:
                times.append(t1 - t0)
    return times


def time_step(model: nn.Module, prompt_ids: list[int], reps: int = 9, warmup: int = 3) -> float:
    """Median seconds of one-token forwards after a prompt, each cropped back off."""
    return statistics.median(forward_times(model, prompt_ids, reps=reps, warmup=warmup))


def measure_step(eager: nn.Module, compiled: nn.Module, prompts: list[list[int]],
                 timer: Callable[..., float] = time_step) -> StepTimes:
    """Both steps of one model, the mean over `prompts` (the context lengths runs reach: an eager step's cost grows
    with its context, a static cache's attends over its whole size at every one), each prompt's two timings back to
    back, so that a slow spell of the machine falls on both. The first compiled call (the compilation) is timed
    apart."""
    t0 = time.perf_counter()
    timer(compiled, prompts[0], reps=1, warmup=0)
    compile_s = time.perf_counter() - t0
    eager_s = compiled_s = 0.0
    for ids in prompts:
        eager_s += timer(eager, ids) / len(prompts)
        compiled_s += timer(compiled, ids) / len(prompts)
    times = StepTimes(eager_s=eager_s, compiled_s=compiled_s, compile_s=compile_s)
    if not times.compiled_wins:  # the verify runs compiled only beside a compiled step: no graphs compiled for it
        return times
    # a target's verify at each width too, eager (as the pair runs it) and compiled
    verify = tuple((n, sum(wide_forward(eager, ids, n) for ids in prompts) / len(prompts),
                    sum(wide_forward(compiled, ids, n) for ids in prompts) / len(prompts))
                   for n in getattr(compiled, "verify_widths", ()))
    return replace(times, verify=verify)


@dataclass(frozen=True)
class StepReference:
    """Each model's one-token step as timed warm right after a load, in seconds (None: no draft model): what a
    race's lanes should take a token when nothing else uses the machine (`runs.race.stray_note`)."""

    target_s: float
    draft_s: float | None = None


REFERENCE_CONTEXT = 64  # tokens before the timed steps: a prompt just read, as a race's first steps see it


def reference_steps(target: nn.Module, draft: nn.Module | None, reps: int = 5) -> StepReference:
    """Both models' one-token steps (median of `reps`, after two untimed), on the path a run takes (what a step
    costs does not depend on the ids it reads)."""
    def step(model: nn.Module) -> float:
        vocab = model.config.get_text_config().vocab_size
        return time_step(model, [(7 + 31 * i) % vocab for i in range(REFERENCE_CONTEXT)], reps=reps, warmup=2)
    return StepReference(step(target), step(draft) if draft is not None else None)


def consecutive_step(model: nn.Module, prompt_ids: list[int], steps: int = 16) -> float:
    """Median seconds of one-token forwards one after another, the cache growing, as a run makes them (the probe
    crops each back off): a compiled step is re-checked this way before it is kept."""
    return statistics.median(forward_times(model, prompt_ids, reps=steps, warmup=2, crop=False))


def wide_forward(model: nn.Module, prompt_ids: list[int], n: int = 2, reps: int = 5) -> float:
    """Median seconds of an n-token forward after the prompt: T(n) on the path a verify takes."""
    return statistics.median(forward_times(model, prompt_ids, n=n, reps=reps, warmup=1))
