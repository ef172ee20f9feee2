"""Each linear's kernel, chosen per number of rows by measurement on this machine.

A decode step multiplies one row by every weight; a verify multiplies K + 1 rows; reading a prompt,
hundreds. Which kernel is fastest for each depends on the machine, and the differences are large:
on one CPU MKL's sgemm read the weights again for every few rows (a staircase: 9 rows cost 3x one),
on another a one-row bf16 product cost 1.3-1.8x a two-row one, and oneDNN on weights packed once was
the fastest for every row count in float32. A rule written on one machine was backwards on the next,
so nothing is assumed: at load every distinct linear shape is timed for each row count the engine
uses, on each candidate kernel, and each row count goes to the fastest. A row count may also run
*padded* to a larger one (the extra rows are copies, dropped after) where that is faster, so no row
count ever costs more than a larger one: the target alone gets the machine's fastest one-token path.

The candidates compute the same product from the same weights (only the summation order differs):
- `dense`: the module's own call (torch's default CPU kernel for the dtype);
- `native`: the same call with oneDNN switched off, so torch's own kernel runs (on one Zen 4 its one-row bf16
  product, `bf16_gemv_trans`, read the weights at 0.72-0.75 of the bandwidth; oneDNN's took twice as long);
- `onednn`: oneDNN on a copy of the weight packed once at load (CPU, float32 and bfloat16);
- `streamed`: specviz's own kernel on a copy of the weight laid out for it (`streamed.py`: one pass over the weight
  for a verify's few rows, a block at a time for a prompt's many; where the CPU has AVX-512 and a C++ compiler is
  at hand), and its other ways on the same copy: `widened` (bf16 weights multiplied in float32 FMAs) and each
  `_ahead` (the weight asked for before it is read);
- `amx` (and `amx_ahead`): specviz's tile kernel on that same copy (`amx.py`: bf16 on a CPU with AMX);
- `int4` / `int8`: a weight-only quantized linear's own kernel (a quantized target or draft step).

`dense` and `native` multiply by the weight as loaded; `onednn` and `streamed` by a copy of their own (made when
a plan first uses them). Which kernel serves which row count, keeping one copy of each weight where the race can
afford it: `plans`.

The measured table is cached per machine (`kernel_table.KernelKey`: CPU model and flags, threads, torch
version, dtype, the model's shapes) and re-measured when any of these change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from specviz.models.copies import shared_copy
from specviz.kernels import amx, streamed, w4a8
from specviz.models.draft.quantized import DENSE_ABOVE, Int4Linear, Int8Linear, QuantLinear
from specviz.models.kernel_table import Costs, KernelKey, kept_or_measured, table_costs, table_path
from specviz.models.kernel_timing import Kernel, Timer, time_group
from specviz.models.onednn import OneDNN, WithoutOneDNN, onednn_applies
from specviz.models.plans import MAX_PAD_ROWS, Choice, choose, lean_plans, lookup, plan_cost, prompt_plan, sizes

log = logging.getLogger(__name__)

# kernels whose every row's sums run in one order whatever the number of rows (streamed.cpp and w4a8.cpp say how),
# each with its way of summing: a target that must verify as its one-token steps compute (`tune(invariant=True)`) is
# planned on those of one way alone (an int4 target's on the int4 x 8-bit kernel: a row's 8-bit activations are its own)
SUMS = {**streamed.SUMS, **amx.SUMS, "w4a8": "w4a8"}
INVARIANT = frozenset(SUMS)
GROUP_BYTES = 64 * 2**20  # time a shape over enough of its linears to leave the caches, as the model does


def run_padded(kernel: Kernel, x2: torch.Tensor, rows: int) -> torch.Tensor:
    n = x2.shape[0]
    if rows == n:
        return kernel(x2)
    return kernel(torch.cat([x2, x2[-1:].expand(rows - n, -1)]))[:n]


def kernels_of(module: nn.Module) -> dict[str, Kernel]:
    """The candidate kernels for one linear-like module, each computing its product from its own weights."""
    if isinstance(module, QuantLinear):
        bias = module.bias
        kernels = {kind_of(module): module.matmul}
        if getattr(module, "w4a8_packed", None) is not None and (lib := w4a8.library()) is not None:
            kernels["w4a8"] = w4a8.W4A8(module.w4a8_packed, module.out_features, module.in_features, lib)
        return kernels if bias is None else {k: WithBias(f, bias) for k, f in kernels.items()}
    weight, bias = module.weight, module.bias
    kernels: dict[str, Kernel] = {"dense": lambda x: F.linear(x, weight, bias)}
    if onednn_applies(weight):
        kernels["native"] = WithoutOneDNN(weight, bias)
        kernels["onednn"] = OneDNN(weight, bias)
    packing = streamed.Packing(weight)  # one copy in streamed.cpp's layout, for every kernel that reads it
    if streamed.applies(weight) and (lib := streamed.library_for(weight)) is not None:
        kernels |= streamed.ways(weight, bias, lib, packing)
    if amx.applies(weight) and (lib := amx.library()) is not None:
        kernels |= amx.ways(weight, bias, lib, packing)
    return kernels


class WithBias:
    """A kernel's product plus the module's bias; the kernel stays reachable (`w4a8_products`)."""

    def __init__(self, kernel: Kernel, bias: torch.Tensor):
        self.kernel, self.bias = kernel, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x) + self.bias


def w4a8_products(model: nn.Module) -> list[w4a8.W4A8]:
    """Every 4-bit x 8-bit product a tuned `model`'s linears may call."""
    kernels = [getattr(k, "kernel", k) for m in model.modules() if isinstance(m, TunedLinear)
               for k in m.kernels.values()]
    return [k for k in kernels if isinstance(k, w4a8.W4A8)]


