"""Compile specviz's Triton kernels (specviz/kernels/triton_rows.py) for an NVIDIA architecture without a GPU: every
configuration the product launches (both dtypes, every tile width, heads of 64 and 128, with and without a mask),
through Triton's own compiler and the ptxas it ships, printing each kernel's registers and spills. A lent GPU's
minutes then go to bits and speed, not to a compile error. Exit status 1 where a kernel fails to compile or spills.

    python scripts/triton_compile.py [--arch 90] [--tile-rows 16]

Run it with TRITON_INTERPRET unset (the interpreter's kernels are not compiled).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POINTERS = {"linear": ("x", "w", "b", "out"), "rms_norm": ("x", "w", "out"), "attend": ("q", "k", "v", "out")}
INTS = {"linear": ("M", "N", "K", "sxm", "swn", "som"), "rms_norm": ("N", "sx", "so"),
        "attend": ("group", "n", "slots", "sqh", "sqn", "skh", "sks", "soh", "son")}


@dataclass(frozen=True)
class Launch:
    """One kernel at one configuration the product launches it with."""

    kernel: str  # linear, rms_norm, attend
    dtype: str  # Triton's name: bf16, fp32
    constexprs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.kernel} {self.dtype} " + " ".join(f"{k}={v}" for k, v in self.constexprs.items()
                                                          if k not in ("PRECISION", "EXPLICIT"))

    def signature(self) -> dict[str, str]:
        sig = {p: f"*{self.dtype}" for p in POINTERS[self.kernel]} | {i: "i32" for i in INTS[self.kernel]}
        if self.kernel == "rms_norm":
            sig["eps"] = "fp32"
        if self.kernel == "attend":
            sig |= {"allowed": "*u8", "ends": "*i32", "scale": "fp32"}
        return sig | {k: "constexpr" for k in self.constexprs}


def launches(tile_rows: int) -> list[Launch]:
    from specviz.kernels import triton_rows

    import torch

    found = []
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        precision = "ieee" if dtype == "fp32" else "tf32"
        found += [Launch("linear", dtype, {"HAS_BIAS": bias, "PRECISION": precision, "EXPLICIT": False,
                                           "BM": tile_rows, "BN": width, "BK": triton_rows.BLOCK_K[torch_dtype]})
                  for width in triton_rows.BLOCK_NS for bias in (False, True)]
        found += [Launch("rms_norm", dtype, {"BLOCK": width}) for width in (1024, 2048, 4096)]  # 896, 1536, 3584
        found += [Launch("attend", dtype, {"HAS_MASK": mask, "D": d, "BLOCK": triton_rows.KEYS})
                  for d in (64, 128) for mask in (False, True)]
    return found


def resources(ptx: str, arch: int) -> str:
    """ptxas's line on a kernel's registers and spills."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    out = subprocess.run([str(ptxas), "-v", f"--gpu-name={gpu}", f.name, "-o", os.devnull], capture_output=True,
                         text=True, check=True)
    os.unlink(f.name)
    return " ".join(line.split("info    : ")[-1].strip() for line in out.stderr.splitlines()
                    if "Used" in line or "spill" in line)


def compiled(launch: Launch, arch: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specviz.kernels import triton_rows

    fn = getattr(triton_rows, f"_{launch.kernel}")
    source = ASTSource(fn=fn, signature=launch.signature(), constexprs=launch.constexprs)
    return resources(triton.compile(source, target=GPUTarget("cuda", arch, 32)).asm["ptx"], arch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 80: A100)")
    parser.add_argument("--tile-rows", type=int, default=16, help="the linear's rows a tile (the product's: 16)")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1: the interpreter's kernels are not compiled; unset it.", file=sys.stderr)
        return 2
    bad = 0
    for launch in launches(args.tile_rows):
        try:
            line = compiled(launch, args.arch)
            verdict = "ok" if " 0 bytes spill stores" in line else "SPILLS"
        except Exception as e:  # noqa: BLE001 - Triton's compile errors are of many types
            line, verdict = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}", "FAILED"
        bad += verdict != "ok"
        print(f"sm_{args.arch}  {launch.name:<55} {verdict}  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
