"""Building a kernel's C++ source at first use: once per machine, with the machine's compiler, into the cache.

A source compiles with its flags into `<cache>/kernels/<name>-<digest>.so` (the digest covers the source, the
compiler's version and the flags: any change builds afresh), under a file lock, written whole and moved in place.
Where the CPU lacks what a kernel needs, no compiler is found (`CXX`, else g++) or the build fails, `library` returns
None and logs one sentence; the caller then goes on without that kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from specviz.cache import cache_dir

log = logging.getLogger(__name__)


def cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    return dict(first_processor(cpuinfo))


@functools.cache  # the CPU does not change under a process, and a verify's attention asks at every call
def first_processor(cpuinfo: str) -> tuple[tuple[str, str], ...]:
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return ()
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return tuple(fields.items())


# Where the operator keeps torch (ATEN_CPU_CAPABILITY) or oneDNN (ONEDNN_MAX_CPU_ISA) below AVX-512, on a CPU that
# has it, specviz's kernels stay below it too: one setting for the whole process, and a way to run this machine as
# a CPU without AVX-512 runs (what each is set to, lower-cased, that caps it)
ISA_CAPS = {"ATEN_CPU_CAPABILITY": {"default", "avx2"}, "ONEDNN_MAX_CPU_ISA": {"sse41", "avx", "avx2", "avx2_vnni",
                                                                           "avx2_vnni_2"}}
ABOVE_AVX2 = ("avx512", "amx")  # the flags such a cap leaves out (avx512f, avx512_bf16, amx_tile, ...)


def isa_cap(environ=os.environ) -> str | None:
    """The variable (name=value) that keeps this process below AVX-512, or None."""
    for name, below in ISA_CAPS.items():
        if environ.get(name, "").strip().lower() in below:
            return f"{name}={environ[name].strip()}"
    return None


def cpu_flags(cpuinfo: str = "/proc/cpuinfo", environ=os.environ) -> set[str]:
    """The CPU's instruction-set flags this process may use: /proc/cpuinfo's, less AVX-512 and AMX under `isa_cap`."""
    flags = set(cpu_fields(cpuinfo).get("flags", "").split())
    return {f for f in flags if not f.startswith(ABOVE_AVX2)} if isa_cap(environ) else flags


# The vector level a kernel is built for: AVX-512 where the process may use it, else AVX2 with FMA and F16C (Intel's
# laptops and desktops since 2021, AMD's before Zen 4, or this machine under `isa_cap`). A source compiled at the AVX2
# level gets no AVX-512 flag, so nothing above AVX2 can slip into it.
AVX2 = frozenset({"avx2", "fma", "f16c"})
LEVEL_FLAGS = {"avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"), "avx2": ("-mavx2", "-mfma", "-mf16c")}


def vector_level(flags: set[str] | None = None) -> str | None:
    """"avx512", "avx2" or None: the widest vectors this process may use (`cpu_flags`, so `isa_cap` holds)."""
    flags = cpu_flags() if flags is None else flags
    return "avx512" if "avx512f" in flags else "avx2" if AVX2 <= flags else None


def level_for(needs: dict[str, set[str]]) -> str | None:
    """The first level in `needs` (widest first: level -> the CPU flags a kernel needs there) this process meets."""
    flags = cpu_flags()
    return next((level for level, need in needs.items() if need <= flags), None)


@functools.cache  # the sources do not change under a process
def sources_digest(folder: Path = Path(__file__).parent) -> str:
    """A digest of every kernel source and header here: what a timing of specviz's kernels was made with."""
    files = sorted([*folder.glob("*.cpp"), *folder.glob("*.h")])
    return hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:16]


def compiled(source: Path, flags: tuple[str, ...], compiler: str, folder: Path) -> Path:
    """The shared library for this source, compiler and flags: compiled once into `folder` and reused."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what its #include "..." may read
    digest = hashlib.sha256("\n".join([source.read_text(), *headers, version, *flags]).encode()).hexdigest()[:16]
    path = folder / f"{source.stem}-{digest}.so"
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=300):
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
            os.close(fd)
            try:
                subprocess.run([compiler, *flags, str(source), "-o", tmp], capture_output=True, text=True, check=True,
                               timeout=300)
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
    return path


def library(source: Path, flags: tuple[str, ...], needs: set[str], what: str) -> ctypes.CDLL | None:
    """`source` built and loaded, or None where it cannot be here (said once, naming `what` the kernel is and what
    serves instead). Callers cache the result: one build and one sentence per process."""
    missing = needs - cpu_flags()
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    cap = isa_cap() if missing else None
    why = (f"this process is kept below AVX-512 ({cap})" if cap else
           f"this CPU lacks {', '.join(sorted(missing))}" if missing else
           "no C++ compiler was found (set CXX, or install g++)" if compiler is None else None)
    if why is None:
        try:
            return ctypes.CDLL(str(compiled(source, flags, compiler, cache_dir() / "kernels")))
        except (OSError, subprocess.SubprocessError) as e:
            detail = e.stderr.strip().splitlines()[-1] if isinstance(e, subprocess.CalledProcessError) and e.stderr \
                else str(e)
            why = f"it could not be built or loaded ({detail})"
    log.warning(f"{what} is not used: {why}.")
    return None
