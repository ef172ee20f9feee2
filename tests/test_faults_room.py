"""The room cannot be held: a run whose stream stopped advancing (its client gone, its generator never closed) is
stopped by the next job in line once it has given nothing for the run's time limit; a pair load takes its turn in
the same queue as the runs; a load past its time limit is given up and the served pair goes on serving. Every
wait here is bounded, so a room that stays held fails the test instead of stalling the suite."""

from __future__ import annotations

import threading
import time

import pytest

from specviz.engine import DecodeConfig, speculative_generate
from specviz.models import ModelLoadError, PairSpec
from specviz.models.tiny import tiny_pair
from specviz.serving.session import Session
from specviz.serving.turns import Waiting, quietly

CONFIG = DecodeConfig(k=3, max_new_tokens=40, adaptive="fixed")
IDS = [3, 1, 4, 1, 5]


def tiny_session(**kw) -> Session:
    # the tiny pair as built, on its eager one-token steps (step="eager" says so): a pair loaded here is then loaded
    # the same way, without compiling a step (seconds, the first time in a process) that none of these tests is about
    return Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none", step="eager"), **kw)


def rounds(session: Session):
    return session.stream(lambda pair: speculative_generate(pair, IDS, CONFIG))


def holding(session: Session):
    """A run that took the model and gave one round, then was left by its client without being closed."""
    run = rounds(session)
    first = next(run)
    assert not isinstance(first, Waiting) and session.lock.locked()
    return run


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def work():
        try:
            out["result"] = fn()
        except Exception as e:  # noqa: BLE001 - the test reads it
            out["error"] = e
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, out


def test_a_run_that_stopped_advancing_is_stopped_and_the_next_in_line_served():
    session = tiny_session()
    session.turns.stall_seconds = 0.5  # `specviz serve` sets the run's time limit (`--max-seconds`)
    left = holding(session)
    start = time.monotonic()
    thread, out = in_thread(lambda: list(quietly(rounds(session))))
    thread.join(timeout=30)
    assert not thread.is_alive(), "the queue stayed held by a run that gave nothing"
    waited = time.monotonic() - start
    assert out["result"][-1].finished is not None and 0.5 <= waited < 5  # served once the watchdog fired
    with pytest.raises(StopIteration):
        next(left)  # the stalled run was closed: it cannot come back and run beside the next
    assert not session.lock.locked() and len(session.turns) == 0


def test_a_slow_consumer_that_keeps_advancing_is_not_stopped():
    session = tiny_session()
    now = [0.0]  # the watchdog's clock: 0.3 s between rounds on any machine (a busy one stretched real sleeps)
    session.turns.stall_seconds, session.turns.clock, session.turns.refresh = 0.5, lambda: now[0], 0.01
    run = rounds(session)
    got = [next(run)]
    thread, out = in_thread(lambda: list(quietly(rounds(session))))
    for event in run:  # slow, 1.5 s holding the model in all, never stalled
        got.append(event)
        now[0] += 0.3
        time.sleep(0.05)  # real time for the waiter's checks (every 0.01 s) to look at the clock
        if len(got) == 6:
            break
    assert len(got) == 6 and not isinstance(next(run), Waiting)  # not stopped: it gives its next round still
    assert thread.is_alive() and "result" not in out  # still waiting behind the slow run
    run.close()
    thread.join(timeout=30)
    assert out["result"][-1].finished is not None


def test_a_pair_load_waits_its_turn_in_the_queue_behind_a_run():
    session = tiny_session(allow_switch=True)
    served, said = session.pair, []
    run = holding(session)
    thread, out = in_thread(lambda: session.switch("tiny", "tiny", "bfloat16", status=said.append))
    deadline = time.monotonic() + 30
    while not any(line.startswith("Waiting for the model: 1 job(s) ahead") for line in said):
        assert time.monotonic() < deadline, f"the load did not wait its turn: {said}"
        time.sleep(0.01)
    assert session.pair is served and len(session.turns) == 2  # the run goes on, on the pair it started with
    rest = list(run)
    assert rest[-1].finished is not None
    thread.join(timeout=60)
    assert "error" not in out and session.pair is not served and str(session.pair.dtype) == "torch.bfloat16"


def test_a_load_past_its_time_limit_is_given_up_and_the_served_pair_serves_at_once():
    release, done = threading.Event(), threading.Event()

    def slow(*args, **kwargs):  # a load that lasts until the test lets it end (30 s at most)
        release.wait(30)
        pair = tiny_pair()
        done.set()
        return pair
    session = tiny_session(allow_switch=True, loader=slow, load_seconds=0.2)
    served, before = session.pair, set(threading.enumerate())
    with pytest.raises(ModelLoadError, match=r"took longer than 0\.2 s, this server's limit for a load: it was given "
                                             r"up \(now serving: tiny"):
        session.switch("tiny", "tiny", "bfloat16")
    assert not done.is_set() and session.pair is served  # given up while the load still ran
    assert list(quietly(rounds(session)))[-1].finished is not None  # the queue is free: the next run is served...
    assert not done.is_set()  # ...at once: while the given-up load still runs
    release.set()
    assert done.wait(30)
    late = [t for t in set(threading.enumerate()) - before
            if t.name == "specviz-model" and t is not session.worker.thread]
    for thread in late:  # the given-up load's own model thread: it lets the pair go, then ends
        thread.join(30)
    assert late and not any(t.is_alive() for t in late)
    assert session.beside.active == 0 and session.pair is served  # it ran beside the queue; never swapped in
