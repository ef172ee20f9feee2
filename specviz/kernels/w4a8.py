"""The draft's linear at its bandwidth bound: 4-bit weights times 8-bit activations on the integer dot-product units.

The draft's int4 weights are a quarter of its bytes, but torch's int4 kernel (`_weight_int4pack_mm_for_cpu`) turns
every weight back into floating point before multiplying: at one row that is compute-bound on cores that run
512-bit operations as two halves, and the draft's step read its bytes at a third of the bandwidth (issue 61's
measure on a 2-core Zen 4; a quarter on a 2-core Xeon kept below AVX-512, issue 75). `w4a8.cpp` keeps the codes as
bytes, quantizes each activation row to 8 bits per block of 32 (as llama.cpp's Q8 blocks) and multiplies them on the
integer dot-product units, 8 outputs at a time, applying a group's scale and its low (through the block's sum) once
per 32 weights. A row's result differs from the float kernel's by the 8-bit activations' rounding (tested against a
float reference of the same codes); exactness does not depend on the draft.

One source, built at the vector level this process may use (`build.vector_level`): with AVX-512, AVX512-VNNI's
vpdpbusd on 512-bit registers; with AVX2 (FMA, F16C), AVX-VNNI's vpdpbusd on 256-bit registers where the CPU has it
(Intel since 2021), else vpmaddubsw and vpmaddwd (AMD before Zen 4). Each level's products are the others', bit for bit
(the integer sums are exact, the float operations the same in the same order: w4a8.cpp); the fused step's norms and
attention scores sum across a register's lanes, so they differ between levels by rounding.

`pack` lays out an `Int4Linear`'s codes for it (`Int4Linear` keeps this copy beside torch's while the dispatcher
chooses between them, then drops the one not chosen). Where the CPU lacks what the level needs (AVX512-VNNI at
AVX-512, AVX2 with FMA and F16C below it) or there is no compiler, `library()` says so once and torch's int4 kernel
serves.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.kernels import build

SOURCE = Path(__file__).with_name("w4a8.cpp")
# every build's flags, then each level's (its vectors', `build.LEVEL_FLAGS`, and its dot products'); at the AVX2 level
# -mavxvnni too where AVX-VNNI multiplies
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp")
LEVELS = {"avx512": (*build.LEVEL_FLAGS["avx512"], "-mavx512vnni", "-mavx512bf16", "-mf16c", "-mfma"),
          "avx2": build.LEVEL_FLAGS["avx2"]}
AVX_VNNI = "avx_vnni"  # the CPU's flag for AVX-VNNI
# what each level's build needs of the CPU, per dtype (below AVX-512 a bf16 output is rounded without AVX512-BF16)
NEEDS = {"avx512": {torch.float32: {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni"},
                    torch.bfloat16: {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni", "avx512_bf16"}},
         "avx2": {torch.float32: set(build.AVX2), torch.bfloat16: set(build.AVX2)}}
OUTS, GROUP = 8, 32  # outputs in a block; inputs in a group (w4a8.cpp)
# how far ahead of its reads a thread may ask for the codes, in bytes: the draft's step is timed at each, and without
# asking, and the fastest kept (`models.target.prefetch_or_not`). On a 2-core Xeon (family 6 model 207) the draft's
# products read 0.57 of the bandwidth with the hardware's prefetchers alone, 0.74-0.85 from 2 KB to 6 KB ahead on
# 4 KB pages (a probe of its shapes, 2026-11-28); on huge pages 8 KB ahead read 25-27 GB/s against 23-24 at 4 KB
PREFETCH = (4096, 8192)


def library(level: str | None = None, vnni: bool | None = None) -> ctypes.CDLL | None:
    """The kernel built at `level` ("avx512" or "avx2"; None: `build.vector_level()`, what this process may use) and
    loaded, or None where it cannot be (said once). `vnni`, at the AVX2 level: multiply with AVX-VNNI (None: where the
    CPU has it) or with vpmaddubsw; AVX-512 always multiplies with AVX512-VNNI."""
    level = level or build.vector_level() or "avx2"  # (below AVX2: the AVX2 build says what the CPU lacks)
    return built(level, level == "avx2" and (AVX_VNNI in build.cpu_flags() if vnni is None else vnni))


@functools.cache  # built and loaded once per process and variant; why not said once
def built(level: str, vnni: bool) -> ctypes.CDLL | None:
    flags = (*FLAGS, *LEVELS[level], *(("-mavxvnni",) if vnni else ()))
    needs = NEEDS[level][torch.float32] | ({AVX_VNNI} if vnni else set())
    what = f"The 4-bit x 8-bit draft kernel ({level}{' with AVX-VNNI' if vnni else ''}; torch's int4 kernel serves " \
        "the draft)"
    return declared(build.library(SOURCE, flags, needs, what))


def declared(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    """`lib` with its functions' argument types (as w4a8.cpp's `extern "C"` declares them)."""
    if lib is not None:
        for fn in (lib.w4a8_bf16, lib.w4a8_f32):
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 4
            fn.restype = None
        for fn in (lib.lean_step_bf16, lib.lean_step_f32):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 3 + [ctypes.c_long] \
                + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 6 + [ctypes.c_float] * 2 + [ctypes.c_long] \
                + [ctypes.c_void_p, ctypes.c_long]
            fn.restype = None
    return lib


def applies(out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> bool:
    level = build.vector_level()
    return (group_size == GROUP and out_features % OUTS == 0 and in_features % GROUP == 0 and level is not None
            and dtype in NEEDS[level] and NEEDS[level][dtype] <= build.cpu_flags() and library() is not None)


def pack(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """codes [out, in] (0..15), scale and low [out, in / 32] -> w4a8.cpp's layout (the header says which)."""
    out, width = codes.shape
    blocks, groups = out // OUTS, width // GROUP
    c = codes.to(torch.uint8).reshape(blocks, OUTS, groups, 4, 2, 4)  # (block, o, group, t, half, j)
    c = c.permute(0, 2, 3, 1, 5, 4)  # (block, group, t, o, j, half)
    nibbles = (c[..., 0] | (c[..., 1] << 4)).reshape(blocks, groups, 128)

    def halves(t: torch.Tensor) -> torch.Tensor:  # [out, groups] -> (block, group, 16 bytes of 8 fp16)
        return t.to(torch.float16).reshape(blocks, OUTS, groups).permute(0, 2, 1).contiguous().view(torch.uint8)
    return torch.cat([nibbles, halves(scale), halves(low)], -1).reshape(-1).contiguous()


