"""Attention whose every query row is computed alone, in one fixed order: the target's verify row-invariant.

A verify scores K + 1 rows in one forward where the target alone scores one; torch's attention for many rows (a
flash kernel splitting the keys into blocks whose size depends on the row and key counts, then rescaling) adds the
same terms in another order than for one row, and in bfloat16 a near-tie between the two likeliest tokens can flip:
greedy speculation then parts from the target alone (measured on the embedded pair: the first difference of a
verify's row from the step at its position was in layer 0's attention, every linear bit-identical). `rows.cpp`
attends each (head, row) over the keys it sees in one order that depends on nothing else (its header says which);
with specviz's few-row linear (`streamed`, the same property) the verify's rows and the K/V they write are the
one-token steps', bit for bit.

`attention` has transformers' attention-function signature (`attention_of`, which the GPU's kernels share);
`register` adds it as the implementation `ROWS` (`models.target` switches a target to it). A forward reading a
prompt into an empty cache (both lanes read it alike) or wider than `MAX_ROWS` goes to torch's SDPA, as does
anything the kernel does not take (another device, dtype or head size, a batch, a soft cap).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from specviz.kernels import build
from specviz.kernels.streamed import LEVELS, NEEDS, level_for  # the same per level and dtype as the few-row kernel's

SOURCE = Path(__file__).with_name("rows.cpp")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp")
ROWS = "specviz_rows"  # the attention implementation's name in transformers' registry
MAX_ROWS = 256  # the widest verify taken (K <= 255): a prompt read into a cache that holds some is wider


@functools.cache  # built and loaded once per process and level; why not said once
def library(level: str | None = None) -> ctypes.CDLL | None:
    """The kernel built for `level` (the widest this process may use by default), or None (said once)."""
    level = level or build.vector_level() or "avx2"
    lib = build.library(SOURCE, FLAGS + LEVELS[level], NEEDS[level][torch.float32], "The row-invariant attention (a "
                        "verify's rows then round as the one-token steps do not, and greedy texts may part at a "
                        "near-tie)")
    if lib is not None:
        for fn in (lib.attend_bf16, lib.attend_f32):
            fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 5 + [ctypes.c_float]
            fn.restype = None
    return lib


def available(dtype: torch.dtype) -> bool:
    """Can this machine run the kernel in `dtype` (instructions and a build)?"""
    level = level_for(dtype)
    return level is not None and library(level) is not None


def allowed_keys(mask: torch.Tensor | None, n: int, slots: int) -> torch.Tensor | None:
    """Which key slots each of the n rows sees, as bytes [n, slots] (None: causal, row i seeing slots up to
    slots - n + i). transformers hands a boolean mask, or a tree's additive one (0 seen, the dtype's minimum not)."""
    if mask is None:
        return None
    rows = mask[0, 0, -n:, :slots]
    seen = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2
    return seen.to(torch.uint8).contiguous()


def takes(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    n, slots = query.shape[2], key.shape[2]
    return (query.device.type == "cpu" and query.shape[0] == 1 and query.shape[-1] % 16 == 0
            and query.dtype == key.dtype and slots > n and n <= MAX_ROWS and kwargs.get("softcap") is None
            and kwargs.get("sliding_window") is None and available(query.dtype))


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """query [1, heads, n, d], key/value [1, kv_heads, slots, d] -> [1, n, heads, d]."""
    _, heads, n, d = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    q, k, v = (t[0].contiguous() for t in (query, key, value))
    out = torch.empty(1, n, heads, d, dtype=query.dtype)
    lib = library(level_for(query.dtype))
    fn = lib.attend_bf16 if query.dtype == torch.bfloat16 else lib.attend_f32
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), None if allowed is None else allowed.data_ptr(), out.data_ptr(),
       heads, kv_heads, n, slots, d, scale)
    return out


def attention_of(serves: Callable[[torch.Tensor, torch.Tensor, dict], bool], kernel: Callable) -> Callable:
    """transformers' attention-function signature over a kernel of `attend`'s signature: the kernel for a verify or
    a step where `serves` says it takes the call; SDPA for a prompt read into an empty cache and the rest. This
    module's `attention` (`rows.cpp`) and the GPU's (`triton_rows`)."""
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                  **kwargs) -> tuple[torch.Tensor, None]:
        if not serves(query, key, kwargs):
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return kernel(query, key, value, allowed_keys(attention_mask, query.shape[2], key.shape[2]), scale), None

    return attention


attention = attention_of(takes, attend)  # each row alone (`rows.cpp`)


def register_as(name: str, function: Callable) -> None:
    """`function` as attention implementation `name` in transformers' registries, given SDPA's masks (None where
    causal needs none)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(name, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def register() -> None:
    """`ROWS` in transformers' registries: this module's attention."""
    register_as(ROWS, attention)
