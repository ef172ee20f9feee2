"""The race: the target alone (AR) against speculative decoding, both really run, on one device.

Running both at once on one device would slow both, so the race alternates: it always advances the
lane whose own clock is behind. A lane's clock is the sum of the wall time spent inside that lane's
`next()` (the engine synchronizes the device before yielding), so each clock counts only its own
compute, and neither lane is charged for the other's turns. Which lane takes the very first step
alternates from race to race, so whatever the first forward after a pause costs (caches gone cold)
falls on each lane as often.

Replay uses the same loop with the times recorded in a trace instead of a stopwatch. A race this server has
already run to the end, greedy or from a fixed seed, is answered from its recording (`recorded`): the same
events in the same order, each charged the seconds its lane was charged then, at that pace.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial

from specviz.analysis.divergence import Divergence, first_divergence
from specviz.analysis.stats import RunStats, ratio, run_stats
from specviz.engine import DecodeConfig, Round, Step, autoregressive_generate, speculative_generate
from specviz.engine.events import Finish, round_from_dict, step_from_dict
from specviz.models.compiled import CompileCounts
from specviz.models.step_timing import StepReference
from specviz.runs.job import prepare
from specviz.settings.limits import Limits, budget
from specviz.serving.pacing import pacer
from specviz.serving.recorded import COMPLETE, Recording, key_of, Meanwhile, recording
from specviz.serving.session import Session
from specviz.runs.trace import RunMeta, Trace
from specviz.serving.turns import Waiting

Timed = Callable[[Iterator], tuple[object | None, float]]


def stopwatch(timer: Callable[[], float] = time.perf_counter) -> Timed:
    """Advance an iterator by one event and measure the wall time it took."""
    def timed(it: Iterator):
        t0 = timer()
        event = next(it, None)
        return event, timer() - t0
    return timed


def recorded_time(it: Iterator) -> tuple[object | None, float]:
    """Advance by one event and charge the time the trace recorded for it (replay), the prompt's forward
    included as the live race's stopwatch includes it."""
    event = next(it, None)
    if event is None:
        return None, 0.0
    if isinstance(event, Step):
        return event, event.prefill_time + event.time
    return event, event.prefill_time + event.draft_time + event.verify_time + event.overhead_time


@dataclass
class Lane:
    key: str  # "ar" | "spec"
    title: str
    clock: float = 0.0  # seconds of this lane's own compute
    prefill: float = 0.0  # of which reading the prompt (the engine times it apart)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    events: list = field(default_factory=list)
    points: list[tuple[float, int]] = field(default_factory=list)  # (clock, tokens) after each event
    finished: str | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        """End to end: prompt reading included, as a user waits for it."""
        return ratio(self.tokens, self.clock)

    @property
    def decode_seconds(self) -> float:
        return self.clock - self.prefill

    @property
    def decode_tokens_per_s(self) -> float:
        """Generation alone: what the speculative rounds speed up. Reading the prompt is not sped up (the
        speculative lane even reads it with both models), so a long prompt dilutes the end-to-end gain."""
        return ratio(self.tokens, self.decode_seconds)

    def add(self, event, seconds: float) -> None:
        self.clock += seconds
        self.prefill += event.prefill_time
        self.events.append(event)
        self.token_ids += [event.token.id] if isinstance(event, Step) else event.new_token_ids
        self.text = event.text
        self.points.append((self.clock, self.tokens))
        self.finished = event.finished


@dataclass
class RaceState:
    ar: Lane
    spec: Lane
    meta: RunMeta
    divergence: Divergence | None = None
    recorded: bool = False  # a replay: the clocks are the times a trace recorded
    shared_cpu: bool = False  # another job (a replay, a page rendered) ran on the CPU during the race
    recorded_at: float | None = None  # a recorded answer: when this server ran it (epoch seconds), timed as live
    timing_note: str | None = None  # why this race's speed is not reported (a compiled step that did not hold)

    @property
    def greedy(self) -> bool:
        return self.meta.greedy

    @property
    def lanes(self) -> tuple[Lane, Lane]:
        return self.ar, self.spec

    @property
    def done(self) -> bool:
        return self.ar.finished is not None and self.spec.finished is not None

    @property
    def finished(self) -> str | None:
        """Like a Round's: None until the race is over (both lanes), then the speculative lane's reason."""
        return self.spec.finished if self.done else None

    @property
    def identical(self) -> bool:
        return self.ar.token_ids == self.spec.token_ids

    @property
    def speedup(self) -> float | None:
        """Speculative tokens/s over AR tokens/s, once both lanes have finished."""
        return self.running_speedup if self.done else None

    @property
    def running_speedup(self) -> float | None:
        """The same ratio so far (each lane's tokens over its own clock); None until both lanes have a token."""
        return ratio(self.spec.tokens_per_s, self.ar.tokens_per_s) or None

    @property
    def decode_speedup(self) -> float | None:
        """The ratio of decode tokens/s, prompt reading left out of both lanes."""
        return ratio(self.spec.decode_tokens_per_s, self.ar.decode_tokens_per_s) or None

    def stats(self) -> RunStats:
        """The speculative lane's numbers against the target alone, each timed by its lane's own clock."""
        return run_stats(self.spec.events, self.ar.events, spec_seconds=self.spec.clock, ar_seconds=self.ar.clock)

    def trace(self, source: str = "Race") -> Trace:
        return Trace(self.meta, list(self.spec.events), list(self.ar.events), source=source)

    def check_divergence(self) -> None:
        """Greedy lanes should agree token for token; mark the first difference as soon as both passed it
        (sampled lanes draw different random numbers, so different texts are expected there)."""
        if not self.greedy or self.divergence is not None:
            return
        differs = any(x != y for x, y in zip(self.ar.token_ids, self.spec.token_ids))
        if differs or self.done:
            self.divergence = first_divergence(self.spec.events, self.ar.events)


