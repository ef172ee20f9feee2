"""Building a kernel's C++ source at first use: once per machine, with the machine's compiler, into the cache.

A source compiles with its flags into `<cache>/kernels/<name>-<digest>.so` (the digest covers the source, the
compiler's version and the flags: any change builds afresh), under a file lock, written whole and moved in place.
Where the CPU lacks what a kernel needs, no compiler is found (`CXX`, else g++) or the build fails, `library` returns
None and logs one sentence; the caller then goes on without that kernel.
"""

from __future__ import annotations

import ctypes
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
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def cpu_flags() -> set[str]:
    return set(cpu_fields().get("flags", "").split())


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
    why = (f"this CPU lacks {', '.join(sorted(missing))}" if missing else
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
