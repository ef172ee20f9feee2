"""The race a visitor watches is timed as the bench times it: no page's work overlaps a timed forward
(`serving.quiet`, `pacing.paced`'s settle), and a race whose lanes ran slower than the load measured says so and is
not recorded (`runs.race.stray_note`)."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace

import pytest

from helpers import NO_WAIT
from specviz.engine.events import Round, Step
from specviz.models import PairSpec
from specviz.models.step_timing import StepReference
from specviz.runs.race import STRAY, race_state, stray_note
from specviz.serving.pacing import Pace, paced
from specviz.serving.quiet import Quiet, runnable
from specviz.serving.session import Session
from specviz.settings.limits import Limits
from specviz.ui import live
from specviz.ui.handlers import Options

PROMPT = "the man said that it was good and"
SETTINGS = {"k": 4, "max_new_tokens": 12, "adaptive": "fixed"}


class FakeMachine:
    """A run queue and a clock: `busy[t]` other tasks runnable at fake time t (ms), advanced by `sleep`."""

    def __init__(self, busy: dict[int, int]):
        self.busy, self.now = busy, 0.0

    def count(self) -> int:
        return 1 + self.busy.get(int(self.now * 1000), 0)  # the reader counts itself

    def sleep(self, s: float) -> None:
        self.now += s


def settle(quiet: Quiet, machine: FakeMachine) -> tuple[bool, float]:
    ok = quiet.settle(machine.count, clock=lambda: machine.now, sleep=machine.sleep)
    return ok, machine.now


def test_settle_waits_out_a_burst_and_not_a_browser_idling():
    quiet = Quiet(cap=0.5, window=0.05, poll=0.001, busy=0.25)
    burst = {t: 2 for t in range(60)}  # a page rendering: two tasks runnable for 60 ms
    ok, waited = settle(quiet, FakeMachine(burst))
    assert ok and 0.084 <= waited <= 0.11  # the burst, then a window quiet enough
    idling = {t: 1 for t in range(0, 500, 5)}  # a browser compositing a frame now and then (a fifth of a core)
    ok, waited = settle(quiet, FakeMachine(idling))
    assert ok and waited < 0.06
    ok, waited = settle(quiet, FakeMachine({t: 1 for t in range(1000)}))  # busy all along: gives up at the cap
    assert not ok and waited == pytest.approx(0.5, abs=0.002)


def test_settle_returns_at_once_without_a_run_queue_or_a_cap():
    machine = FakeMachine({t: 3 for t in range(1000)})
    assert Quiet(cap=0.0).settle(machine.count, clock=lambda: machine.now, sleep=machine.sleep)
    assert Quiet().settle(lambda: None, clock=lambda: machine.now, sleep=machine.sleep)
    assert machine.now == 0.0


def test_a_run_stops_waiting_once_the_machine_stays_busy_and_waits_again_only_in_a_new_run():
    """A workshop's other visitors keep the machine busy: waiting cannot end that, and would make each event of every
    visitor's run wait the cap (a run of 60 events: 30 s)."""
    busy = FakeMachine({t: 2 for t in range(100_000)})
    machine = {"count": busy.count, "clock": lambda: busy.now, "sleep": busy.sleep}
    settle = Quiet(cap=0.5).for_run(**machine)
    assert [settle() for _ in range(60)] == [False] * 60
    assert busy.now == pytest.approx(0.5 * Quiet().patience, abs=0.01)  # `patience` waits to the cap, then none
    burst = FakeMachine({t: 2 for t in range(600)} | {t: 2 for t in range(1200, 1800)})  # a slow page, twice
    machine = {"count": burst.count, "clock": lambda: burst.now, "sleep": burst.sleep}
    settle = Quiet(cap=0.5, patience=2).for_run(**machine)
    assert [settle(), settle()] == [False, True]
    burst.now = 1.2  # a forward ran
    assert settle() is False  # the second slow page: not in a row with the first, so it keeps waiting
    assert settle() is True and burst.now > 1.84


def test_a_run_does_not_wait_while_another_visitor_waits_for_the_model():
    busy = FakeMachine({t: 2 for t in range(100_000)})
    machine = {"count": busy.count, "clock": lambda: busy.now, "sleep": busy.sleep}
    queue = [True]
    settle = Quiet(cap=0.5).for_run(lambda: queue[0], **machine)
    assert settle() is False and busy.now == 0.0  # someone waits: no wait at all
    queue[0] = False
    assert settle() is False and busy.now == pytest.approx(0.5, abs=0.01)  # alone again: it waits


def test_the_run_queue_is_read_where_linux_has_one(tmp_path):
    assert runnable(tmp_path / "missing") is None
    (tmp_path / "loadavg").write_text("0.50 0.40 0.30 3/120 4567\n")
    assert runnable(tmp_path / "loadavg") == 3