class W4A8:
    """The product on a packed weight: x [n, in] in the model's dtype -> [n, out]. `prefetch`: bytes ahead (0: none;
    the draft's step chooses, `models.target.with_tuned_draft`)."""

    def __init__(self, packed: torch.Tensor, out_features: int, in_features: int, lib: ctypes.CDLL):
        self.packed, self.out, self.width = packed, out_features, in_features
        self.lib, self.prefetch = lib, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
        x = x.to(dtype).contiguous()
        y = torch.empty(x.shape[0], self.out, dtype=dtype)
        fn = self.lib.w4a8_bf16 if dtype == torch.bfloat16 else self.lib.w4a8_f32
        fn(x.data_ptr(), self.packed.data_ptr(), y.data_ptr(), x.shape[0], self.width, self.out, self.prefetch)
        return y


@dataclass(frozen=True)
class LayerShape:
    """A decoder layer's sizes as `lean_step` reads them (in its argument order), and its norm's epsilon and
    attention's scale."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    scale: float

    def sizes(self) -> tuple[int, int, int, int, int]:
        return self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn


class LeanStep:
    """A lean draft's whole step over new tokens in one call (`lean_step` in w4a8.cpp): every layer's norms,
    products (on this kernel), rotary embedding, K/V written into the cache in place, causal attention and residuals,
    in one parallel region. `layers`: per layer (norm1, qkv, qkv bias or None, o, norm2, gate/up, down), the products
    as packed codes and the rest as float32 tensors, kept here so that the pointers stay valid. `prefetch`: as
    `W4A8`'s. `tiles`: where AMX serves (`amx.w4_rows`), the products of `TILE_ROWS` new tokens or more (a prompt) run
    on the tiles (an AVX-512 build's step: below it the tiles are never called)."""

    # the fewest new tokens whose products go to the tiles. Widening the codes costs about two steps' time whatever
    # the rows (the embedded draft's 96 products: 32 ms), then a row costs 0.44 ms against 1.25 here (2-core Xeon with
    # AMX, family 6 model 167, 2026-12-02): 16 rows 35 against 27 ms, 74 rows 77 against 103, 142 rows 107 against 189
    TILE_ROWS = 32

    def __init__(self, layers: list[tuple], shape: LayerShape, lib: ctypes.CDLL, tiles: int | None = None):
        self.kept = [t for layer in layers for t in layer if t is not None]
        pointers = [None if t is None else t.data_ptr() for layer in layers for t in layer]
        self.params = (ctypes.c_void_p * len(pointers))(*pointers)
        self.layers, self.shape, self.lib, self.prefetch, self.tiles = len(layers), shape, lib, 0, tiles

    def __call__(self, h: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], position: int,
                 cos: torch.Tensor, sin: torch.Tensor, capacity: int) -> None:
        """h: the new tokens' embeddings, float32 [n, hidden], in place the last layer's outputs; cos/sin:
        [n, head_dim]; keys/values: per layer [1, kv_heads, capacity, head_dim] in the model's dtype, the tokens'
        written from `position` on."""
        fn = self.lib.lean_step_bf16 if keys[0].dtype == torch.bfloat16 else self.lib.lean_step_f32
        ks = (ctypes.c_void_p * self.layers)(*[k.data_ptr() for k in keys])
        vs = (ctypes.c_void_p * self.layers)(*[v.data_ptr() for v in values])
        fn(h.data_ptr(), h.shape[0], self.layers, ctypes.addressof(self.params), ctypes.addressof(ks),
           ctypes.addressof(vs), position, cos.data_ptr(), sin.data_ptr(), *self.shape.sizes(), capacity,
           self.shape.eps, self.shape.scale, self.prefetch, self.tiles, self.TILE_ROWS)
