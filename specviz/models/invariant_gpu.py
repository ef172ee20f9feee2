"""The target on a GPU with a row-invariant verify: its linears, norms and attention on `kernels.triton_rows`.

On a CPU the dispatcher puts the target's linears on specviz's invariant kernels (`kernels.INVARIANT`) and its
attention on `rows`. On a GPU the loaded model runs cuBLAS and SDPA; here a copy of it (the weights shared, not
copied) runs every `nn.Linear` (the head too), every RMSNorm of transformers' Llama form and its attention on the
Triton kernels, so a verify's rows and the K/V they write are the one-token steps', bit for bit. The rest of a
layer (the embedding's gather, RoPE, SiLU, the residual sums) works one element at a time and is alike already.
Where a model has a piece these kernels do not serve, `missing` says which in one sentence and the loaded model's
kernels run, as before.
"""

from __future__ import annotations


import torch
from torch import nn

from specviz.models.copies import swapped
from specviz.kernels import triton_rows


class RowsLinear(nn.Module):
    """An nn.Linear's weight and bias (the same tensors) multiplied on `triton_rows.linear`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.tile = triton_rows.block_n(self.out_features, self.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_rows.linear(x, self.weight, self.bias, self.tile)


class RowsNorm(nn.Module):
    """transformers' RMSNorm (Llama's form: weight x normalised row) on `triton_rows.rms_norm`."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_rows.rms_norm(x, self.weight, self.variance_epsilon)


def is_norm(module: nn.Module) -> bool:
    """An RMSNorm of Llama's form (Llama, Qwen2, Mistral): a 1-D weight and `variance_epsilon`."""
    return (type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
            and getattr(module, "weight", None) is not None and module.weight.dim() == 1)


def unserved(model: nn.Module) -> list[str]:
    """The kinds of module with weights that the kernels do not serve (a norm of another form, a convolution…)."""
    kinds = set()
    for module in model.modules():
        if type(module) is nn.Linear or is_norm(module) or isinstance(module, nn.Embedding) or \
                not any(True for _ in module.parameters(recurse=False)):
            continue
        kinds.add(type(module).__name__)
    return sorted(kinds)


def missing(model: nn.Module, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the target's verify cannot be made row-invariant on `device` (None: it can)."""
    why = triton_rows.missing(device)
    if why is not None:
        return why
    if dtype not in triton_rows.DTYPES:
        return f"the Triton kernels do not run in {str(dtype).removeprefix('torch.')}"
    why = triton_rows.failed(device, dtype)
    if why is not None:
        return why
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return "it is spread over several devices (--device-map), which the Triton copy does not follow"
    kinds = unserved(model)
    if kinds:
        return f"no row-invariant kernel serves its {', '.join(kinds)} layers"
    config = model.config.get_text_config()
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()) or (
            getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)):
        return "its attention slides a window (the Triton attention reads every key a row sees)"
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head & (head - 1):
        return f"its attention heads are {head} wide (the Triton attention takes powers of two)"
    return None


def on_triton(model: nn.Module | None) -> bool:
    """Is `model` a copy made by `invariant` (its attention the Triton one)?"""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == triton_rows.ROWS


@torch.no_grad()
def invariant(model: nn.Module) -> nn.Module:
    """A copy of `model` (its weights shared) with every linear and RMSNorm on the Triton kernels and attention
    `triton_rows.ROWS`; check `missing` first."""
    fast = swapped(model, lambda m: RowsLinear(m) if type(m) is nn.Linear else RowsNorm(m) if is_norm(m) else None)
    triton_rows.register()
    fast.config._attn_implementation = triton_rows.ROWS  # (the copy's own config: the loaded model keeps SDPA)
    return fast.eval()
