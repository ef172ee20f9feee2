"""Each model's one-token step, eager or compiled: chosen as `PairSpec.step` says, by measurement for `auto`.

The eager step is the model as the pair otherwise runs it (on a CPU: tuned kernels, the lean int4 draft step);
the compiled step is the loaded model compiled on a static cache (`compiled.with_compiled_step`). Which is faster
depends on the machine: on a GPU compiling removes the launch overhead that dominates a small draft's step, on
a CPU it may lose to hand-picked kernels. So `auto` times both for each model once, and keeps the answer per
machine, torch, thread count, dtype and model (beside the kernel tables): later loads compile only a model
whose compiled step won, by more than a margin no repeated probe crosses by noise (`STEP_MARGIN`), and held when
timed as a run uses it (`in_use_problem`). A target's verify runs compiled (padded to `VERIFY_WIDTHS`) only
beside its compiled step, at the widths where it too won by the margin (`StepTimes.verify_widths`). The first races check the choice again
(`checked_in_use`): a compiled step that loses in use is dropped, said in one sentence.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from specviz.models.compiled import SIZES, VERIFY_WIDTHS, with_compiled_step
from specviz.models.invariant_gpu import on_triton
from specviz.models.step_timing import (FLAT_FLOOR, STEP_MARGIN, StepTimes, consecutive_step, measure_step, time_step,
                                        wide_forward)
from specviz.models.kernel_table import KernelKey, kept_or_measured, table_path
from specviz.models.pair import ModelLoadError, ModelPair, PairSpec
from specviz.models.synthetic import prompt_ids

log = logging.getLogger(__name__)
T = TypeVar("T")

Measure = Callable[[nn.Module, nn.Module, list[list[int]]], StepTimes]
ROLES = ("draft", "target")
# the contexts the probe times each step at: a prompt just read, and one with its reply, inside the first static
# size (a run's usual span)
PROBE_LENGTHS = (64, 384)


@dataclass(frozen=True)
class InUse:
    """A compiled step timed as a run uses it: one-token steps one after another, the cache growing, and (for
    the target) a 2-token forward on the path its verify takes."""

    step_s: float
    wide_s: float | None = None


InUseMeasure = Callable[[nn.Module, list[int], bool], InUse]


def in_use(compiled: nn.Module, ids: list[int], wide: bool) -> InUse:
    return InUse(consecutive_step(compiled, ids), wide_forward(compiled, ids) if wide else None)


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


def in_use_problem(times: StepTimes, used: InUse, margin: float = STEP_MARGIN) -> str | None:
    """Why a compiled step that won its probe does not hold in use (None: it holds): it is no longer faster than
    the eager step by the margin, or a wider forward costs less than it (the target alone would not be on its
    fastest one-token path, and every speedup over it inflated)."""
    if used.step_s > (1 - margin) * times.eager_s:
        return (f"in use it took {ms(used.step_s)} a token against {ms(times.eager_s)} eager (its probe: "
                f"{ms(times.compiled_s)})")
    if used.wide_s is not None and used.wide_s < FLAT_FLOOR * used.step_s:
        return f"a 2-token forward ({ms(used.wide_s)}) cost less than its one-token step ({ms(used.step_s)})"
    return None


def compilable(model, spec: PairSpec, role: str) -> bool:
    """A Hugging Face causal LM as loaded (a quantized target's custom kernels are not compiled; a draft read as its
    codes, `draft.store`, has no dense step to compile: its lean step is its step)."""
    from specviz.models.draft.store import CodedLinear

    return (model is not None and hasattr(model, "config") and hasattr(model, "generate")
            and not (role == "target" and spec.target_quant != "none")
            and not any(isinstance(m, CodedLinear) for m in model.modules()))


def probe_ids(model, n: int = PROBE_LENGTHS[0]) -> list[int]:
    """A prompt any model can read (what a step costs does not depend on its ids)."""
    return prompt_ids(n, model.config.get_text_config().vocab_size)


def step_key(eager: nn.Module, compiled: nn.Module, device: torch.device) -> KernelKey:
    """What a choice depends on: the machine (as a kernel table's), dtype, both models' module trees and the
    probe's contexts."""
    tree = hashlib.sha256(f"{eager!r}|{compiled!r}|{next(eager.parameters()).dtype}".encode()).hexdigest()[:20]
    return KernelKey.of([f"step+verify widths:{tree}"], device, PROBE_LENGTHS)


def measured_steps(eager: nn.Module, compiled: nn.Module, device: torch.device, measure: Measure = measure_step,
                   folder: Path | None = None, status: Callable[[str], None] = log.info) -> StepTimes | None:
    """Both steps' times for one model: from the cache where this machine measured them, else measured now; None
    where the step cannot be compiled here."""
    key = step_key(eager, compiled, device)
    path = table_path(key, folder).with_name(f"step-{key.digest()}.json")

    def measured() -> dict:
        status("timing its eager and its compiled one-token step on this machine (once; cached)…")
        probes = [probe_ids(compiled, n) for n in PROBE_LENGTHS]
        return {"times": asdict(afresh_on_failure(lambda: measure(eager, compiled, probes), status))}
    try:  # (unsaved: used all the same)
        return StepTimes.of(kept_or_measured(path, key, "The step timings", measured, log.warning)[0]["times"])
    except Exception as e:  # noqa: BLE001 - whatever stops compiling here (no C compiler for Triton, an op it lacks)
        status(f"its step cannot be compiled here ({failure(e)}): it runs eager.")
        return None


def afresh_on_failure(compile_: Callable[[], T], status: Callable[[str], None]) -> T:
    """`compile_()`; where it fails, once more with torch's compile caches off. torch keeps compiled graphs in one
    folder for every process of the user (/tmp/torchinductor_$USER), not keyed on the vector instructions the
    process found usable: where its check of them fails (on this project's Zen 4 VM, 2026-11-27, the check's child
    Python started in a folder holding a `re.py` that hid the standard library's), the process takes vectorised
    kernel code another process cached and compiles it without the vector flags, and every compile of both embedded
    models' steps failed. Compiled afresh, it succeeds (as the code this process would run, which the probe then
    times). Where that second try succeeds, the caches stay off for the rest of this process (a width compiled later
    in a run would meet the same entry), said in one sentence; where it fails too, the second failure is raised."""
    try:
        return compile_()
    except Exception as first:  # noqa: BLE001 - see measured_steps
        if torch.compiler.config.force_disable_caches:
            raise
        with torch.compiler.config.patch(force_disable_caches=True):
            result = compile_()
        torch.compiler.config.force_disable_caches = True
        status(f"compiling failed with torch's compile caches ({failure(first)}) and succeeded without them: this "
               f"process compiles without them (clearing {inductor_cache()} lets them serve again).")
        return result


def inductor_cache() -> str:
    """The folder torch's compile caches are kept in."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def failure(e: Exception) -> str:
    """An exception's first line, short: compilers raise pages. A line that ends in a colon is followed by the next
    (torch's wrapper of a backend's error says only "backend='inductor' raised:", the next line says what)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [""]
    said = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return f"{type(e).__name__}: {said[:160]}"


def compiled_now(model: nn.Module, role: str, status: Callable[[str], None] = log.info) -> nn.Module:
    """`model` (a compiled step) compiled at once, so that a failure is a sentence at load, not a broken run; the
    seconds it took kept as `model.compile_s` (`specviz costs` reports them)."""
    t0 = time.perf_counter()
    try:
        afresh_on_failure(lambda: time_step(model, probe_ids(model), reps=1, warmup=0), status)
    except Exception as e:  # noqa: BLE001 - see measured_steps
        raise ModelLoadError(f"the {role}'s one-token step could not be compiled here ({failure(e)}): use --step "
                             "eager or auto.") from e
    model.compile_s = time.perf_counter() - t0
    return model


def decided(times: StepTimes | None) -> str:
    """What the probe decided, in a clause."""
    if times is None:
        return "it runs eager"
    verdict = "runs compiled" if times.compiled_wins else (
        f"stays eager (compiling must win by more than {STEP_MARGIN:.0%})")
    return f"eager {ms(times.eager_s)}, compiled {ms(times.compiled_s)}: it {verdict}"


def verify_decided(times: StepTimes) -> str:
    """What the probe decided for the verify, in a sentence."""
    if not times.verify:
        return "The target's verify stays eager (not measured)."
    each = "; ".join(f"{w} tokens: eager {ms(e)}, compiled {ms(c)}" for w, e, c in times.verify)
    kept = times.verify_widths
    return (f"The target's verify runs compiled at {', '.join(map(str, kept))} tokens ({each})." if kept else
            f"The target's verify stays eager ({each}; compiling must win by more than {STEP_MARGIN:.0%}).")


def wide_model(loaded: nn.Module, eager: nn.Module) -> nn.Module | None:
    """What a compiled target runs its wider forwards (prompt, verify) on: the eager target where it is the loaded
    one on tuned kernels (a Hugging Face model still, on the same static cache)."""
    return eager if eager is not loaded and hasattr(eager, "generate") else None


@dataclass(frozen=True)
class Probe:
    """How `auto` decides a model's step: timing both (`measure`, once per machine, kept in `folder`: beside the
    kernel tables by default) and checking a compiled step that won as a run uses it (`check`). Tests give theirs."""

    measure: Measure = measure_step
    check: InUseMeasure = in_use
    folder: Path | None = None


def with_steps(loaded: ModelPair, eager: ModelPair, spec: PairSpec, status: Callable[[str], None] = log.info,
               probe: Probe = Probe(), roles: tuple[str, ...] = ROLES, sizes: tuple[int, ...] | None = None
               ) -> ModelPair:
    """`eager` (the pair on its eager speed-ups) with each model's step as `spec.step` asks: compiled from the
    `loaded` model, or left as it is; for `auto`, compiled only where the `probe` found it faster by the margin and
    it held when timed as a run uses it (`kept_by_probe`): otherwise eager, said in one sentence. The pair keeps
    `eager` (`ModelPair.eager_steps`), for a check in use to fall back on. `sizes`: the static caches' sizes
    (default `SIZES`; a measurement that knows its runs' length compiles only the one they use)."""
    if spec.step == "eager":
        return eager
    chosen = {}
    for role in roles:
        model = getattr(loaded, role)
        if not compilable(model, spec, role):
            if spec.step == "compiled" and model is not None:
                raise ModelLoadError(f"the {role} runs on custom kernels (--target-quant {spec.target_quant}) that "
                                     "are not compiled: use --step eager or --target-quant none.")
            continue
        plain = getattr(eager, role)
        target = role == "target"  # (a target verifies: its verify may run compiled too)
        if on_triton(plain):  # a GPU's target on the Triton kernels: that copy compiles, its rows in their one order
            model = plain
        compiled = with_compiled_step(model, sizes or SIZES, wide=wide_model(model, plain) if target else None,
                                      widths=VERIFY_WIDTHS if target else ())
        if spec.step == "compiled":
            status(f"Compiling the {role}'s one-token step…")
            compiled_now(compiled, role, lambda line: status(f"The {role}: {line}"))
        elif not kept_by_probe(compiled, plain, role, loaded.device, probe, status):
            continue
        status(f"The {role}'s one-token step runs compiled.")
        chosen[role] = compiled
    if not chosen:
        return eager
    names = {f"{role}_name": f"{getattr(eager, f'{role}_name')} [compiled step]" for role in chosen}
    variant = {"not_invariant": "its one-token step runs compiled (torch.compile's own kernels)"} \
        if "target" in chosen and not on_triton(eager.target) else {}
    return replace(eager, **chosen, **names, **variant, eager_steps=eager)


def kept_by_probe(compiled: nn.Module, plain: nn.Module, role: str, device: torch.device, probe: Probe,
                  status: Callable[[str], None]) -> bool:
    """`auto`'s choice for one model: keep `compiled` where `measured_steps` found it faster than `plain` by the
    margin and it held in use (`in_use_problem`); each verdict said in one sentence. A target's verify widths are
    set from the same probe."""
    times = measured_steps(plain, compiled, device, probe.measure, probe.folder,
                           lambda line: status(f"The {role}: {line}"))
    if times is None or not times.compiled_wins:
        status(f"The {role}'s one-token step: {decided(times)}.")
        return False
    if role == "target":  # (a draft verifies nothing)
        compiled.verify_widths = times.verify_widths
        status(verify_decided(times))
    problem = in_use_problem(times, probe.check(compiled, probe_ids(compiled, PROBE_LENGTHS[-1]), role == "target"))
    if problem:
        status(f"The {role}'s compiled step won its probe ({decided(times)}) but not in use: {problem}; it runs "
               "eager.")
        return False
    compiled.step_probe = times  # for the check in use (`checked_in_use`)
    return True


def checked_in_use(pair: ModelPair, step_s: float) -> tuple[ModelPair, str | None]:
    """`pair` as it should run on after its target alone took `step_s` a token in a run: where `auto` chose a
    compiled target step that did not hold (`in_use_problem`; no margin here, since a run's step also pays for
    sampling and its event, which the probe's eager forward does not), the same pair on its eager target step,
    and the sentence that says so; otherwise `pair` and None."""
    times = getattr(pair.target, "step_probe", None)
    if times is None or pair.eager_steps is None:
        return pair, None
    problem = in_use_problem(times, InUse(step_s), margin=0.0)
    if problem is None:
        return pair, None
    back = pair.eager_steps
    return (replace(pair, target=back.target, target_name=back.target_name),
            f"The target's compiled one-token step did not hold in this run ({problem}): this run's speed is "
            "not reported, and the target runs eager from now on.")