def kind_of(module: nn.Module) -> str:
    return "int4" if isinstance(module, Int4Linear) else "int8" if isinstance(module, Int8Linear) else "linear"


def activation_dtype(module: nn.Module) -> torch.dtype:
    """What its kernels multiply in: int4's kernel takes bf16 rows, the others the weights' (or scales') dtype."""
    if isinstance(module, Int4Linear):
        return torch.bfloat16
    return module.scales.dtype if isinstance(module, Int8Linear) else module.weight.dtype


def shape_key(module: nn.Module) -> str:
    """Linears of one key share a timing table: the kind of weights, the shape and the dtype multiplied in."""
    dtype = str(activation_dtype(module)).removeprefix("torch.")
    return f"{kind_of(module)}:{module.out_features}x{module.in_features}:{dtype}"


class TunedLinear(nn.Module):
    """A linear whose every call goes to the kernel measured fastest for its number of rows: on `plan`, or on
    `prompt` while the model reads a prompt (`PromptReading`; the same plan where none is given).

    A quantized draft linear that keeps its dense weights for long inputs (`QuantLinear.dense`, the prompt)
    still sends those there: that is a choice of weights, not of kernel, and it is the draft's own."""

    def __init__(self, module: nn.Module, plan: dict[int, Choice], kernels: dict[str, Kernel] | None = None,
                 prompt: dict[int, Choice] | None = None):
        super().__init__()
        self.inner = module  # its weights are shared with the loaded model, not copied
        kernels = kernels if kernels is not None else kernels_of(module)
        self.plan = {n: c for n, c in plan.items() if c.kernel in kernels}
        self.prompt = {n: c for n, c in (prompt or plan).items() if c.kernel in kernels}
        used = {c.kernel for c in [*self.plan.values(), *self.prompt.values()]} or set(kernels)
        self.kernels = {k: f for k, f in kernels.items() if k in used}  # a packed copy never chosen is let go
        for name, kernel in self.kernels.items():  # packed now, not in a timed run; a buffer, so memory counts it
            if isinstance(kernel, (OneDNN, streamed.Streamed)):
                kernel.prepare()
                self.register_buffer(f"packed_{name}", kernel.packed, persistent=False)
        self.in_features, self.out_features = module.in_features, module.out_features
        self.key = shape_key(module)
        # resolved once here: a draft step makes ~100 of these calls, so the call itself must cost next to nothing
        dense = module.dense if isinstance(module, QuantLinear) else None
        self.long = (lambda x2: dense(x2)) if dense is not None else None  # (plain attributes: no Module lookup)
        self.by_rows = [None, *(self.call_for(n) for n in range(1, max(self.plan, default=0) + 1))]
        self.prompt_rows = [None, *(self.call_for(n, self.prompt) for n in range(1, max(self.prompt, default=0) + 1))]
        self.reading = False  # reading a prompt: `PromptReading` sets it for the forward

    # read like the linear it wraps, so code that takes a linear's weights (a cheaper draft made from a tuned one)
    # works on either
    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.inner.bias

    def call_for(self, n: int, plan: dict[int, Choice] | None = None) -> Kernel:
        """The callable that multiplies n rows on `plan` (the steps' by default): the chosen kernel, padded to the
        chosen rows where that was faster."""
        plan = self.plan if plan is None else plan
        choice = lookup(plan, n) if plan else Choice(next(iter(self.kernels)), n)
        kernel = self.kernels[choice.kernel]
        return kernel if choice.rows == n else (lambda x2: run_padded(kernel, x2, choice.rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        n = x2.shape[0]
        if n > DENSE_ABOVE and self.long is not None:  # a quantized draft's prompt: its own dense weights
            y = self.long(x2)
        else:
            # a compiled step reads no switch (no guard on it, no recompile): it multiplies on the steps' plan
            reading = not torch.compiler.is_compiling() and self.reading
            by_rows, plan = (self.prompt_rows, self.prompt) if reading else (self.by_rows, self.plan)
            y = (by_rows[n] if n < len(by_rows) else self.call_for(n, plan))(x2)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:  # the kernels it keeps: a step timed on other kernels is timed again (`steps`)
        return f"{self.key} on {'+'.join(self.kernels)}"


def sites(model: nn.Module, skip: tuple[str, ...] = ("full",)) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) for every linear-like module; `skip` names sub-trees left alone (a lean
    draft's `full` model, which reads prompts with the dense weights)."""
    found = []

    def walk(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if name in skip:
                continue
            if type(child) is nn.Linear or isinstance(child, QuantLinear):
                found.append((parent, name, child))
            elif not isinstance(child, TunedLinear):
                walk(child)
    walk(model)
    return found


@dataclass(frozen=True)
class Tuning:
    """What `tune` did: the measured costs per shape, the plans made of them, and whether they came from the cache."""

    costs: dict[str, Costs]
    plans: dict[str, dict[int, Choice]]
    cached: bool
    path: Path | None
    one_copy_cost: dict[str, float] = field(default_factory=dict)  # per shape: `LeanChoice.extra`
    variant: tuple[str, ...] = ()  # asked to be invariant: the shapes no invariant kernel serves here
    prompt_plans: dict[str, dict[int, Choice]] = field(default_factory=dict)  # what reads a prompt (`prompt_plan`)


class PromptReading:
    """A tuned model's switch (its `reading_prompt`): within it, each of its linears reads on its prompt plan.
    Models run on one thread, and a prompt is read in one forward, so the switch never outlives that forward."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.set(True)

    def __exit__(self, *exc) -> None:
        self.set(False)

    def set(self, reading: bool) -> None:
        for module in self.model.modules():
            if isinstance(module, TunedLinear):
                module.reading = reading


def tune(model: nn.Module, *, max_rows: int = MAX_PAD_ROWS, timer: Timer = time_group, folder: Path | None = None,
         cpu: str | None = None, status: Callable[[str], None] = log.info, invariant: bool = False,
         exclude: frozenset[str] = frozenset()) -> tuple[nn.Module, Tuning]:
    """A copy of `model` whose linears dispatch each row count to the kernel measured fastest here (its weights
    shared, the original untouched), and the measurements. The table comes from the cache when this machine,
    torch, the thread count and the model's shapes are those it was measured with. `invariant`: every row count
    of a shape an invariant kernel serves goes to the fastest of those (`INVARIANT`; all candidates are still timed,
    so the table is the same either way). `exclude`: kernels planned on nowhere (the same table)."""
    device = next(model.parameters()).device
    # copy the module tree only: every tensor stays shared with the original
    fast = shared_copy(model)
    found = sites(fast)
    if not found:
        return fast, Tuning({}, {}, True, None)
    candidates = [(parent, name, module, kernels_of(module)) for parent, name, module in found]
    groups: dict[str, list] = {}
    for entry in candidates:
        groups.setdefault(shape_key(entry[2]), []).append(entry)
    row_counts = sizes(max_rows)
    # the candidates are part of what was measured: a table timed without one is timed again
    key = KernelKey.of([f"{shape}|{'+'.join(members[0][3])}" for shape, members in groups.items()], device,
                       row_counts, cpu)
    path = table_path(key, folder)

    def measure() -> dict:
        status(f"Timing {len(groups)} linear shapes × {len(row_counts)} row counts on this machine's kernels "
               "(once; cached)…")
        costs = {}
        for shape, members in groups.items():
            chosen, total = [], 0
            for _, _, module, kernels in members:  # enough of them to leave the caches, as a forward does
                chosen.append(kernels)
                total += module_bytes(module)
                if total >= GROUP_BYTES:
                    break
            first = members[0][2]
            costs[shape] = timer(chosen, first.in_features, activation_dtype(first), device, row_counts)
        return {"costs": costs}

    data, cached = kept_or_measured(path, key, "The kernel timings", measure, log.warning)
    costs = table_costs(data)
    allowed = {shape: {k: per for k, per in c.items() if k not in exclude} for shape, c in costs.items()}
    planned = {shape: invariant_costs(c, max_rows) if invariant else c for shape, c in allowed.items()}
    lean = lean_plans(planned, {shape: (len(members), module_bytes(members[0][2])) for shape, members in groups.items()},
                      max_rows)
    plans = {shape: choice.plan for shape, choice in lean.items()}
    # an invariant plan binds the steps and verifies; a prompt may be read on any kernel (`prompt_plan`)
    prompts = {shape: prompt_plan(allowed[shape], plan, max_rows) if invariant else plan
               for shape, plan in plans.items()}
    for parent, name, module, kernels in candidates:
        setattr(parent, name, TunedLinear(module, plans[shape_key(module)], kernels, prompts[shape_key(module)]))
    fast.reading_prompt = PromptReading(fast)  # (`engine.plumbing.prefill` reads a prompt within it)
    variant = tuple(shape for shape, per in costs.items() if invariant and not INVARIANT & set(per))
    return fast.eval(), Tuning(costs, plans, cached, path, {shape: choice.extra for shape, choice in lean.items()},
                               variant, prompts)


def invariant_costs(costs: Costs, max_rows: int = MAX_PAD_ROWS) -> Costs:
    """A shape's costs on the invariant kernels that sum one way (`SUMS`), the way whose plan costs a race least:
    every row count must sum alike, so one way serves them all (all the kernels where none is invariant)."""
    alike: dict[str, Costs] = {}
    for kernel, per in costs.items():
        if kernel in INVARIANT:
            alike.setdefault(SUMS[kernel], {})[kernel] = per
    return min(alike.values(), key=lambda way: plan_cost(way, choose(way, max_rows)), default=costs)


def module_bytes(module: nn.Module) -> int:
    """A linear's own weights (a quantized one's packed weights and scales; not a dense copy it keeps, nor a second
    packing of its codes)."""
    if isinstance(module, Int4Linear):
        return module.codes_bytes() + (0 if module.bias is None else module.bias.numel() * module.bias.element_size())
    return sum(t.numel() * t.element_size() for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)])
