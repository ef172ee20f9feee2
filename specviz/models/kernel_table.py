"""Where a kernel timing table is kept: one JSON file per machine, torch, thread count and model shapes.

A table measured on one machine says nothing about another (this project's CPUs differed in which kernel was
fast at one row), so the file's name is a digest of everything the timings depend on (`KernelKey`), and the
key is stored inside and compared on load: any change means measuring again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from specviz.models.cache import cache_dir

Costs = dict[str, dict[int, float]]  # kernel -> rows -> seconds


def cpu_fingerprint(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and instruction-set flags (what decides which kernel is fast)."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    first = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines if ":" in line}
    return f"{first.get('model name', platform.machine())} | {first.get('flags', '')}"


@dataclass(frozen=True)
class KernelKey:
    """What a timing table depends on; any change means measuring again."""

    cpu: str
    threads: int
    torch: str
    device: str
    shapes: tuple[str, ...]  # the model's shape keys (kind, shape, dtype), sorted
    sizes: tuple[int, ...]

    @staticmethod
    def of(shapes: Iterable[str], device: torch.device, row_counts: Iterable[int], cpu: str | None = None) -> KernelKey:
        dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        return KernelKey(cpu if cpu is not None else cpu_fingerprint(), torch.get_num_threads(), torch.__version__,
                         dev, tuple(sorted(set(shapes))), tuple(row_counts))

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


def table_path(key: KernelKey, folder: Path | None = None) -> Path:
    if folder is None:
        folder = cache_dir() / "kernels"
    return folder / f"{key.digest()}.json"


def read_keyed(path: Path, key: KernelKey) -> dict | None:
    """A measurement kept for `key`: None if the file is missing, unreadable, or was made for another key (a
    digest collision or a hand-edited file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == json.loads(json.dumps(asdict(key))) else None


def write_keyed(path: Path, key: KernelKey, **fields) -> None:
    """Keep a measurement for `key`: under a lock beside it (two processes measuring at once), written whole to a
    temporary file of its own and moved in place (a reader never sees half a file; a failed write leaves none
    behind). Raises OSError where the cache cannot be written (`keep_keyed` says so instead)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"key": asdict(key), "measured": time.strftime("%Y-%m-%d %H:%M:%S"), **fields}, indent=1)
    with FileLock(path.with_name(path.name + ".lock"), timeout=60):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def keep_keyed(path: Path, key: KernelKey, what: str, log: Callable[[str], None], **fields) -> bool:
    """`write_keyed`, or, where the cache cannot be written (read-only, full), one sentence saying so: the
    measurement serves this process and is taken again at the next start."""
    try:
        write_keyed(path, key, **fields)
        return True
    except (OSError, Timeout) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        log(f"{what} could not be saved to {path.parent} ({reason}): they serve this process and will be measured "
            "again at the next start.")
        return False


def load_table(path: Path, key: KernelKey) -> dict[str, Costs] | None:
    data = read_keyed(path, key)
    if data is None:
        return None
    return {shape: {k: {int(n): t for n, t in per.items()} for k, per in costs.items()}
            for shape, costs in data["costs"].items()}


def save_table(path: Path, key: KernelKey, costs: dict[str, Costs], log: Callable[[str], None]) -> bool:
    return keep_keyed(path, key, "The kernel timings", log, costs=costs)
