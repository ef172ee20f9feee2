"""A cheaper draft: weight-only int8/int4 linears.

Only the draft is changed; the target stays exactly as loaded, so what is decoded does not change.
Exactness holds because the drafter computes q from *this* model's logits and samples from that q:
the accept/reject rule needs q to be the distribution the draft really sampled from, not a good one.
A coarser draft can only lower acceptance, which the benchmark measures.

On a memory-bound CPU decode step the draft's time is mostly reading weights, so fewer bytes per
weight is most of the win: bf16 -> int8 halves them, int4 quarters them. The packed kernels are
fast for one token and slow for many, so a forward over more than a few tokens (reading the prompt)
uses the original dense weights, which the quantized copy shares with the original model.

Tried and dropped: pruning the draft's lm_head to its first N token ids lowered acceptance (JSON
0.91 -> 0.67 at 65536 ids on the embedded pair), while an int4 head over all ids costs ~3 ms a step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from specviz.kernels import w4a8

DENSE_ABOVE = 4  # rows (tokens) above which a forward uses the dense weights
QUANT_ROWS = 8192  # rows quantized at a time (a 151,936-row head at once took 1.6 GB of float32 temporaries)


@dataclass(frozen=True)
class DraftQuant:
    bits: int = 4  # 4, 8, or 16 (= leave the linears as they are)
    group_size: int = 32  # int4: weights per scale/zero group

    @staticmethod
    def named(name: str, group_size: int = 32) -> DraftQuant:
        """From a `PairSpec.draft_quant` name: "int4", "int8" or "none" (16 bits: as loaded)."""
        return DraftQuant({"int4": 4, "int8": 8, "none": 16}[name], group_size)


class QuantLinear(nn.Module):
    """A weight-only quantized linear for one-token steps; many-token inputs use `dense` if kept."""

    def __init__(self, dense: nn.Linear, keep_dense: bool = True):
        super().__init__()
        self.dense = dense if keep_dense else None  # shared with the original model, not copied
        self.bias = dense.bias
        self.in_features, self.out_features = dense.in_features, dense.out_features

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if self.dense is not None and x2.shape[0] > DENSE_ABOVE:
            return self.dense(x)
        y = self.matmul(x2).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int8Linear(QuantLinear):
    """Symmetric per-output-channel int8 weights (torch's `_weight_int8pack_mm`)."""

    def __init__(self, dense: nn.Linear, keep_dense: bool = True):
        super().__init__(dense, keep_dense)
        w = dense.weight.detach().float()
        scale = w.abs().amax(1).clamp_min(1e-12) / 127
        self.register_buffer("qweight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(dense.weight.dtype))

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scales)


class Int4Linear(QuantLinear):
    """Asymmetric per-group uint4 weights in torch's CPU int4 packing (bf16 activations)."""

    def __init__(self, dense: nn.Linear, group_size: int, keep_dense: bool = True):
        super().__init__(dense, keep_dense)
        n, k = dense.weight.shape
        # a linear kept as its codes (`store.CodedLinear`) gives them as they were computed from its dense weights
        q, scale, lo = dense.int4_codes(group_size) if hasattr(dense, "int4_codes") else \
            int4_codes(dense.weight, group_size)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_and_zeros", torch.cat([scale, zero], -1).transpose(0, 1).contiguous()
                             .to(torch.bfloat16))  # [k / group, n, 2]
        self.group_size = group_size
        # the same codes for the 4-bit x 8-bit kernel where this CPU has one: the dispatcher keeps the copy it uses
        # (`keep_only`)
        packed = w4a8.pack(q, scale[..., 0], lo[..., 0]) \
            if w4a8.applies(n, k, group_size, dense.weight.dtype) else None
        self.register_buffer("w4a8_packed", packed, persistent=False)

    def codes_bytes(self) -> int:
        """The bytes a product reads: torch's packing, or the 4-bit x 8-bit one where that alone is kept."""
        kept = (self.qweight, self.scales_and_zeros) if self.qweight.numel() else (self.w4a8_packed,)
        return sum(t.numel() * t.element_size() for t in kept)

    def keep_only(self, kernels: set[str]) -> None:
        """Drop the packed copy of the kernel not in `kernels` ("int4": torch's, "w4a8"): one copy of the codes."""
        if "w4a8" not in kernels:
            self.w4a8_packed = None
        if "int4" not in kernels and self.w4a8_packed is not None:
            self.qweight, self.scales_and_zeros = (torch.empty(0, dtype=t.dtype) for t in
                                                   (self.qweight, self.scales_and_zeros))

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16), self.qweight, self.group_size,
                                                      self.scales_and_zeros)
        return y.to(x2.dtype)


@torch.no_grad()
def int4_codes(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per-group uint4 codes of `weight` [n, k]: (codes [n, k] int32 0..15, scale and low [n, k / group, 1]
    float32), a weight being (code * scale + low) up to rounding."""
    n, k = weight.shape
    q = torch.empty(n, k, dtype=torch.int32)
    scale, lo = (torch.empty(n, k // group_size, 1) for _ in range(2))
    for start in range(0, n, QUANT_ROWS):  # in row blocks: float32 temporaries of a block, not of the weight
        rows = slice(start, start + QUANT_ROWS)
        g = weight.detach()[rows].float().reshape(-1, k // group_size, group_size)
        lo[rows], hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale[rows] = (hi - lo[rows]).clamp_min(1e-12) / 15
        q[rows] = (g - lo[rows]).div_(scale[rows]).round_().clamp_(0, 15).to(torch.int32).reshape(-1, k)
    return q, scale, lo


def supports(device: torch.device, bits: int) -> bool:
    """The packed kernels used here are CPU ones; elsewhere the linears are left as they are."""
    return device.type == "cpu" and bits in (4, 8)


def quantize_linear(linear: nn.Linear, bits: int, group_size: int = 32, keep_dense: bool = True) -> nn.Module:
    """int4 where the kernel's shape rules allow it, else int8; `linear` itself is not modified.

    `keep_dense=False` drops the reference to `linear`: for a temporary one (e.g. fused weights), or
    where no forward sends more than DENSE_ABOVE rows."""
    if bits == 4 and linear.in_features % group_size == 0 and linear.out_features % 16 == 0:
        return Int4Linear(linear, group_size, keep_dense)
    if bits in (4, 8):  # (a linear kept as int4 codes, `store.CodedLinear`, gives the weights they stand for)
        return Int8Linear(linear.as_linear() if hasattr(linear, "as_linear") else linear, keep_dense)
    return linear


@torch.no_grad()
def quantize_draft(model: nn.Module, spec: DraftQuant, head: nn.Module | None = None) -> nn.Module:
    """A quantized copy of a causal LM, or `model` itself where the kernels do not apply.
    The original is untouched and its weights are shared, not copied. `head`: the copy's output layer, made by
    the caller (a cut head), instead of the whole head quantized."""
    if not supports(next(model.parameters()).device, spec.bits):
        return model
    # copy the module tree only: every tensor stays shared with the original
    fast = copy.deepcopy(model, memo={id(t): t for t in [*model.parameters(), *model.buffers()]})
    for layer in fast.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, quantize_linear(child, spec.bits, spec.group_size))
    fast.set_output_embeddings(head or quantize_linear(model.get_output_embeddings(), spec.bits, spec.group_size))
    return fast.eval()