def race_state(meta: RunMeta, **kwargs) -> RaceState:
    """A race before its first event."""
    return RaceState(Lane("ar", "Target alone (autoregressive)"), Lane("spec", "Speculative decoding"), meta,
                     **kwargs)


def alternate(ar_events: Iterator[Step], spec_events: Iterator[Round], meta: RunMeta, timed: Timed,
              recorded: bool = False, first: str = "spec") -> Iterator[RaceState]:
    """Alternate the two event streams, always advancing the lane whose own clock is behind (on a tie, `first`)."""
    state = race_state(meta, recorded=recorded)
    iterators = {"ar": ar_events, "spec": spec_events}
    try:
        while not state.done:
            lane = min((ln for ln in state.lanes if ln.finished is None), key=lambda ln: (ln.clock, ln.key != first))
            event, seconds = timed(iterators[lane.key])
            if event is None:  # a stream that ends without a finished event (a truncated trace)
                lane.finished = lane.finished or "stopped"
            else:
                lane.add(event, seconds)
            state.check_divergence()
            yield state
    finally:
        for it in iterators.values():
            close = getattr(it, "close", None)
            if close is not None:
                close()


def taping(timed: Timed, tape: list) -> Timed:
    """`timed`, noting each event with the seconds its lane is charged, in the order they run."""
    def timed_and_taped(it: Iterator):
        event, seconds = timed(it)
        if event is not None:
            tape.append(("ar" if isinstance(event, Step) else "spec", event, seconds))
        return event, seconds
    return timed_and_taped


def race_decoders(pair, prompt_ids: list[int], config: DecodeConfig, meta: RunMeta,
                  timer: Callable[[], float] = time.perf_counter, first: str = "spec",
                  should_stop: Callable[[], Finish] = lambda: None, tape: list | None = None) -> Iterator[RaceState]:
    """Race the real decoders on the same prompt and settings (same seed for both); `tape` collects the events."""
    timed = stopwatch(timer) if tape is None else taping(stopwatch(timer), tape)
    return alternate(autoregressive_generate(pair, prompt_ids, config, should_stop=should_stop),
                     speculative_generate(pair, prompt_ids, config, should_stop=should_stop),
                     meta, timed, first=first)


def race(session: Session, limits: Limits, prompt, settings, owner: str | None = None, first: bool = False
         ) -> Iterator[RaceState | Waiting]:
    """Validate, take the pair, race: the state after every event of either lane (a `Waiting` while other jobs
    are ahead in the queue; `owner`: the browser session asking; `first`: the presenter's, ahead of the waiting).
    Past the request's time budget each lane ends at its next event (`finished == "budget"`). A recorded request
    streams its recording instead."""
    job = prepare(session, limits, prompt, settings)
    key = key_of(session, "race", job.prompt, job.config)
    if (found := session.recordings.get(key) if key else None) is not None:
        return beside(session, replay_recorded(found, job.meta))
    return raced(session, limits, job, key, owner, first)


