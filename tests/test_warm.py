"""While a shown run waits for its page, idle-priority spinners hold the cores (`serving.warm`): running only inside
`held`, at SCHED_IDLE, stopped before the next forward, left out of the run queue the wait reads, gone with the
server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from specviz.serving.quiet import Quiet
from specviz.serving.warm import Warmers

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spinners are a Linux mechanism")


def state(pid: int) -> str:
    """/proc's state letter: R running, T stopped."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if state(pid) in "ZX":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@linux
def test_spinners_run_at_idle_priority_only_while_held_and_die_when_closed():
    warm = Warmers(count=2)
    assert warm.procs is None  # nothing starts before a run waits
    with warm.held() as spinning:
        assert spinning == 2
        time.sleep(0.05)
        assert [state(p.pid) for p in warm.procs] == ["R", "R"]
        assert all(os.sched_getscheduler(p.pid) == os.SCHED_IDLE for p in warm.procs)
    assert [state(p.pid) for p in warm.procs] == ["T", "T"]  # stopped before `held` returns, not some time later
    first = [p.pid for p in warm.procs]
    with warm.held():
        pass
    assert [p.pid for p in warm.procs] == first  # started once
    warm.close()
    assert all(gone(pid) for pid in first)


@linux
def test_spinners_die_with_the_server():
    server = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom specviz.serving.warm import Warmers\nw = Warmers(count=2)\n"
        "with w.held():\n    pass\nprint(*[p.pid for p in w.procs], flush=True)\ntime.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in server.stdout.readline().split()]
    assert len(pids) == 2 and all(state(pid) == "T" for pid in pids)
    server.send_signal(signal.SIGKILL)  # no cleanup of its own runs
    server.wait()
    assert all(gone(pid) for pid in pids)


def test_no_spinners_where_there_are_no_cores_to_hold():
    warm = Warmers(count=0)
    with warm.held() as spinning:
        assert spinning == 0
    assert warm.procs == []


class FakeWarm:
    """`held` as Warmers has it, counting its uses; `spinning` tasks it adds to the run queue while held."""

    def __init__(self, spinning: int):
        self.spinning, self.holds, self.inside = spinning, 0, False

    @contextmanager
    def held(self):
        self.holds += 1
        self.inside = True
        try:
            yield self.spinning
        finally:
            self.inside = False


def test_the_wait_holds_the_cores_and_does_not_count_its_own_spinners_as_the_page():
    now = [0.0]
    warm = FakeWarm(2)

    def count() -> int:  # the reader, plus the two spinners while they are held: nothing else runs
        return 1 + (warm.spinning if warm.inside else 0)

    def sleep(s: float) -> None:
        now[0] += s
    settle = Quiet(cap=0.5).for_run(warm=warm, count=count, clock=lambda: now[0], sleep=sleep)
    assert settle() is True and now[0] < 0.06 and warm.holds == 1
    # the control: the same spinners counted as other work look like a page that never settles
    now[0] = 0.0
    assert Quiet(cap=0.5).settle(lambda: 1 + warm.spinning, clock=lambda: now[0], sleep=sleep) is False
    assert now[0] == pytest.approx(0.5, abs=0.002)


def test_no_wait_no_spinners():
    warm = FakeWarm(2)
    assert Quiet(cap=0.0).for_run(warm=warm)() is True
    assert Quiet(cap=0.5).for_run(lambda: True, warm=warm)() is False  # another visitor waits: no wait at all
    assert warm.holds == 0
