"""A cheaper verify: the target's linears over many rows on oneDNN's pre-packed weights (CPU, float32).

The target's weights are not changed, only the kernel that multiplies by them. The default CPU path
(MKL's sgemm) costs a staircase in the number of rows: ~1x one row for 1-3 rows, then ~2x, ~3x, ~4x
every three rows more, until a packed path takes over at 16: it works through a few rows at a time and
reads the weights again for each group. A verify of K + 1 rows pays that for every draft slot. oneDNN
on weights packed once at load reads them once (the bench, one run on the embedded target: T(9)/T(1)
3.17 dense, 1.39 packed); for one to three rows (a decode step) MKL stays the faster kernel, so those
still go there and the autoregressive lane is unchanged.

Outputs differ from the dense kernel's by float rounding only (summation order): both lanes decode
with this same target, and greedy identity is tested on the real pair with it.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

PACKED_FROM = 4  # rows (tokens) from which a forward uses the packed weights
PACK_HINT = 16  # the batch size oneDNN packs for (measured: 1-32 differ by noise from 4 rows up)


class PackedLinear(nn.Module):
    """`dense` for one to three rows, oneDNN on a packed copy of its weight for more."""

    def __init__(self, dense: nn.Linear):
        super().__init__()
        self.dense = dense  # shared with the loaded model, not copied
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(dense.weight.detach(), PACK_HINT),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] < PACKED_FROM:
            return self.dense(x)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.dense.bias, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the packed kernel exists and helps: float32 on a CPU with oneDNN (bf16 already uses it)."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def supports(model: nn.Module) -> bool:
    p = next(model.parameters())
    return applies(p.device, p.dtype)


@torch.no_grad()
def packed_target(model: nn.Module) -> nn.Module:
    """A copy of a causal LM whose linears multiply many rows on packed weights, or `model` itself where
    that does not apply. The original is untouched and its weights are shared, not copied."""
    if not supports(model):
        return model
    # copy the module tree only: every tensor stays shared with the original
    fast = copy.deepcopy(model, memo={id(t): t for t in [*model.parameters(), *model.buffers()]})
    for parent in list(fast.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
    return fast.eval()


def with_packed_target(pair, status=lambda _: None):
    """The same pair verifying on packed weights, named so (where it applies; elsewhere `pair` itself)."""
    if not supports(pair.target):
        return pair
    status("Packing the target's weights for many-token verifies…")
    return replace(pair, target=packed_target(pair.target), target_name=f"{pair.target_name} [packed verify]")
