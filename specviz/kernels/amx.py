"""The bf16 linear on AMX tiles: a verify's 16 rows for about the price of one, a prompt's chunk for about two.

`streamed`'s kernels multiply with 512-bit vectors: at one row they read the weights at the bandwidth, but their
multiplies grow with the rows, so a verify of 13 rows cost well over a step on an AMX Xeon while its tile unit sat
idle. A tile multiply (TDPBF16PS) takes 16 rows x 32 inputs x 16 outputs at once. `amx.cpp` feeds the tiles straight
from `streamed`'s packed copy (16 pairs of inputs of a block of 16 outputs are one B tile as they lie: one copy of
each weight stays the rule), so the tile kernel is one more candidate on that copy, timed beside the others.

Its sums are its own way (`SUMS`): a row's outputs are summed a tile step of 32 inputs at a time, in order, and a
tile's rows never mix, so every row count sums a row alike (the verify bit-identical to the one-token step where a
plan puts every row count here); they are not `streamed`'s sums, so a plan does not mix the two.

The draft's int4 products over a prompt run here too (`w4_rows`, called from inside w4a8.cpp's fused step): its codes
widened to bf16 a panel at a time, every prompt row run past the panel on the tiles.

Built at first use like the others (`build`), with AMX-TILE and AMX-BF16. Linux lends a process the tile state only
when asked (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), once per process; where the CPU lacks AMX, `isa_cap` keeps the
process below AVX-512, or the kernel refuses, one sentence says so and the other kernels serve.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
from pathlib import Path

import torch

from specviz.kernels import build, streamed

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("amx.cpp")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16",
         "-mamx-tile", "-mamx-bf16")
NEEDS = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
STEP = 32  # inputs a tile step covers (amx.cpp): a weight's inputs must be a multiple
# each way: its function in amx.cpp and how far ahead (bytes) a thread asks for the weight (the dispatcher times both)
WAYS = {"amx": ("linear_amx", 0), "amx_ahead": ("linear_amx", streamed.AHEAD)}
SUMS = dict.fromkeys(WAYS, "amx")  # a prefetch changes no sum


@functools.cache  # built, loaded and granted the tiles once per process; why not said once
def library() -> ctypes.CDLL | None:
    what = "The AMX tile kernel (the vector kernels serve every row count)"
    lib = build.library(SOURCE, FLAGS, NEEDS, what)
    if lib is None:
        return None
    lib.amx_permit.restype = ctypes.c_int
    refused = lib.amx_permit()
    if refused:
        log.warning(f"{what} is not used: Linux did not lend this process the tile state "
                    f"({errno.errorcode.get(refused, refused)}).")
        return None
    lib.linear_amx.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4
    lib.linear_w4.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3
    lib.linear_amx.restype = lib.linear_w4.restype = None
    return lib


def w4_rows() -> int | None:
    """The address of amx.cpp's `w4_rows` (a 4-bit draft's products over a prompt's rows on the tiles, called from
    inside w4a8.cpp's step), where the tiles serve and the CPU has AVX512-VBMI for unpacking the codes; else None."""
    lib = library()
    if lib is None or "avx512vbmi" not in build.cpu_flags():
        return None
    return ctypes.cast(lib.w4_rows, ctypes.c_void_p).value


def applies(weight: torch.Tensor) -> bool:
    """A CPU bf16 weight whose shape the tiles take, on a CPU with AMX (and not kept below it)."""
    out, width = weight.shape
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and out % streamed.LANES == 0
            and width % STEP == 0 and NEEDS <= build.cpu_flags())


def ways(weight: torch.Tensor, bias: torch.Tensor | None, lib: ctypes.CDLL, packing: streamed.Packing
         ) -> dict[str, streamed.Streamed]:
    """The tile kernel's ways on `packing`, the copy `streamed`'s ways read."""
    return {way: streamed.Streamed(weight, bias, lib, packing=packing, fn=fn) for way, fn in WAYS.items()}
