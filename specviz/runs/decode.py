"""Speculative decoding as a run: validate -> take the pair -> rounds, streamed as a growing `Trace`.

`decode` streams a whole run; `step` advances a paused one by one round (the app's step mode).
Closing a stream (Stop) closes the engine's generator and releases the pair.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from specviz.engine import Round, speculative_generate
from specviz.runs.job import prepare
from specviz.runs.limits import Limits
from specviz.runs.session import Session
from specviz.runs.trace import Trace


def decode(session: Session, limits: Limits, prompt, settings, source: str = "Run") -> Iterator[Trace]:
    """The same Trace after each round; first, before the pair is taken, with no rounds yet."""
    job = prepare(session, limits, prompt, settings)
    trace = Trace(job.meta, source=source)
    yield trace
    for r in session.stream(lambda pair: speculative_generate(pair, job.ids, job.config)):
        trace.rounds.append(r)
        yield trace


@dataclass
class Stepper:
    """A paused speculative run: step mode advances it one round per call."""

    events: Iterator[Round]
    trace: Trace
    key: tuple
    generation: int
    done: bool = False

    def close(self) -> None:
        try:
            self.events.close()
        except ValueError:  # a step is running right now (Run pressed meanwhile): it ends with its session
            pass


def step(session: Session, limits: Limits, stepper: Stepper | None, prompt, settings
         ) -> tuple[Stepper, Round | None]:
    """Advance by one round: a new run starts when there is none, the last one finished, or the prompt,
    settings or pair changed. Returns the stepper and the new round (None: the run had ended)."""
    job = prepare(session, limits, prompt, settings)
    key = (job.prompt, job.config)
    if stepper is None or stepper.done or stepper.key != key or stepper.generation != session.generation:
        if stepper is not None:
            stepper.close()
        events = session.track(speculative_generate(job.pair, job.ids, job.config))
        stepper = Stepper(events, Trace(job.meta, source="Step mode"), key, session.generation)
    with session.using():
        r = next(stepper.events, None)
    if r is None:
        stepper.done = True
    else:
        stepper.trace.rounds.append(r)
        stepper.done = r.finished is not None
    return stepper, r
