"""One model thread: every forward of a run (and the load, the compile, the warm-up) happens on the session's
model thread, whichever threads the handlers resume on; and a race during which torch compiled is flagged, not
recorded."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.models.compiled import CompileCounts, is_compiled, with_compiled_step
from specviz.models.tiny import tiny_pair
from specviz.settings.limits import Limits
from specviz.serving.model_thread import ModelThread
from specviz.runs.race import RaceState, race
from specviz.serving.recorded import Recordings
from specviz.serving.session import Session

CONFIG = DecodeConfig(k=3, max_new_tokens=12, adaptive="fixed")


def test_the_model_thread_runs_calls_and_generators_on_itself_and_hands_back_results_and_errors():
    worker = ModelThread()
    assert worker.call(lambda: threading.current_thread().name) == "specviz-model"
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    where, closed = [], []

    def events():
        try:
            for i in range(5):
                where.append(threading.current_thread().name)
                yield i
        finally:
            closed.append(threading.current_thread().name)

    it = worker.iterate(events)
    assert [next(it), next(it)] == [0, 1]
    it.close()  # Stop: the real generator is closed, on the model thread
    assert where == ["specviz-model"] * 2 and closed == ["specviz-model"]
    assert list(worker.iterate(events)) == list(range(5))
    assert worker.call(lambda: worker.call(lambda: 7)) == 7  # model work calling the worker runs at once


def spied(session: Session) -> list[str]:
    """The names of the threads every forward of the session's two models runs on, from now on."""
    seen = []
    for model in (session.pair.target, session.pair.draft):
        model.register_forward_pre_hook(lambda *_: seen.append(threading.current_thread().name))
    return seen


def raced_from_a_pool(session: Session, limits: Limits) -> RaceState:
    """A race advanced as Gradio does: each next() on whichever pool thread is free."""
    states = race(session, limits, "the cat of the dog", CONFIG)
    last = None
    with ThreadPoolExecutor(4) as pool:
        while (state := pool.submit(next, states, None).result()) is not None:
            last = state
    return last


def test_every_forward_of_a_race_advanced_from_a_thread_pool_runs_on_the_model_thread():
    session = Session(tiny_pair(), recordings=Recordings(10**7))
    seen = spied(session)
    state = raced_from_a_pool(session, Limits())
    assert state.done and state.identical and state.timing_note is None
    assert seen and set(seen) == {"specviz-model"}


def test_a_compiled_step_built_on_the_model_thread_serves_races_advanced_from_a_thread_pool(monkeypatch):
    """Loaded (and compiled, and warmed on every cache size) on the model thread; raced from a pool; greedy
    output identical to the target alone; nothing compiled inside the race, so it is recorded."""
    spec = PairSpec("tiny", "tiny", draft_quant="none", step="compiled")
    session = Session(spec=spec, recordings=Recordings(10**7))
    session.load("tiny", "tiny", "float32")
    assert is_compiled(session.pair.target) and is_compiled(session.pair.draft)
    seen = spied(session)
    before = CompileCounts.now()
    state = raced_from_a_pool(session, Limits())
    assert CompileCounts.now().since(before) == CompileCounts()  # warmed at load: every size and buffer set
    assert state.done and state.identical and state.timing_note is None
    assert set(seen) == {"specviz-model"}
    assert len(session.recordings) == 1


def test_a_race_that_meets_a_cache_size_never_compiled_is_flagged_and_not_recorded():
    """Compiled steps whose static caches were never warmed (a pair handed over as it is, not loaded): the race
    compiles inside its timed steps, says so in one sentence, and is not recorded; the next race is clean."""
    import torch

    torch._dynamo.reset()  # as in a fresh process: an earlier test may have compiled the same tiny shapes
    eager = tiny_pair()
    pair = replace(eager, draft=with_compiled_step(eager.draft, sizes=(48, 96)),
                   target=with_compiled_step(eager.target, sizes=(48, 96), widths=(4,)))
    session = Session(pair, recordings=Recordings(10**7))
    state = raced_from_a_pool(session, Limits())
    assert state.done and state.identical
    assert state.timing_note.startswith("This race's speed is not a measure: torch compiled ")
    assert len(session.recordings) == 0
    again = raced_from_a_pool(session, Limits())
    assert again.timing_note is None and len(session.recordings) == 1