def test_paced_settles_before_the_first_event_and_after_each_shown_one_before_the_next_is_made():
    log = []

    def events():
        for i in range(4):
            log.append(f"made {i}")
            yield Step(i, None, "", 0.0, finished="length" if i == 3 else None)

    times = iter([0.0, 0.05, 0.2, 0.21])  # shown: the first, the third (0.2 s on) and the last
    for event, show in paced(events(), 0.15, clock=lambda: next(times), settle=lambda: log.append("settle")):
        log.append(f"shown {event.index}" if show else f"skipped {event.index}")
    assert log == ["settle", "made 0", "shown 0", "settle", "made 1", "skipped 1", "made 2", "shown 2", "settle",
                   "made 3", "shown 3", "settle"]


def steps(ms: float, n: int = 8) -> list[Step]:
    return [Step(i, None, "", ms / 1e3) for i in range(n)]


def rounds(draft_ms: float, n: int = 6, k: int = 4) -> list[Round]:
    return [Round(index=i, drafter="model", k=k, drafted=[], n_accepted=k, emitted=None, new_token_ids=[], position=0, text="",
                  draft_time=k * draft_ms / 1e3, verify_time=0.1, overhead_time=0.0) for i in range(n)]


def raced(ar_ms: float, draft_ms: float):
    state = race_state(None)
    state.ar.events, state.spec.events = steps(ar_ms), rounds(draft_ms)
    return state


def test_a_lane_slower_than_the_load_measured_is_named_and_a_lane_within_noise_is_not():
    reference = StepReference(target_s=0.100, draft_s=0.020)
    assert stray_note(reference, raced(110, 21)) is None
    assert stray_note(None, raced(500, 500)) is None  # nothing measured at load: nothing to judge by
    note = stray_note(reference, raced(1e3 * 0.100 * STRAY + 5, 21))
    assert f"the target alone's steps took {100 * STRAY + 5:.0f} ms each, {STRAY + 0.05:.2f}x" in note
    assert "not recorded" in note
    note = stray_note(reference, raced(100, 1e3 * 0.020 * STRAY + 2))
    assert "the speculative lane's draft steps" in note
    assert stray_note(replace(reference, draft_s=None), raced(100, 100)) is None  # no draft model (lookup)
    assert stray_note(StepReference(0.001, 0.001), raced(9, 9)) is None  # a tiny model's steps: overhead, not judged


@pytest.fixture()
def slow_pair(tiny, monkeypatch):
    """The tiny pair whose target forward costs `FORWARD` seconds (a sleep: only when it runs matters here), each
    forward's (start, end) noted."""
    forwards = []
    target = tiny.target
    forward = target.forward

    def slow(*args, **kwargs):
        t0 = time.monotonic()
        time.sleep(FORWARD)
        out = forward(*args, **kwargs)
        forwards.append((t0, time.monotonic()))
        return out

    monkeypatch.setattr(target, "forward", slow)
    return Session(tiny, PairSpec("tiny", "tiny", draft_quant="none")), forwards


FORWARD = 0.03  # seconds a slowed target forward takes; a slow page's work after each view takes as long
BURN = hashlib.sha256(b"x" * (1 << 16)).digest() * (1 << 12)  # 128 KiB: sha256 releases the GIL while it hashes


def slow_page(intervals: list) -> None:
    """A browser's work after a view: CPU for about a forward's length, on another thread, noted (start, end)."""
    def work():
        t0 = time.monotonic()
        while time.monotonic() - t0 < FORWARD:
            hashlib.sha256(BURN).digest()
        intervals.append((t0, time.monotonic()))
    threading.Thread(target=work, daemon=True).start()


def overlap(a: list, b: list) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def watched(session: Session, quiet: Quiet) -> tuple[list, object]:
    """A Live race whose every view is followed by a slow page's work; the page's intervals and the last update."""
    page, last = [], None
    options = Options(Pace(0.0, 0.0, quiet, timed_every=0.0))
    for update in live.live(session, Limits(), PROMPT, SETTINGS, options=options):
        last = update
        slow_page(page)
    time.sleep(2 * FORWARD)  # the last view's work ends
    return page, last


def test_a_slow_page_never_overlaps_a_timed_forward_and_without_the_wait_it_does(slow_pair):
    session, forwards = slow_pair
    # (patience: another test on the other core may keep the machine busy past the cap; the wait is what is tested)
    page, last = watched(session, Quiet(cap=2.0, patience=10**6))
    assert last.race is not None and len(page) >= 12 and len(forwards) >= 12
    assert overlap(page, forwards) == 0.0

    forwards.clear()  # the control: today's code, the next forward made as soon as the view is handed on
    page, _ = watched(session, NO_WAIT)
    assert overlap(page, forwards) > 0.25 * FORWARD * len(page)


def test_a_timed_run_is_shown_seldom_where_its_page_is_waited_for():
    """A view, and the page's work and wait after it, every `timed_every` seconds: not one per token of the target
    alone. Without waits (cap 0: nothing to space out) the plain interval holds."""
    assert Pace().timed_interval == Pace().timed_every > Pace().min_interval
    assert Pace(min_interval=0.05, quiet=NO_WAIT).timed_interval == 0.05
    assert Pace(min_interval=2.0).timed_interval == 2.0  # never more often than the plain interval
    clock = iter(range(100))
    shown = [show for _, show in paced((race_state(None) for _ in range(10)), Pace().timed_interval,
                                       clock=lambda: next(clock) * 0.25)]
    assert shown == [True, False, False, True, False, False, True, False, False, True]
