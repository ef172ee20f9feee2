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

import psutil
import torch
from filelock import FileLock, Timeout

from specviz.cache import cache_dir
from specviz.kernels.build import cpu_fields, isa_cap, sources_digest

Costs = dict[str, dict[int, float]]  # kernel -> rows -> seconds
MEASURE_WAIT = 900.0  # seconds a process waits for another measuring the same item (a kernel table takes minutes)
# other processes' CPU, in cores, a measurement tolerates beyond the cores its threads leave free: an idle VM's own
# daemons stay far below it; one other busy process on a core this process times on does not
SPARE_CORES = 0.25


def cpu_fingerprint(cpuinfo: str = "/proc/cpuinfo", environ=os.environ) -> str:
    """The CPU's model name and instruction-set flags (what decides which kernel is fast), and the setting that keeps
    this process below AVX-512 where one does (torch's and oneDNN's kernels change with it)."""
    fields = cpu_fields(cpuinfo)
    if not fields:
        return platform.processor() or platform.machine()
    cap = isa_cap(environ)
    return f"{fields.get('model name', platform.machine())} | {fields.get('flags', '')}" + (f" | {cap}" if cap else "")


@dataclass(frozen=True)
class KernelKey:
    """What a timing table depends on; any change means measuring again."""

    cpu: str
    threads: int
    torch: str
    device: str
    shapes: tuple[str, ...]  # the model's shape keys (kind, shape, dtype), sorted
    sizes: tuple[int, ...]
    code: str = ""  # specviz's own kernels' sources (a kernel made faster or slower is timed again)

    @staticmethod
    def of(shapes: Iterable[str], device: torch.device, row_counts: Iterable[int], cpu: str | None = None) -> KernelKey:
        dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        return KernelKey(cpu if cpu is not None else cpu_fingerprint(), torch.get_num_threads(), torch.__version__,
                         dev, tuple(sorted(set(shapes))), tuple(row_counts), sources_digest())

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


def others_cpu_seconds() -> float:
    """CPU seconds the machine has spent busy (steal included: a neighbour VM's), less this process's own and its
    children's (torch's compile workers are this measurement's own work, not contention)."""
    t, me = psutil.cpu_times(), psutil.Process()
    busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    mine = me.cpu_times()
    own = mine.user + mine.system + mine.children_user + mine.children_system  # (children waited for)
    for child in me.children(recursive=True):  # children still running
        try:
            times = child.cpu_times()
            own += times.user + times.system
        except psutil.Error:  # it ended meanwhile
            continue
    return busy - own


def contention(held: bool | None, others_cores: float, threads: int, cores: int | None = None) -> str | None:
    """Why a measurement is not the machine's (None: it is): another process measured the same item beside it, or
    other processes used more of the CPU meanwhile than the cores its threads left free."""
    if held is False:
        return "while another process was measuring them too (its lock was not freed in time)"
    free = max((cores or os.cpu_count() or 1) - threads, 0)
    if others_cores > free + SPARE_CORES:
        return f"while other processes kept {others_cores:.1f} of this machine's cores busy"
    return None


def kept_or_measured(path: Path, key: KernelKey, what: str, measure: Callable[[], dict], log: Callable[[str], None],
                     others: Callable[[], float] | None = None, wait: float = MEASURE_WAIT,
                     clock: Callable[[], float] = time.monotonic) -> tuple[dict, bool]:
    """The measurement kept for `key`, else `measure()` taken now; and whether it came from the cache. Measured once
    per machine: under a lock for this item, so a second process waits and then reads the first's; and kept only if
    taken alone (`contention`): a busy machine's timings would otherwise be kept as its own for good. One sentence
    (`log`) says when they are not kept. `others`: the CPU seconds other processes have used (`others_cpu_seconds`,
    looked up at the call: a test isolates itself from the machine's load by replacing it)."""
    others = others or others_cpu_seconds
    if (kept := read_keyed(path, key)) is not None:
        return kept, True
    lock = FileLock(path.with_name(path.name + ".measuring"), timeout=wait)
    try:
        lock.acquire(timeout=0)
        held: bool | None = True
    except Timeout:
        log(f"{what}: another process is measuring them on this machine; waiting for its result (at most "
            f"{wait:.0f} s)…")
        try:
            lock.acquire()
            held = True
        except Timeout:
            held = False
    except OSError:  # an unwritable cache: no lock to take, and nothing will be kept (`keep_keyed` says so)
        held = None
    try:
        if held and (kept := read_keyed(path, key)) is not None:  # the other process's, measured while we waited
            return kept, True
        start, before = clock(), others()
        fields = measure()
        why = contention(held, (others() - before) / max(clock() - start, 1e-9), key.threads)
        if why is not None:
            log(f"{what} were measured {why}: they serve this process and will be measured again at the next start.")
        else:
            keep_keyed(path, key, what, log, **fields)
        return fields, False
    finally:
        if held:
            lock.release()


def table_costs(data: dict) -> dict[str, Costs]:
    """A kernel table's costs, rows as integers (JSON keeps them as text)."""
    return {shape: {k: {int(n): t for n, t in per.items()} for k, per in costs.items()}
            for shape, costs in data["costs"].items()}
