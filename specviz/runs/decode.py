"""Speculative decoding as a run: validate -> take the pair -> rounds, streamed as a growing `Trace`.

A run that outlasts the request's time budget ends with `finished == "budget"`, its rounds kept. While
other jobs hold the model, a run reports its place in the queue (`Waiting`). A request this server has
already run to the end, greedy or from a fixed seed, is answered from that run's recording (`recorded`).

`decode` streams a whole run; `step` advances a paused one by one round (the app's step mode).
Closing a stream (Stop) closes the engine's generator and releases the pair.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from specviz.engine import Round, speculative_generate
from specviz.engine.events import round_from_dict
from specviz.runs.job import prepare
from specviz.settings.limits import Limits, budget
from specviz.serving.model_thread import ModelThread
from specviz.serving.pacing import pacer
from specviz.serving.recorded import COMPLETE, Recording, clock_time, key_of, Meanwhile, recording
from specviz.serving.session import Session
from specviz.runs.trace import RunMeta, Trace
from specviz.serving.turns import Waiting


def decode(session: Session, limits: Limits, prompt, settings, source: str = "Run", owner: str | None = None
           ) -> Iterator[Trace | Waiting]:
    """The same Trace after each round; first, before the pair is taken, with no rounds yet; between the
    two, a `Waiting` while other jobs are ahead in the queue (`owner`: the browser session asking)."""
    job = prepare(session, limits, prompt, settings)
    key = key_of(session, "run", job.prompt, job.config)
    if (found := session.recordings.get(key) if key else None) is not None:
        with session.beside.job():  # no model, but CPU: a race timed meanwhile says so
            yield from replay_run(found, job.meta, source)
        return
    trace = Trace(job.meta, source=source)
    yield trace
    found = Meanwhile(session.recordings, key)
    rounds = session.stream(lambda pair: speculative_generate(pair, job.ids, job.config,
                                                               should_stop=budget(limits.max_seconds)),
                            kind="run", work=job.config.max_new_tokens, owner=owner, needed=found.missing)
    for r in rounds:
        if isinstance(r, Waiting):
            yield r
            continue
        trace.rounds.append(r)
        if key is not None and r.finished in COMPLETE:  # before the last yield: a consumer may stop there
            session.recordings.put(key, recording([x.to_dict() for x in trace.rounds]))
        yield trace
    if found.recording is not None:  # recorded while this one waited: answered from it
        with session.beside.job():
            yield from replay_run(found.recording, job.meta, source)


def replay_run(found: Recording, meta: RunMeta, source: str, sleep=time.sleep) -> Iterator[Trace]:
    """A recorded run's rounds at their recorded pace (the first after its prompt's reading), as a growing
    Trace labelled with when the run ran."""
    trace = Trace(meta, source=f"{source}, recorded at {clock_time(found.recorded_at)} on this server",
                  recorded_at=found.recorded_at)
    yield trace
    wait = pacer(1.0, sleep=sleep)
    for r in map(round_from_dict, found.items):
        wait(r.prefill_time + r.draft_time + r.verify_time + r.overhead_time)
        trace.rounds.append(r)
        yield trace


EVICTED = ("your paused step-mode run was closed to free memory (paused runs are kept for {seconds} s without a "
           "step, {count} at most on this server); this step starts it again.")


@dataclass
class Stepper:
    """A paused speculative run: step mode advances it one round per call."""

    events: Generator[Round, None, None]
    trace: Trace
    key: tuple
    generation: int
    done: bool = False
    notice: str = ""  # for its owner: why the previous paused run was closed
    worker: ModelThread | None = None  # the session's model thread, where the run is advanced and closed

    def close(self) -> None:
        try:
            if self.worker is None:
                self.events.close()
            else:
                self.worker.call(self.events.close)
        except ValueError:  # a step is running right now (Run pressed meanwhile): it ends with its session
            pass

    @property
    def evicted(self) -> bool:
        """Closed by the session (idle too long, or beyond the cap) before it finished."""
        return not self.done and inspect.getgeneratorstate(self.events) == inspect.GEN_CLOSED


def step(session: Session, limits: Limits, stepper: Stepper | None, prompt, settings, owner: str | None = None
         ) -> tuple[Stepper, Round | None]:
    """Advance by one round: a new run starts when there is none, the last one finished or was closed, or
    the prompt, settings or pair changed. Returns the stepper and the new round (None: the run had ended)."""
    job = prepare(session, limits, prompt, settings)
    key = (job.prompt, job.config)
    closed = stepper is not None and stepper.generation == session.generation and stepper.evicted
    notice = EVICTED.format(seconds=limits.paused_seconds, count=limits.max_paused) if closed else ""
    if notice or stepper is None or stepper.done or stepper.key != key or stepper.generation != session.generation:
        if stepper is not None:
            stepper.close()
        # on the eager steps' dynamic caches: a paused run holding a static cache's buffers would make the next race
        # take new ones, and new buffers are new graphs (compiled inside that race)
        events = speculative_generate(job.pair.eager_steps or job.pair, job.ids, job.config)
        stepper = Stepper(events, Trace(job.meta, source="Step mode"), key, session.generation, notice=notice,
                          worker=session.worker)
    else:
        stepper.notice = ""
    with session.turn("step", owner), session.using():
        r = session.worker.call(lambda: next(stepper.events, None))
        stepper.done = r is None or r.finished is not None
        if stepper.done:
            session.untrack(stepper.events)
        else:
            session.track(stepper.events, limits)
    if r is not None:
        stepper.trace.rounds.append(r)
    return stepper, r
