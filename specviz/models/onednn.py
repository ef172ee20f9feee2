"""torch's oneDNN as candidates of the dispatcher (`kernels.kernels_of`): its linear on a copy of the weight packed
once (`OneDNN`), and torch's own kernel with oneDNN switched off for the call (`WithoutOneDNN`)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

PACK_HINT = 16  # the batch size oneDNN packs a weight for (its packed kernel serves any row count)


def onednn_applies(weight: torch.Tensor) -> bool:
    """oneDNN's packed linear serves this weight: its bf16 path needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, which
    a CPU without them, or one kept below them (ONEDNN_MAX_CPU_ISA=AVX2), lacks: packing raises there."""
    if not (weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16
                                             and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class WithoutOneDNN:
    """The module's product with oneDNN switched off for the call: torch's own kernel for the dtype runs. torch keeps
    that switch once for the process, so it is set and put back around the call (models run on one thread)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        was = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return F.linear(x, self.weight, self.bias)
        finally:
            torch._C._set_mkldnn_enabled(was)


class OneDNN:
    """oneDNN's linear on a copy of the weight packed for it: at the first call (a candidate the plan never uses
    costs no memory), or by `prepare` before anything is timed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias
        self.packed: torch.Tensor | None = None

    def prepare(self) -> None:
        if self.packed is None:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_HINT)
            self.weight = None  # the plain weight is the model's, not ours to keep

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.prepare()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
