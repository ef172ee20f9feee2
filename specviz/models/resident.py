"""What a tuned model keeps resident and what a step reads: one copy of each weight (the dense ones its kernels never
multiply by released, one packing of a 4-bit linear's codes), and the bytes of weights one token's forward reads (a
step's bandwidth bound). Apart from the dispatcher (`models.kernels`), which plans; this only reads the plans."""

from __future__ import annotations

import torch
from torch import nn

from specviz.models.draft.quantized import Int4Linear
from specviz.models.fused import fused_bytes
from specviz.models.kernels import TunedLinear, module_bytes, sites
from specviz.models.plans import form_of


def release_unused_dense(model: nn.Module) -> int:
    """One copy of each weight: a tuned linear whose plan never multiplies by its weight as loaded (a copy of a
    kernel's own serves every row count) drops it, unless another part of the model holds it (a tied embedding).
    The weight becomes a meta tensor of its shape: `step_bytes` still counts the bytes a step reads, none stay
    resident, and any use of it fails loudly. The model as loaded shares these weights: it must not be used
    afterwards (`load_spec` releases only where nothing does). Returns the bytes released."""
    tuned = [m for m in model.modules() if isinstance(m, TunedLinear) and isinstance(m.inner, nn.Linear)]
    linears = {id(m) for t in tuned for m in (t, t.inner)}
    held = {t.untyped_storage().data_ptr() for module in model.modules() if id(module) not in linears
            for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            if not t.is_mkldnn and t.device.type != "meta"}  # (a tied weight is listed once by parameters())
    released = 0
    for m in tuned:
        weight = m.inner.weight
        if any(form_of(k) == "as loaded" for k in m.kernels) or weight.device.type == "meta" \
                or weight.untyped_storage().data_ptr() in held:
            continue
        released += weight.numel() * weight.element_size()
        m.inner.weight = nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)
    return released


def uses(model: nn.Module, kernel: str) -> bool:
    return any(kernel in m.kernels for m in model.modules() if isinstance(m, TunedLinear))


def release_unused_codes(model: nn.Module) -> None:
    """One copy of a 4-bit linear's codes: each keeps the packing of the kernel its plan uses (`Int4Linear.keep_only`);
    one no plan serves (kernels as loaded) keeps torch's, which its own forward calls. Any model sharing those linears
    with another plan must not run afterwards."""
    planned = {id(m.inner): set(m.kernels) for m in model.modules() if isinstance(m, TunedLinear)}
    for m in model.modules():
        if isinstance(m, Int4Linear):
            m.keep_only(planned.get(id(m), {"int4"}))


def step_bytes(model: nn.Module) -> int:
    """Bytes of weights one token's forward reads: every linear's weights, once (however many copies the
    candidate kernels keep); embeddings are gathered a row at a time and not counted."""
    linears = [m.inner for m in model.modules() if isinstance(m, TunedLinear)] + [m for _, _, m in sites(model)]
    return sum(module_bytes(m) for m in linears) + fused_bytes(model)
