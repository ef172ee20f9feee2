"""A measurement kept as the machine's (kernel tables, step and dtype choices) is taken once and alone: a second
process measuring the same item waits and reads the first's; timings taken while another process held the item's
lock, or while other processes kept the CPU busy, serve the process that took them and are not kept."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict

import psutil
import torch

from specviz.models.kernel_table import KernelKey, contention, kept_or_measured, others_cpu_seconds, read_keyed, \
    table_path

KEY = KernelKey.of(["shape"], torch.device("cpu"), [1, 2], cpu="a cpu")
HOLDER = """
import json, sys, time
from filelock import FileLock
from specviz.models.kernel_table import KernelKey, write_keyed
path, key, hold = sys.argv[1], KernelKey(**json.loads(sys.argv[2])), float(sys.argv[3])
with FileLock(path + ".measuring"):
    print("measuring", flush=True)
    time.sleep(hold)
    write_keyed(__import__("pathlib").Path(path), key, costs={"theirs": 1})
"""


def ticking(*values):
    """A clock (or CPU counter) that reads the given values in turn."""
    it = iter(values)
    return lambda: next(it)


def holder(path, hold: float) -> subprocess.Popen:
    """Another process measuring the same item: it holds the item's lock for `hold` seconds, then keeps its own."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), json.dumps(asdict(KEY)), str(hold)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "measuring"
    return proc


def test_timings_taken_while_other_processes_kept_the_cpu_busy_serve_but_are_not_kept(tmp_path):
    path, said = table_path(KEY, tmp_path), []
    busy = kept_or_measured(path, KEY, "The kernel timings", lambda: {"costs": 1}, said.append,
                            others=ticking(0.0, 25.0), clock=ticking(0.0, 10.0))  # 2.5 cores of others' for 10 s
    assert busy == ({"costs": 1}, False) and read_keyed(path, KEY) is None
    assert len(said) == 1 and "while other processes kept 2.5 of this machine's cores busy" in said[0]
    quiet = kept_or_measured(path, KEY, "The kernel timings", lambda: {"costs": 2}, said.append,
                             others=ticking(0.0, 0.5), clock=ticking(0.0, 10.0))  # an idle machine's daemons
    assert quiet == ({"costs": 2}, False) and read_keyed(path, KEY)["costs"] == 2 and len(said) == 1
    again = kept_or_measured(path, KEY, "The kernel timings", lambda: 1 / 0, said.append)
    assert again[0]["costs"] == 2 and again[1]  # from the cache: not measured again


def test_other_processes_on_the_cores_a_measurement_leaves_free_are_no_contention():
    assert contention(True, 1.0, threads=1, cores=2) is None  # one core each (the test suite's two workers)
    assert contention(True, 1.0, threads=2, cores=2) is not None  # on the cores it times on
    assert contention(True, 0.2, threads=2, cores=2) is None  # an idle VM's own daemons
    assert "another process" in contention(False, 0.0, threads=1, cores=2)  # its lock never came


def test_a_second_process_waits_for_the_first_and_reads_its_measurement(tmp_path):
    path, said, measured = table_path(KEY, tmp_path), [], []
    proc = holder(path, 2.0)  # long enough that a busy machine still finds the lock held
    data, cached = kept_or_measured(path, KEY, "The kernel timings", lambda: measured.append(1) or {"costs": 0},
                                    said.append, others=ticking(0.0, 0.0))
    proc.wait(timeout=30)
    assert cached and data["costs"] == {"theirs": 1} and not measured  # measured once on this machine
    assert len(said) == 1 and "another process is measuring them on this machine; waiting" in said[0]


def test_timings_taken_while_another_process_held_the_lock_too_long_are_not_kept(tmp_path):
    path, said = table_path(KEY, tmp_path), []
    proc = holder(path, 3.0)
    data, cached = kept_or_measured(path, KEY, "The kernel timings", lambda: {"costs": "mine"}, said.append,
                                    others=ticking(0.0, 0.0), wait=0.3)
    assert data == {"costs": "mine"} and not cached and read_keyed(path, KEY) is None  # used, not kept
    assert "while another process was measuring them too" in said[-1]
    proc.wait(timeout=30)
    assert read_keyed(path, KEY)["costs"] == {"theirs": 1}  # the other process's, measured alone, is the one kept


def busy_seconds() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def test_the_cpu_other_processes_use_is_measured():
    """A real busy process that is not this one's (started through a shell that exits: it belongs to nobody here)
    shows in `others_cpu_seconds` (more load only adds to it)."""
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    spin = psutil.Process(int(shell.stdout))
    try:
        time.sleep(0.3)  # started
        start, before = time.monotonic(), others_cpu_seconds()
        time.sleep(1.5)
        cores = (others_cpu_seconds() - before) / (time.monotonic() - start)
    finally:
        spin.kill()
    assert cores >= 0.6


def test_this_process_own_children_are_not_contention():
    """torch compiles in worker processes of its own: their CPU is the measurement's, not another process's."""
    child = psutil.Process(subprocess.Popen([sys.executable, "-c", "while True: pass"]).pid)
    try:
        time.sleep(0.3)
        busy, others, own = busy_seconds(), others_cpu_seconds(), sum(child.cpu_times()[:2])
        deadline = time.monotonic() + 30  # until the child has used 0.8 s, however busy the cores (not a fixed sleep)
        while (child_used := sum(child.cpu_times()[:2]) - own) <= 0.8 and time.monotonic() < deadline:
            time.sleep(0.25)
        counted = others_cpu_seconds() - others
        assert child_used > 0.8
        assert counted <= busy_seconds() - busy - child_used + 0.2  # the child's seconds are not among the others'
    finally:
        child.kill()
