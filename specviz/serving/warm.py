"""Keeping the cores awake while a timed run waits for the page, without taking them from the page.

After each shown view a race waits for the page's work (`serving.quiet`). A core left idle that long falls asleep (a
VM's vCPU is descheduled, a laptop's core clocks down), and the next forward pays for waking it. Measured on a
2-core AMD EPYC Zen 4 under KVM, the race's own lanes, six paired races: the target's one-token step after a 0.15 s
idle wait took 1.21x what it took straight after another step; the same wait spent with idle-priority spinners on
the cores, 1.055x (through the product's own wait, `Quiet.for_run`: 1.13x idle, 1.03x held). A page waits after
every shown event, one a token for the target alone and one a round for speculation, so idle waits slowed the
target-alone lane most and inflated the speedup the page showed.

So while a run waits, one spinner a core runs at SCHED_IDLE: the kernel gives it a core only when nothing else wants
one, so the browser painting is not slowed; it is stopped (SIGSTOP) before the next timed forward. Spinners are
processes (a thread of ours would take the interpreter's lock from the model thread) that die with the server
(PR_SET_PDEATHSIG). Where they cannot start (not Linux, no fork), runs wait as before, idle.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

# the spinner: dies with its parent, asks for the idle class (else the lowest nice), then spins
SPIN = """import ctypes, os, signal, sys
with __import__("contextlib").suppress(Exception):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit()
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    os.nice(19)
sys.stdout.write("r")
sys.stdout.flush()
while True:
    pass
"""


READY_S = 5.0  # at most this long for a spinner to start (an interpreter's start, a few tens of ms)


def cores() -> int:
    """The cores this process may run on (the model's threads run on them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spawn(count: int) -> list[subprocess.Popen]:
    """`count` spinners, stopped; none where they cannot start (not Linux, no processes left)."""
    if not sys.platform.startswith("linux") or count <= 0:
        return []
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        for p in procs:  # stopped once at idle priority (a spinner stopped before that would wake at full priority)
            if select.select([p.stdout], [], [], READY_S)[0]:
                p.stdout.read(1)
        signal_all(procs, signal.SIGSTOP)
    except OSError:
        kill(procs)
        return []
    return procs


def kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with suppress(OSError):
            p.kill()
            p.wait(timeout=5)


@dataclass
class Warmers:
    """One idle-priority spinner a core (`count`, default: this process's cores), started at the first `held`."""

    count: int = field(default_factory=cores)
    procs: list[subprocess.Popen] | None = None  # None: not started yet

    @property
    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs or [] if p.poll() is None]

    @contextmanager
    def held(self) -> Iterator[int]:
        """The spinners run inside (yields how many: they show in the machine's run queue), stopped on leaving."""
        if self.procs is None:
            self.procs = spawn(self.count)
            weakref.finalize(self, kill, self.procs)  # at exit, or when the session goes
        live = self.running
        signal_all(live, signal.SIGCONT)
        try:
            yield len(live)
        finally:
            signal_all(live, signal.SIGSTOP)

    def close(self) -> None:
        kill(self.procs or [])


def signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    """Send `sig` to each; a SIGSTOP returns once every spinner has stopped (the next forward has its cores)."""
    for p in procs:
        with suppress(OSError):
            p.send_signal(sig)
    if sig == signal.SIGSTOP:
        for p in procs:
            with suppress(OSError):
                os.waitpid(p.pid, os.WUNTRACED)  # reports the stop; a spinner that died instead is reaped here
