"""The target as both lanes run it: its precision (`PairSpec.target_quant`) and its kernels (`PairSpec.kernels`).

Both lanes, the target alone and the speculative verify, call this one model, so exactness holds against
it whatever it is: a quantized target computes other logits than the loaded one, and greedy identity
and the statistical tests hold against the quantized target, in both lanes.

Precision is the economics of the race. A bf16 target and an int4 draft step (c ~ 0.1 of a target step)
is what a GPU serving a large target sees; an int4 target beside the same draft (c ~ 0.6) is what a CPU
engine such as llama.cpp runs, and there speculation with this pair loses. Racing both shows when it pays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from specviz.models.copies import swapped
from specviz.kernels import pages, rows, w4a8
from specviz.models import invariant_gpu
from specviz.models.draft.lean import fused_step
from specviz.models.draft.quantized import DraftQuant, quantize_linear
from specviz.models.kernels import Tuning, tune, w4a8_products
from specviz.models.resident import release_unused_codes, uses

log = logging.getLogger(__name__)


def tunable(device: torch.device) -> bool:
    """Where kernels are chosen by measurement: CPUs (on a GPU the loaded model's kernels are kept)."""
    return device.type == "cpu"


@torch.no_grad()
def quantize_target(model: nn.Module, quant: DraftQuant) -> nn.Module:
    """A copy of a causal LM with every linear (the head too) in weight-only int4/int8, for every number of rows:
    no dense fallback, so the prompt, the one-token steps and the verifies all use the same weights."""
    return swapped(model, lambda m: quantize_linear(m, quant.bits, quant.group_size, keep_dense=False)
                   if type(m) is nn.Linear else None).eval()


def with_target(pair, quant: str = "none", kernels: str = "tuned", status: Callable[[str], None] = log.info,
                invariant: bool = False, **tune_kw) -> tuple[object, Tuning | None]:
    """`pair` with its target at the precision and on the kernels asked for (the loaded model untouched, its
    weights shared where they are not quantized), named so, and the kernel measurements (None: not tuned).
    `invariant`: its verify's rows computed as its one-token steps compute them (`row_invariant`), where this
    machine can; where it cannot, why, said once and kept (`ModelPair.not_invariant`)."""
    from specviz.models.pair import ModelLoadError

    target, name = pair.target, pair.target_name
    if quant != "none":
        if pair.device.type != "cpu":
            raise ModelLoadError(f"--target-quant {quant} runs on a CPU only (torch's weight-only CPU kernels); on "
                                 f"{pair.device} use --target-quant none.")
        status(f"Quantizing the target's weights to {quant}…")
        target, name = quantize_target(target, DraftQuant.named(quant)), f"{name} [{quant} weights]"
    tuning = None
    if kernels == "tuned" and tunable(pair.device):
        target, tuning = tune(target, status=status, invariant=invariant, **tune_kw)
        release_unused_codes(target)  # (a 4-bit target: the packing of the kernel its plan uses)
        name = f"{name} [tuned kernels]"
    why = variant_reason(pair, tuning, kernels) if invariant else "it was not asked for (--no-invariant)"
    if why is None and tunable(pair.device):
        rows.register()
        target.config._attn_implementation = rows.ROWS  # (a copy's own config: the loaded model keeps SDPA)
    elif why is None:  # a GPU: the copy on Triton's row-invariant kernels
        target, name = invariant_gpu.invariant(target), f"{name} [row-invariant kernels]"
    elif invariant:
        status(f"The target's verify is not made row-invariant here: {why}; greedy speculation may then part from "
               "the target alone at a near-tie.")
    return replace(pair, target=target, target_name=name, not_invariant=why), tuning


def variant_reason(pair, tuning: Tuning | None, kernels: str = "tuned") -> str | None:
    """Why the target's verify rows cannot be computed as its one-token steps are here (None: they can): every
    linear on an invariant kernel (`kernels.INVARIANT`) and attention a row at a time (`kernels.rows`); on a GPU,
    the Triton kernels (`invariant_gpu`)."""
    if not tunable(pair.device):
        why = "--kernels plain asked for them" if kernels != "tuned" else invariant_gpu.missing(pair.target,
                                                                                                 pair.device, pair.dtype)
        return None if why is None else f"on {pair.device.type} the loaded model's own kernels run: {why}"
    if tuning is None:
        return "its kernels are torch's own (--kernels plain)"
    if tuning.variant:  # (an int8 target's, or an int4 one's without the int4 x 8-bit kernel)
        quantized = all(shape.startswith(("int4:", "int8:")) for shape in tuning.variant)
        return (f"no invariant kernel serves its {', '.join(tuning.variant)} linears ("
                + ("torch's weight-only quantized kernels do not keep a row's sums in one order)" if quantized
                   else "the few-row kernel is not built here)"))
    if not rows.available(pair.dtype):
        return f"the row-invariant attention cannot run in {str(pair.dtype).removeprefix('torch.')} here"
    return None


StepTimer = Callable[[nn.Module, nn.Module], tuple[float, float]]


def time_steps(a: nn.Module, b: nn.Module, rounds: int = 3) -> tuple[float, float]:
    """Both models' one-token steps (median seconds), timed in turn `rounds` times: a slow spell falls on both."""
    import statistics

    from specviz.models.step_timing import forward_times

    vocab = a.config.get_text_config().vocab_size
    ids = [(7 + 31 * i) % vocab for i in range(64)]
    times = ([], [])
    for _ in range(rounds):
        for model, kept in zip((a, b), times):
            kept.extend(forward_times(model, ids, reps=5, warmup=2))
    return statistics.median(times[0]), statistics.median(times[1])


def with_tuned_draft(pair, status: Callable[[str], None] = log.info, step_timer: StepTimer = time_steps,
                     **tune_kw):
    """`pair` with its draft's linears (a lean draft's quantized ones, or the loaded draft's) on tuned kernels. Where
    the plan uses the 4-bit x 8-bit kernel, the draft's whole step is timed with it and without it (the same table),
    and the faster kept: a kernel faster alone can be slower in the step (its activation quantization, the caches),
    said in one sentence either way."""
    if pair.draft is None or not tunable(pair.device) or not isinstance(pair.draft, nn.Module):
        return pair
    codes_on_huge_pages(pair.draft)
    draft, _ = tune(pair.draft, status=status, **tune_kw)
    if uses(draft, "w4a8"):
        plain, _ = tune(pair.draft, status=status, exclude=frozenset({"w4a8"}), **tune_kw)
        with_it, without = step_timer(draft, plain)
        keep = with_it < without
        status(f"The draft's step on the 4-bit x 8-bit kernel: {1e3 * with_it:.1f} ms, on torch's int4 kernel "
               f"{1e3 * without:.1f} ms: {'kept' if keep else 'dropped'}.")
        draft = draft if keep else plain
        if keep:
            draft = prefetch_or_not(draft, tune(pair.draft, status=status, **tune_kw)[0], step_timer, status)
    release_unused_codes(draft)
    codes_on_huge_pages(draft)
    return replace(pair, draft=draft)


def codes_on_huge_pages(draft: nn.Module) -> None:
    """The draft's 4-bit x 8-bit codes, those its linears hold and its products read, moved into one buffer on huge
    pages (`kernels.pages`), and all that reads them pointed at the copies: its products, their linears, and its fused
    step (made afresh, asking as far ahead). Before the draft is tuned (its steps are timed as they will run) and
    again once its plan dropped the codes it does not use (the buffer then holds only what is read)."""
    holders = [m for m in draft.modules() if getattr(m, "w4a8_packed", None) is not None]
    products = w4a8_products(draft)
    unique = {id(t): t for t in [*(m.w4a8_packed for m in holders), *(p.packed for p in products)]}
    moved = dict(zip(unique, pages.gathered(list(unique.values()))))
    for product in products:
        product.packed = moved[id(product.packed)]
    for module in holders:
        module.w4a8_packed = moved[id(module.w4a8_packed)]
    if (old := draft.__dict__.get("_fused")) is not None:  # (`LeanDraft.fused`, made while the step was timed)
        draft.__dict__["_fused"] = fresh = fused_step(draft)
        if fresh is not None:
            fresh.prefetch = old.prefetch


def prefetch_or_not(draft: nn.Module, twin: nn.Module, step_timer: StepTimer, status: Callable[[str], None]):
    """`draft` or `twin` (the same plan), asking for its codes as far ahead of its reads (one of `w4a8.PREFETCH`, or
    not at all) as steps fastest here, each reach timed against the fastest so far: a CPU's prefetchers may already
    keep up, and how far is enough depends on the CPU and its pages."""
    best, reach = draft, 0
    for far in w4a8.PREFETCH:
        on, off = step_timer(prefetched(twin, far), best)
        before = f"{reach // 1024} KB ahead" if reach else "left to the CPU's prefetchers"
        status(f"The draft's codes asked for {far // 1024} KB ahead: {1e3 * on:.1f} ms a step, {before} "
               f"{1e3 * off:.1f} ms: {'asked' if on < off else 'left'}.")
        if on < off:
            best, twin, reach = twin, best, far
    return best


def prefetched(draft: nn.Module, reach: int) -> nn.Module:
    """`draft` with every 4-bit x 8-bit product (its fused step's too) asking for its codes `reach` bytes ahead."""
    for product in w4a8_products(draft):
        product.prefetch = reach
    if (step := getattr(draft, "fused", lambda: None)()) is not None:
        step.prefetch = reach
    return draft
