"""q, k and v as one matrix product, gate and up as one: fewer, larger kernels for the compiled step on a GPU.

A one-token step on a GPU is a chain of small kernels, and a small model's step is bound by how many there are,
not by its weights: profiled on an H200 (bf16, synthetic Qwen2.5 shapes, `scripts/gpu_profile.py`), the 0.5B
shape's compiled step ran 464 kernels in 1.5 ms against 0.24 ms of weights, seven matrix products a layer among
them; the 7B shape's q, k and v products (and cuBLAS's split-K reductions after each) took 0.7 ms of its 5.9.
Serving engines load these weights fused (vLLM's QKVParallelLinear, MergedColumnParallelLinear); specviz fuses
a Hugging Face model's layers in place, for its compiled copy only: each fused weight is one tensor, and the
loaded projections' weights become views into it, so the weights are still held once.

Only the structure transformers' Llama-family layers share is touched (`q_proj`/`k_proj`/`v_proj` read the same
input in the attention's forward; the MLP is down(act(gate(x)) · up(x))): the attention's own forward still runs,
its three projections handed their parts of the one product (`Given`). A layer of another shape is left as it is.
A target on the GPU's row-invariant kernels (`invariant_gpu`) fuses onto the same kernel, changing no bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specviz.kernels import triton_rows
from specviz.models.invariant_gpu import RowsLinear


class Given(nn.Module):
    """Stands where a projection was: returns the part of its layer's fused product the layer handed it."""

    def __init__(self):
        super().__init__()
        self.value: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


def one_tensor(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`tensors` (of one width) stacked by rows: a view where they already lie one after another in one storage
    (fused before, for another compiled copy), else a new tensor."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    consecutive = all(t.is_contiguous() and t.untyped_storage().data_ptr() == storage for t in tensors) and all(
        b.data_ptr() == a.data_ptr() + a.numel() * a.element_size() for a, b in zip(tensors, tensors[1:]))
    if not consecutive:
        return torch.cat(tensors)
    rows = sum(t.shape[0] for t in tensors)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))


def fused_weight(linears: list[nn.Linear]) -> tuple[nn.Parameter, nn.Parameter | None]:
    """One weight (and bias) for `linears`, rows in order; each linear's own then a view into it (held once)."""
    weight = nn.Parameter(one_tensor([m.weight.detach() for m in linears]), requires_grad=False)
    biases = [m.bias for m in linears]
    bias = nn.Parameter(one_tensor([b.detach() for b in biases]), requires_grad=False) if all(
        b is not None for b in biases) else None
    start = 0
    for m in linears:  # the loaded model (the prompt's eager path) reads the same memory
        rows = m.out_features
        m.weight.data = weight.data[start:start + rows]
        if bias is not None:
            m.bias.data = bias.data[start:start + rows]
        start += rows
    return weight, bias


def product_of(linears: list[nn.Module]) -> Callable | None:
    """The product a fused weight is multiplied with: torch's for nn.Linear projections, the Triton kernel for those
    on it (`invariant_gpu.RowsLinear`: each output sums over the inputs alone, so the fused product's outputs are
    the separate products' bit for bit); None for a mix or anything else."""
    kinds = {type(m) for m in linears}
    return {frozenset({nn.Linear}): F.linear, frozenset({RowsLinear}): triton_rows.linear}.get(frozenset(kinds))


def bound(product: Callable, weight: torch.Tensor) -> Callable:
    """`product` for `weight`: the Triton kernel with the weight's tile width fixed here, outside a compiled trace."""
    if product is not triton_rows.linear:
        return product
    return functools.partial(product, tile=triton_rows.block_n(weight.shape[0], weight.device))


def fuse_attention(attn: nn.Module) -> bool:
    names = ("q_proj", "k_proj", "v_proj")
    linears = [getattr(attn, n, None) for n in names]
    product = product_of(linears)
    if product is None or len({m.bias is None for m in linears}) > 1:
        return False
    attn.qkv_weight, attn.qkv_bias = fused_weight(linears)
    product = bound(product, attn.qkv_weight)
    givens = [Given() for _ in linears]
    for name, given in zip(names, givens):
        setattr(attn, name, given)
    sizes = [m.out_features for m in linears]
    layer_forward = attn.forward

    def forward(hidden_states, *args, **kwargs):
        parts = product(hidden_states, attn.qkv_weight, attn.qkv_bias).split(sizes, dim=-1)
        for given, part in zip(givens, parts):
            given.value = part
        try:
            return layer_forward(hidden_states, *args, **kwargs)
        finally:  # nothing of this step is held past it
            for given in givens:
                given.value = None

    attn.forward = forward
    return True


def fuse_mlp(mlp: nn.Module) -> bool:
    linears = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
    product = product_of(linears)
    if product is None or any(m.bias is not None for m in linears) or not hasattr(mlp, "act_fn") \
            or product_of([getattr(mlp, "down_proj", None)]) is None:
        return False
    mlp.gate_up_weight, _ = fused_weight(linears)
    product = bound(product, mlp.gate_up_weight)
    del mlp.gate_proj, mlp.up_proj

    def forward(x):
        gate, up = product(x, mlp.gate_up_weight).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    mlp.forward = forward
    return True


def fused_bytes(model: nn.Module) -> int:
    """Bytes of the fused weights (one token's step reads each once)."""
    return sum(t.numel() * t.element_size() for m in model.modules() for name, t in m.named_parameters(recurse=False)
               if name in ("qkv_weight", "qkv_bias", "gate_up_weight"))


@torch.no_grad()
def fuse_projections(model: nn.Module) -> int:
    """Fuse every decoder layer's attention projections and MLP gate/up in place; the number of fusions made."""
    fused = 0
    for module in list(model.modules()):
        if all(hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj")):
            fused += fuse_attention(module)
        elif all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
            fused += fuse_mlp(module)
    return fused
