"""Each model's one-token step, eager or compiled: chosen as `PairSpec.step` says, by measurement for `auto`.

The eager step is the model as the pair otherwise runs it (on a CPU: tuned kernels, the lean int4 draft step);
the compiled step is the loaded model compiled on a static cache (`compiled.with_compiled_step`). Which is faster
depends on the machine: on a GPU compiling removes the launch overhead that dominates a small draft's step, on
a CPU it may lose to hand-picked kernels. So `auto` times both for each model once, and keeps the answer per
machine, torch, thread count, dtype and model (beside the kernel tables): later loads compile only a model
whose compiled step won.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from specviz.models.compiled import StepTimes, measure_step, time_step, with_compiled_step
from specviz.models.kernel_table import KernelKey, read_keyed, table_path, write_keyed
from specviz.models.pair import ModelLoadError, ModelPair, PairSpec
from specviz.models.synthetic import prompt_ids

log = logging.getLogger(__name__)

Measure = Callable[[nn.Module, nn.Module, list[int]], StepTimes]
ROLES = ("draft", "target")


def compilable(model, spec: PairSpec, role: str) -> bool:
    """A Hugging Face causal LM as loaded (a quantized target's custom kernels are not compiled)."""
    return (model is not None and hasattr(model, "config") and hasattr(model, "generate")
            and not (role == "target" and spec.target_quant != "none"))


def probe_ids(model, n: int = 64) -> list[int]:
    """A prompt any model can read (what a step costs does not depend on its ids)."""
    return prompt_ids(n, model.config.get_text_config().vocab_size)


def step_key(eager: nn.Module, compiled: nn.Module, device: torch.device) -> KernelKey:
    """What a choice depends on: the machine (as a kernel table's), dtype and both models' module trees."""
    tree = hashlib.sha256(f"{eager!r}|{compiled!r}|{next(eager.parameters()).dtype}".encode()).hexdigest()[:20]
    return KernelKey.of([f"step:{tree}"], device, [1])


def measured_steps(eager: nn.Module, compiled: nn.Module, device: torch.device, measure: Measure = measure_step,
                   folder: Path | None = None, status: Callable[[str], None] = log.info) -> StepTimes | None:
    """Both steps' times for one model: from the cache where this machine measured them, else measured now; None
    where the step cannot be compiled here."""
    key = step_key(eager, compiled, device)
    path = table_path(key, folder).with_name(f"step-{key.digest()}.json")
    if (kept := read_keyed(path, key)) is not None:
        return StepTimes(**kept["times"])
    status("timing its eager and its compiled one-token step on this machine (once; cached)…")
    try:
        times = measure(eager, compiled, probe_ids(compiled))
    except Exception as e:  # noqa: BLE001 - whatever stops compiling here (no C compiler for Triton, an op it lacks)
        status(f"its step cannot be compiled here ({failure(e)}): it runs eager.")
        return None
    try:
        write_keyed(path, key, times=asdict(times))
    except OSError as e:  # a read-only cache: the choice stands, and is measured again at the next start
        log.warning("could not keep the step timings in %s: %s", path, e)
    return times


def failure(e: Exception) -> str:
    """An exception's first line, short: compilers raise pages."""
    line = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {line[:160]}"


def compiled_now(model: nn.Module, role: str) -> nn.Module:
    """`model` (a compiled step) compiled at once, so that a failure is a sentence at load, not a broken run; the
    seconds it took kept as `model.compile_s` (`specviz costs` reports them)."""
    t0 = time.perf_counter()
    try:
        time_step(model, probe_ids(model), reps=1, warmup=0)
    except Exception as e:  # noqa: BLE001 - see measured_steps
        raise ModelLoadError(f"the {role}'s one-token step could not be compiled here ({failure(e)}): use --step "
                             "eager or auto.") from e
    model.compile_s = time.perf_counter() - t0
    return model


def with_steps(loaded: ModelPair, eager: ModelPair, spec: PairSpec, status: Callable[[str], None] = log.info,
               measure: Measure = measure_step, folder: Path | None = None) -> ModelPair:
    """`eager` (the pair on its eager speed-ups) with each model's step as `spec.step` asks: compiled from the
    `loaded` model, or left as it is; for `auto`, whichever `measured_steps` found faster."""
    if spec.step == "eager":
        return eager
    chosen = {}
    for role in ROLES:
        model = getattr(loaded, role)
        if not compilable(model, spec, role):
            if spec.step == "compiled" and model is not None:
                raise ModelLoadError(f"the {role} runs on custom kernels (--target-quant {spec.target_quant}) that "
                                     "are not compiled: use --step eager or --target-quant none.")
            continue
        compiled = with_compiled_step(model)  # (compiled at its first call)
        if spec.step == "auto":
            times = measured_steps(getattr(eager, role), compiled, loaded.device, measure, folder,
                                   lambda line: status(f"The {role}: {line}"))
            if times is None or not times.compiled_wins:
                continue
        else:
            status(f"Compiling the {role}'s one-token step…")
            compiled_now(compiled, role)
        status(f"The {role}'s one-token step runs compiled.")
        chosen[role] = compiled
    names = {f"{role}_name": f"{getattr(loaded, f'{role}_name')} [compiled step]" for role in chosen}
    return replace(eager, **chosen, **names)
