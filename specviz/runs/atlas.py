"""The Atlas as a run: many prompts through the real round loop, one request, then the report.

Every prompt is validated first (`job.prepare`: its length, its tokens against the context), before the
pair is taken; a prompt that fails is one sentence in `problems` and the others still run. Then the pair is
held for the whole request, under one time budget (`limits.max_seconds`, counted once the pair is taken):
past it, the prompt running ends at its next round (finished "budget") and the rest do not start. The state
is yielded after every event, so a consumer shows progress and, when stopped, keeps what was made: `close`
files the prompt cut short with the finished ones.

Each prompt runs speculative decoding (a trace like any run's, so it opens in Replay and Decode) or, with
`race`, races it against the target alone (`runs.race`), which adds the measured speedup.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from specviz.analysis.atlas import Findings, findings
from specviz.analysis.atlas_advice import Advice, advice
from specviz.analysis.predict import CostModel
from specviz.analysis.rejections import PromptRun
from specviz.analysis.stats import estimated_costs
from specviz.engine import DecodeConfig, speculative_generate
from specviz.runs.atlas_input import AtlasPrompt, PromptSet
from specviz.settings.errors import InputError
from specviz.runs.job import Job, prepare
from specviz.settings.limits import Limits, budget
from specviz.runs.race import RaceState, race_decoders
from specviz.serving.session import Session
from specviz.settings.spec import validate
from specviz.runs.trace import Trace
from specviz.serving.turns import quietly

SOURCE = "Atlas"


@dataclass
class AtlasRun:
    """One prompt's run: its trace (rounds, and the target alone's steps when it raced)."""

    prompt: AtlasPrompt
    ids: list[int]
    trace: Trace
    speedup: float | None = None  # measured, when it raced to the end

    @property
    def finished(self) -> str:
        return self.trace.finished or "stopped"


@dataclass
class AtlasState:
    """What an Atlas request has made so far."""

    config: DecodeConfig
    race: bool
    jobs: list[tuple[AtlasPrompt, Job]]  # the prompts that passed validation, in order
    problems: list[str]  # one sentence per prompt skipped
    pair: dict  # draft, target, device, dtype
    special_ids: frozenset[int] = frozenset()
    runs: list[AtlasRun] = field(default_factory=list)
    current: AtlasRun | None = None  # the prompt running now
    race_state: RaceState | None = None  # ... and its race, when racing
    finished: str | None = None  # None while it runs; then done | budget | stopped

    @property
    def total(self) -> int:
        return len(self.jobs)

    @property
    def not_run(self) -> int:
        return self.total - len(self.runs) - (self.current is not None)

    def close(self, reason: str) -> None:
        """End here (stopped, over budget): the prompt cut short is kept with what it made."""
        if self.current is not None:
            self.current.trace = self.race_state.trace(SOURCE) if self.race_state else self.current.trace
            if self.current.trace.rounds:
                self.runs.append(self.current)
            self.current = self.race_state = None
        self.finished = self.finished or reason

    def progress_line(self) -> str:
        done = len(self.runs)
        if self.finished is not None:
            left = f"; {self.not_run} not run" if self.not_run else ""
            return f"{done} of {self.total} prompts ran ({self.finished}{left})."
        now = f": {self.current.prompt.id}" if self.current else ""
        return f"Prompt {min(done + 1, self.total)} of {self.total} running{now} ({done} done)."


def plan(session: Session, limits: Limits, prompts: PromptSet, settings, race: bool) -> AtlasState:
    """Validate the settings (a bad one fails the request) and every prompt (a bad one is skipped)."""
    config = settings if isinstance(settings, DecodeConfig) else validate(DecodeConfig, settings, limits)
    jobs, problems = [], list(prompts.problems)
    for p in prompts.prompts:
        try:
            jobs.append((p, prepare(session, limits, p.prompt, config)))
        except InputError as e:
            problems.append(f"{p.id} skipped: {e}")
    if not jobs:
        raise InputError(f"no prompt can run: {problems[0]}" if problems else "there is no prompt to run.")
    pair = jobs[0][1].pair
    info = dict(draft=pair.draft_name, target=pair.target_name, device=str(pair.device),
                dtype=str(pair.dtype).removeprefix("torch."))
    special = frozenset(getattr(pair.tokenizer, "all_special_ids", None) or ())
    return AtlasState(config, race, jobs, problems, info, special)


def run_all(pair, state: AtlasState, seconds: float) -> Iterator[AtlasState]:
    stop = budget(seconds)
    for prompt, job in state.jobs:
        if stop():
            state.close("budget")
            break
        state.current = AtlasRun(prompt, job.ids, Trace(job.meta, source=SOURCE))
        if state.race:
            for race in race_decoders(pair, job.ids, job.config, job.meta, should_stop=stop):
                state.race_state = race
                yield state
            state.current.trace, state.current.speedup = race.trace(SOURCE), race.speedup
        else:
            for r in speculative_generate(pair, job.ids, job.config, should_stop=stop):
                state.current.trace.rounds.append(r)
                yield state
        state.runs.append(state.current)
        state.current = state.race_state = None
    state.close("budget" if state.runs and state.runs[-1].finished == "budget" else "done")
    yield state


def run_atlas(session: Session, limits: Limits, prompts: PromptSet, settings, race: bool = False
              ) -> Iterator[AtlasState]:
    """The state first (nothing run yet), then after every round (race: every event of either lane), and
    last when finished. Closing the stream (Stop) releases the pair; then call `close("stopped")`."""
    state = plan(session, limits, prompts, settings, race)
    yield state
    # one request for all its prompts: it waits its turn like any other, without showing the queue
    yield from quietly(session.stream(lambda pair: run_all(pair, state, limits.max_seconds), kind="atlas",
                                      work=len(state.jobs)))


def prompt_run(run: AtlasRun) -> PromptRun:
    t = run.trace
    return PromptRun(run.prompt.id, run.prompt.kind, run.prompt.prompt, tuple(run.ids), tuple(t.rounds),
                     t.meta.greedy, tuple(t.ar_steps), run.speedup, run.finished)


@dataclass(frozen=True)
class AtlasReport:
    """Everything the Atlas says: the findings, the advice, and what did not run and why."""

    pair: dict
    config: DecodeConfig
    race: bool
    finished: str
    given: int  # prompts that passed validation
    problems: tuple[str, ...]
    cost: CostModel | None
    findings: Findings
    advice: Advice
    runs: tuple[PromptRun, ...]


def report(state: AtlasState, advise: bool = True) -> AtlasReport:
    """`advise=False`: the findings alone (a view mid-run), without replaying other drafters."""
    runs = tuple(prompt_run(r) for r in state.runs)
    rounds = [r for run in runs for r in run.rounds]
    steps = [s for run in runs for s in run.steps]
    cost = estimated_costs(rounds, steps or None)
    return AtlasReport(state.pair, state.config, state.race, state.finished or "stopped", state.total,
                       tuple(state.problems), cost, findings(runs, cost, state.special_ids),
                       advice(runs, state.config, cost) if advise else Advice((), (), None), runs)
