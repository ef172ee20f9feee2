"""A kernel for few rows that reads each weight once, whatever the number of rows: a candidate of the dispatcher.

A decode step multiplies one row by every weight and a verify K + 1 rows: both should cost what reading the
weights costs. torch's kernels did not on this project's CPUs: its own one-row bf16 product streamed the weights
near the bandwidth on a Zen 4 but took 3-4x as long at 9 rows; oneDNN's was slower at one row and needs a packed
copy of its own. This kernel (`streamed.cpp`) keeps the weight in one layout made for few rows (blocks of 16
outputs, their inputs in order) and multiplies up to 13 rows in one pass over it; more rows (a prompt) go a block
at a time, each block read from memory once. It is one more candidate
(`kernels.kernels_of`): the dispatcher times it beside the others and uses it only where it measures faster.

Its ways are candidates of their own, all reading one packed copy: `streamed` (bf16: AVX512-BF16's dot product),
`widened` (bf16 weights widened to float32 in registers, float32 FMAs: on a CPU whose dot product runs at half the
rate of its FMAs, the same sums in the same order in less time, though without the dot product's flushing of values
below float32's normal range to zero, so another way of summing), and each `_ahead`, asking for the weight `AHEAD`
bytes before it is read (a hint: the same bits; where the CPU's prefetchers fall behind). A row's sums run in one
order at every row count on each way; `SUMS` says which ways sum alike (a prefetch changes no sum).

It is built at first use with the machine's C++ compiler (`CXX`, else g++), once per machine, into the cache, for
the widest vectors the process may use: AVX-512 (AVX512-BF16 for bf16), or AVX2 with FMA (a laptop's CPU, or this
machine under `isa_cap`), where `widened` and float32's `streamed` sum every row as at AVX-512, bit for bit, on
8-lane registers (no bf16 dot product there). Where there is no compiler or the CPU has neither, the dispatcher goes
on without it and says so once.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from specviz.kernels import build, pages

SOURCE = Path(__file__).with_name("streamed.cpp")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp")
# per vector level (`build.vector_level`): the source's flags, and what the CPU needs per dtype there (bf16 at the
# AVX-512 level: AVX512-BF16's dot product and rounding; below it, the same sums on 8-lane registers)
LEVELS = {"avx512": (*build.LEVEL_FLAGS["avx512"], "-mavx512bf16"), "avx2": build.LEVEL_FLAGS["avx2"]}
NEEDS = {"avx512": {torch.float32: {"avx512f"}, torch.bfloat16: {"avx512f", "avx512_bf16"}},
         "avx2": dict.fromkeys((torch.float32, torch.bfloat16), set(build.AVX2))}
LANES = 16  # outputs in a block (streamed.cpp)
# how far on a thread asks for the weight it will read: on a 2-core Xeon (6/207) the target's products at one row
# took 105-109 ms asking 1-4 KB ahead against 120 ms leaving it to the CPU (9 rows, widened: 132-139 against 186)
AHEAD = 2048
# each way of summing per dtype: its function in streamed.cpp (`streamed` in bf16, the dot product, is AVX-512's
# alone; the others sum a row alike at either level, so a way keeps its name below AVX-512)
SUMMING = {torch.float32: {"streamed": "linear_f32"},
           torch.bfloat16: {"streamed": "linear_bf16", "widened": "linear_bf16_wide"}}
# each way: its function and how far ahead it asks (every way of summing, and the same asking `AHEAD`), per dtype
WAYS = {dtype: {name + suffix: (fn, ahead) for name, fn in ways.items()
                for suffix, ahead in (("", 0), ("_ahead", AHEAD))} for dtype, ways in SUMMING.items()}
SUMS = {way: way.removesuffix("_ahead") for ways in WAYS.values() for way in ways}  # how each way sums


@functools.cache  # built and loaded once per process and level; a missing compiler said once
def library(level: str | None = None) -> ctypes.CDLL | None:
    """The kernels built for `level` (the widest this process may use by default), or None (said once) where they
    cannot be had here."""
    level = level or build.vector_level() or "avx2"
    lib = build.library(SOURCE, FLAGS + LEVELS[level], NEEDS[level][torch.float32], "The few-row kernel (the other "
                        "kernels serve every row count)")
    if lib is not None:
        for fn in [getattr(lib, name) for name in {n for ways in SUMMING.values() for n in ways.values()}
                   if hasattr(lib, name)]:
            fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4
            fn.restype = None
    return lib


def level_for(dtype: torch.dtype) -> str | None:
    """The widest level whose kernels take `dtype` on this CPU (a CPU with AVX-512 but not its bf16 instructions
    multiplies bf16 at the AVX2 level), or None."""
    return build.level_for({level: needs[dtype] for level, needs in NEEDS.items() if dtype in needs})


def library_for(weight: torch.Tensor) -> ctypes.CDLL | None:
    """The kernels for this weight here (`applies` first), or None."""
    level = level_for(weight.dtype)
    return library(level) if level is not None else None


def applies(weight: torch.Tensor) -> bool:
    """A CPU weight in a dtype this CPU has the instructions for, in a shape the layout takes."""
    out, width = weight.shape
    return (weight.device.type == "cpu" and level_for(weight.dtype) is not None and out % LANES == 0
            and width % 2 == 0)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] as streamed.cpp reads it: blocks of 16 outputs, inputs in order (bf16: in pairs). A view
    of `weight`: `Packing` copies it into place once, on huge pages."""
    out, width = weight.shape
    pair = 2 if weight.dtype == torch.bfloat16 else 1
    return weight.detach().reshape(out // LANES, LANES, width // pair, pair).permute(0, 2, 1, 3)


class Packing:
    """The weight in streamed.cpp's layout, made once for every way that reads it: at the first call (so a
    candidate the plan never uses costs no memory), or by a kernel's `prepare` before anything is timed."""

    def __init__(self, weight: torch.Tensor):
        self.weight, self.packed = weight, None

    def get(self) -> torch.Tensor:
        if self.packed is None:  # on huge pages (`pages`): the few rows of a verify read it faster there
            # one copy, straight from the model's weight (the plain weight is the model's, not ours to keep)
            self.packed, self.weight = pages.gathered([pack(self.weight)])[0], None
        return self.packed


class Streamed:
    """The product on one way (`WAYS`) with the weight in streamed.cpp's layout (`Packing`, shared by the ways, and
    by the tile kernel's ways, `amx`, which read the same layout): `lib`'s function `fn` (the way's own by default)
    asking `ahead` bytes ahead."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, lib: ctypes.CDLL, way: str = "streamed",
                 packing: Packing | None = None, fn: tuple[str, int] | None = None):
        self.packing = packing if packing is not None else Packing(weight)
        self.bias = None if bias is None else bias.detach().contiguous()
        self.out, self.width = weight.shape
        self.dtype = weight.dtype
        name, self.ahead = fn if fn is not None else WAYS[weight.dtype][way]
        self.fn = getattr(lib, name)
        self.packed: torch.Tensor | None = None

    def prepare(self) -> None:
        self.packed = self.packing.get()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.prepare()
        x = x.to(self.dtype).contiguous()
        y = torch.empty(x.shape[0], self.out, dtype=self.dtype)
        self.fn(x.data_ptr(), self.packed.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
                y.data_ptr(), x.shape[0], self.width, self.out, self.ahead)
        return y


def ways(weight: torch.Tensor, bias: torch.Tensor | None, lib: ctypes.CDLL, packing: Packing | None = None
         ) -> dict[str, Streamed]:
    """Every way this weight can be multiplied by `lib` (its dtype's `WAYS` that its level has), on one packed copy
    (`packing`: one shared with other kernels reading the layout)."""
    packing = packing if packing is not None else Packing(weight)
    return {way: Streamed(weight, bias, lib, way, packing) for way, (fn, _) in WAYS[weight.dtype].items()
            if hasattr(lib, fn)}