def raced(session: Session, limits: Limits, job, key, owner: str | None, first_in_line: bool = False
          ) -> Iterator[RaceState | Waiting]:
    """The race on the model, in its turn; if the same request was recorded while this one waited (many
    visitors clicking one example at once), that recording instead, the model left to the next job."""
    first = "spec" if session.next_race() % 2 == 0 else "ar"

    def run(pair) -> Iterator[RaceState]:
        started, compiles = session.beside.started, CompileCounts.now()
        stop = budget(limits.max_seconds)
        tape = [] if key is not None else None
        with closing(race_decoders(pair, job.ids, job.config, job.meta, first=first, should_stop=stop,
                                   tape=tape)) as states:
            for state in states:
                state.shared_cpu = state.shared_cpu or session.beside.since(started)
                if state.done:
                    state.timing_note = timing_note(CompileCounts.now().since(compiles), session, pair, state)
                if tape is not None and state.done and state.timing_note is None and \
                        {state.ar.finished, state.spec.finished} <= set(COMPLETE):
                    items = [(lane, event.to_dict(), seconds) for lane, event, seconds in tape]
                    session.recordings.put(key, recording(items, state.shared_cpu))
                yield state

    found = Meanwhile(session.recordings, key)
    yield from session.stream(run, kind="race", work=job.config.max_new_tokens, owner=owner, needed=found.missing,
                              first=first_in_line, progress=partial(race_done, tokens=job.config.max_new_tokens))
    if found.recording is not None:
        yield from beside(session, replay_recorded(found.recording, job.meta))


def race_done(state: RaceState, tokens: int) -> float:
    """The share of a race done: its lanes' tokens over both lanes' `tokens` (a finished lane's all done). The
    lanes take turns by their clocks, so this grows about as the race's time does."""
    return sum(1.0 if lane.finished else min(lane.tokens / max(tokens, 1), 1.0) for lane in state.lanes) / 2


def timing_note(compiled: CompileCounts, session: Session, pair, state: RaceState) -> str | None:
    """Why a finished race's speed is not reported, in one sentence (None: it is): torch compiled during it, the
    target's compiled step did not hold in use (`Session.check_steps`, judged only on a race free of compiles), or
    a lane ran slower than its steps did after the load (`stray_note`). Such a race is not recorded either."""
    if (why := compiled.sentence()) is not None:
        return f"This race's speed is not a measure: {why}; the next race runs on what was compiled."
    return session.check_steps(pair, state.ar.events, state.shared_cpu) or stray_note(pair.reference, state)


# A lane whose median forward took more than this times the same step timed warm after the load is not a measure:
# something else used the machine while it was timed. On a 2-core Zen 4 VM whose memory bandwidth wandered 21-41 GB/s
# from minute to minute (a shared host), races with nothing else running took 0.9-1.34x the load's steps; with a
# browser rendering each update on the same cores, before `serving.quiet`, the target alone took 1.4-1.7x.
STRAY = 1.3
MIN_JUDGED = 4  # forwards a lane must make before its median judges it
MIN_REFERENCE_S = 0.005  # a step shorter than this is mostly the host's own overhead: its noise judges nothing


def stray_note(reference: StepReference | None, state: RaceState) -> str | None:
    """One sentence where a finished race's lane ran slower than its model's step timed after the load
    (`ModelPair.reference`) by more than `STRAY`: the target alone's one-token steps, or the speculative lane's draft
    steps (a round's drafting over its drafted tokens); None where both held, or nothing to judge by."""
    if reference is None:
        return None
    lanes = [("the target alone's steps", [s.time for s in state.ar.events], reference.target_s),
             ("the speculative lane's draft steps", [r.draft_time / r.k for r in state.spec.events if r.k],
              reference.draft_s)]
    for name, times, expected in lanes:
        if expected and expected >= MIN_REFERENCE_S and len(times) >= MIN_JUDGED and \
                (took := statistics.median(times)) > STRAY * expected:
            return (f"This race's speed is not a measure: {name} took {1e3 * took:.0f} ms each, {took / expected:.2f}x "
                    f"what they took after the load ({1e3 * expected:.0f} ms): something else used this machine "
                    "while they ran. It is not recorded; run it again.")
    return None


def beside(session: Session, states: Iterator) -> Iterator:
    """A stream that runs beside the model's queue (no model, some CPU): a race timed meanwhile says so."""
    with session.beside.job(), closing(states):
        yield from states


def replay_recorded(found: Recording, meta: RunMeta, sleep=time.sleep) -> Iterator[RaceState]:
    """A recorded race: at once the state before any event (labelled), then every event in the order it ran,
    each after the seconds its lane was charged then, so the clocks, rates and verdict are that run's."""
    state = race_state(meta, recorded_at=found.recorded_at, shared_cpu=found.shared_cpu)
    yield state
    wait = pacer(1.0, sleep=sleep)
    for lane, event, seconds in found.items:
        wait(seconds)
        if lane == "ar":
            state.ar.add(step_from_dict(event), seconds)
        else:
            state.spec.add(round_from_dict(event), seconds)
        state.check_divergence()
        yield state


def replay_race(trace: Trace) -> Iterator[RaceState]:
    """The same race over a recorded trace, each lane charged its recorded times."""
    return alternate(iter(trace.ar_steps), iter(trace.rounds), trace.meta, recorded_time, recorded=True)
