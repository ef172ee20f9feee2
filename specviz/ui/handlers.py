"""What the app's buttons do: plain functions and generators, values in, values out.

They take the session (the loaded pair), the limits and raw control values; they yield view
dataclasses (`MainView`, `RaceView`, `DistributionView`) that app.py maps onto components. Bad input
raises `gr.Error` with one sentence, so the app keeps serving. Only events are read, never tensors.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from html import escape
from pathlib import Path

import gradio as gr

from specviz import trace as tracefile
from specviz.engine import DecodeConfig, Round, Step, speculative_generate
from specviz.engine.events import CORRECTION, REJECTED, EmittedToken
from specviz.engine.exact import next_token_distribution
from specviz.limits import InputError, Limits, _number, check_prompt_tokens, clean_prompt, decode_config
from specviz.models import ModelLoadError, encode_prompt
from specviz.models.loading import OUT_OF_MEMORY, release_memory
from specviz.race import RaceState, race, replay_race
from specviz.trace import Trace, TraceError
from specviz.ui import figures, render, teach
from specviz.ui.distribution import Comparison, compare, sample_both
from specviz.ui.session import Session
from specviz.ui.stats import race_stats, summarize

USER_ERRORS = (InputError, ModelLoadError, TraceError)


def user_errors(fn: Callable) -> Callable:
    """Turn the errors a user can cause into gr.Error (one sentence in the UI, a clean API error)."""
    def convert(e: BaseException) -> gr.Error:
        if isinstance(e, OUT_OF_MEMORY):
            release_memory(e)  # the run's KV caches and activations live in the traceback's frames
            return gr.Error("out of memory: try fewer new tokens, a smaller K, or a smaller model pair.")
        return gr.Error(str(e), print_exception=False)  # the user's mistake: no traceback in the server log

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except (*USER_ERRORS, *OUT_OF_MEMORY) as e:
                raise convert(e) from e
        return gen

    @functools.wraps(fn)
    def plain(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (*USER_ERRORS, *OUT_OF_MEMORY) as e:
            raise convert(e) from e
    return plain


@dataclass(frozen=True)
class Settings:
    """The decoding controls, as raw values from the UI or the API (validated by `config`)."""

    k: object = 4
    adaptive: object = "fixed"
    drafter: object = "model"
    temperature: object = 0.0
    top_k: object = 0
    top_p: object = 1.0
    seed: object = 0
    max_new_tokens: object = 64

    def config(self, limits: Limits) -> DecodeConfig:
        return decode_config(limits, k=self.k, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                             top_k=self.top_k, top_p=self.top_p, seed=self.seed, drafter=self.drafter,
                             adaptive=self.adaptive)


@dataclass(frozen=True)
class Options:
    """Pacing of the live views: tests set everything to 0."""

    min_interval: float = 0.15  # seconds between streamed updates (fast devices make many events)
    stage_delay: float = 0.7  # step mode: pause between the draft, verify and accept stages
    trace_dir: Path | None = None  # where exported traces are written (a temp dir by default)
    assets_dir: Path | None = None  # shipped traces for replay


@dataclass
class RunRecord:
    """What the last run produced: browsable, exportable as a trace."""

    meta: dict
    rounds: list[Round] = field(default_factory=list)
    ar_steps: list[Step] = field(default_factory=list)
    source: str = "run"

    @property
    def greedy(self) -> bool:
        return float(self.meta.get("config", {}).get("sampling", {}).get("temperature", 0.0)) == 0.0

    def trace(self) -> Trace:
        return Trace(self.meta, self.rounds, self.ar_steps)


@dataclass
class Prepared:
    pair: object
    prompt: str
    ids: list[int]
    config: DecodeConfig
    meta: dict


def prepare(session: Session, limits: Limits, prompt, settings: Settings) -> Prepared:
    """Validate everything before any model runs."""
    prompt = clean_prompt(prompt, limits)
    config = settings.config(limits)
    pair = session.require()
    if pair.draft is None and config.drafter != "lookup":
        raise InputError(f"this pair has no draft model: use the 'lookup' drafter (got {config.drafter!r}).")
    ids = encode_prompt(pair.tokenizer, prompt)
    check_prompt_tokens(len(ids), config.max_new_tokens, limits, session.context_length())
    return Prepared(pair, prompt, ids, config, tracefile.meta_for(pair, prompt, ids, config))


# ---------------------------------------------------------------- the main view


@dataclass
class MainView:
    tokens: str  # HTML
    caption: str  # Markdown
    pq: object  # plotly figure
    rounds: dict  # gr.update for the round slider
    positions: dict  # gr.update for the position dropdown
    drill: object  # plotly figure
    stats: str  # Markdown
    stats_fig: object
    record: RunRecord | None


def position_choices(r: Round | None) -> list[tuple[str, int]]:
    if r is None:
        return []
    choices = [(f"{i + 1}: {t.text!r} ({t.status.replace('_', ' ')})", i) for i, t in enumerate(r.drafted)]
    if r.emitted is not None:
        choices.append((f"{r.emitted.kind}: {r.emitted.text!r}", len(r.drafted)))
    return choices


def default_position(r: Round | None) -> int | None:
    """Where to look first: the rejected draft if any, else the correction/bonus, else the last draft."""
    if r is None:
        return None
    for i, t in enumerate(r.drafted):
        if t.status == REJECTED:
            return i
    return len(r.drafted) if r.emitted is not None else (len(r.drafted) - 1 if r.drafted else None)


def token_at(r: Round | None, position) -> object | None:
    if r is None or position is None:
        return None
    try:
        i = int(position)
    except (TypeError, ValueError):
        return None
    if 0 <= i < len(r.drafted):
        return r.drafted[i]
    return r.emitted if i == len(r.drafted) else None


def drill(r: Round | None, position, greedy: bool):
    token = token_at(r, position)
    emitted = r.emitted.id if r is not None and r.emitted is not None and r.emitted.kind == CORRECTION else None
    return figures.drilldown_figure(token, greedy, emitted if not isinstance(token, EmittedToken) else None)


def round_index(n_rounds: int, selected) -> int:
    """The 0-based round a 1-based slider value points at, kept within the rounds (None: the last)."""
    if selected is None:
        return max(n_rounds - 1, 0)
    return max(0, min(int(selected) - 1, n_rounds - 1))


def main_view(record: RunRecord | None, *, show_rejected: bool = True, selected: int | None = None,
              stage: str = "done", live: bool = False) -> MainView:
    """Everything the Decode tab shows for a record. `live` (mid-run) leaves the drill-down and the
    stats chart alone: plotly figures cost tens of ms each, which would slow a fast device's rounds."""
    rounds = record.rounds if record else []
    greedy = record.greedy if record else True
    n = len(rounds)
    i = round_index(n, selected)
    current = rounds[i] if rounds else None
    done = stage == "done"
    pos = default_position(current) if done else None
    s = summarize(rounds, record.ar_steps if record else None)
    return MainView(
        tokens=render.rounds_html(rounds, greedy, show_rejected=show_rejected, stage=stage),
        caption=teach.step_caption(current, greedy, stage) if current else "",
        pq=figures.pq_figure(current, greedy, verdict=stage != "draft"),
        rounds=gr.update(minimum=1, maximum=max(n, 2), value=i + 1, interactive=n > 1),  # min < max
        positions=gr.update(choices=position_choices(current) if done else [], value=pos),
        drill=gr.skip() if live else drill(current, pos, greedy),
        stats=teach.stats_markdown(s, record.source if record else ""),
        stats_fig=gr.skip() if live else figures.stats_figure(s),
        record=record,
    )


def paced(events: Iterator, min_interval: float, clock: Callable[[], float] = time.monotonic) -> Iterator[tuple]:
    """(event, show) pairs: show is True at most every min_interval seconds, and for the last event
    (a Round or a RaceState whose `finished` is set)."""
    last = None
    with closing(events):  # closing the pacer (Stop) closes the run it paces
        for event in events:
            now = clock()
            show = last is None or now - last >= min_interval or event.finished is not None
            if show:
                last = now
            yield event, show


def locked(session: Session, events_of: Callable[[object], Iterator]) -> Iterator:
    """Run an event stream while holding the pair. Stop closes this generator between two events,
    which closes the engine's generator and releases the lock."""
    with session.using() as pair:
        yield from events_of(pair)


@user_errors
def run(session: Session, limits: Limits, prompt, settings: Settings, show_rejected: bool = True,
        options: Options = Options()) -> Iterator[MainView]:
    """Stream a speculative run round by round."""
    job = prepare(session, limits, prompt, settings)
    record = RunRecord(job.meta, source="Run")
    yield main_view(record, show_rejected=show_rejected)
    rounds = locked(session, lambda pair: speculative_generate(pair, job.ids, job.config))
    with closing(paced(rounds, options.min_interval)) as events:
        for r, show in events:
            record.rounds.append(r)
            if show:
                yield main_view(record, show_rejected=show_rejected, live=r.finished is None)


def browse(record: RunRecord | None, round_number, show_rejected: bool = True) -> MainView:
    """Look at an earlier round of the last run (slider), without running anything."""
    return main_view(record, show_rejected=show_rejected, selected=round_number)


def pick_position(record: RunRecord | None, round_number, position):
    if record is None or not record.rounds:
        return figures.drilldown_figure(None, True)
    r = record.rounds[round_index(len(record.rounds), round_number or 1)]
    return drill(r, position, record.greedy)


# ---------------------------------------------------------------- step mode


@dataclass
class Stepper:
    """A paused speculative run: step mode advances it one round per click."""

    events: Iterator[Round]
    record: RunRecord
    key: tuple
    generation: int
    done: bool = False


@user_errors
def step(session: Session, limits: Limits, stepper: Stepper | None, prompt, settings: Settings,
         show_rejected: bool = True, options: Options = Options()) -> Iterator[tuple[MainView, Stepper | None]]:
    """One round per call, shown in three captioned stages: draft → verify → accept/correct.

    A new run starts when there is none, the last one finished, or the prompt, settings or pair changed.
    """
    job = prepare(session, limits, prompt, settings)
    key = (job.prompt, job.config)
    if stepper is None or stepper.done or stepper.key != key or stepper.generation != session.generation:
        reset_step(stepper)
        record = RunRecord(job.meta, source="Step mode")
        events = session.track(speculative_generate(job.pair, job.ids, job.config))
        stepper = Stepper(events, record, key, session.generation)
    with session.using():
        r = next(stepper.events, None)
    if r is None:
        stepper.done = True
        yield main_view(stepper.record, show_rejected=show_rejected), stepper
        return
    stepper.record.rounds.append(r)
    stepper.done = r.finished is not None
    for stage in ("draft", "verify", "done"):
        yield main_view(stepper.record, show_rejected=show_rejected, stage=stage), stepper
        if stage != "done" and options.stage_delay:
            time.sleep(options.stage_delay)


def reset_step(stepper: Stepper | None) -> None:
    if stepper is not None:
        try:
            stepper.events.close()
        except ValueError:  # a step is running right now (Run pressed meanwhile): it ends with its session
            pass
    return None


# ---------------------------------------------------------------- the race


@dataclass
class RaceView:
    ar: str  # HTML lane
    spec: str
    fig: object
    result: str  # Markdown
    stats: str
    record: RunRecord | None


def gap(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def race_result(state: RaceState, recorded: str | None = None) -> str:
    """The verdict. `recorded`: where a replayed trace was measured (its times are the trace's)."""
    if state.speedup is None:
        return "Both lanes are running, taking turns on the device…"
    s = state.speedup
    times, word = (s, "faster") if s >= 1 else (1 / s, "slower")  # 0.5× faster reads as 2.00× slower
    how = f"as recorded on {recorded}" if recorded else "measured on each lane's own clock"
    lines = [f'<span class="sv-speedup">Speculative decoding: {times:.2f}× {word}</span> '
             f"({state.spec.tokens_per_s:.1f} vs {state.ar.tokens_per_s:.1f} tokens/s, {how})"]
    if state.greedy:
        d = state.divergence
        if d is None:
            lines.append("Greedy texts are **identical**." if state.identical else
                         "Greedy texts agree on their common length (one lane stopped earlier).")
        else:
            lines.append(
                f"⚠ Greedy texts **differ from token {d.position + 1}** (outlined). The target's top-2 logit gap "
                f"there is {gap(d.target_top2_gap)} (target alone) / {gap(d.spec_top2_gap)} (verify pass): a "
                "near-tie that low precision can flip when the target scores K+1 tokens at once instead of one. "
                "The rule is exact; the arithmetic of a batched forward is not bit-identical.")
    return "\n\n".join(lines)


def recorded_on(meta: dict) -> str:
    return f"{meta.get('device', '?')} in {meta.get('dtype', '?')} ({meta.get('target', 'target')})"


def race_view(state: RaceState, record: RunRecord, recorded: bool = False) -> RaceView:
    """The Race tab. The record (the Decode tab's slider and Export) is replaced only by a finished race,
    so starting a race, or stopping one, leaves the last run's record alone."""
    at = state.divergence.position if state.divergence else None
    return RaceView(
        ar=render.lane_html(state.ar, render.steps_html(state.ar.events, at), recorded),
        spec=render.lane_html(state.spec, render.spec_lane_html(state.spec.events, state.greedy, at), recorded),
        fig=figures.race_figure(state.lanes),
        result=race_result(state, recorded_on(record.meta) if recorded else None),
        stats=teach.stats_markdown(race_stats(state), "Race, speculative lane") if state.done else "",
        record=record if state.done else gr.skip(),
    )


@user_errors
def run_race(session: Session, limits: Limits, prompt, settings: Settings,
             options: Options = Options()) -> Iterator[RaceView]:
    job = prepare(session, limits, prompt, settings)
    record = RunRecord(job.meta, source="Race")
    states = locked(session, lambda pair: race(pair, job.ids, job.config))
    with closing(paced(states, options.min_interval)) as events:
        for state, show in events:
            if state.done:
                record.rounds, record.ar_steps = list(state.spec.events), list(state.ar.events)
            if show:
                yield race_view(state, record)


# ---------------------------------------------------------------- same distribution


@dataclass
class DistributionView:
    fig: object
    summary: str


def distribution_summary(c, done: bool, prompt: str = "") -> str:
    def p(v):
        return "not testable (one outcome carries almost all the mass)" if v is None else f"{v:.3f}"
    state = "" if done else " (sampling…)"
    after = f" of the first token after <i>{escape(figures.short(prompt, 80))}</i>" if prompt else ""
    return "\n".join([
        f"**{c.n_spec} speculative and {c.n_ar} target-alone samples{state}**{after}",
        "",
        "| statistic | target alone | speculative |",
        "|---|---|---|",
        f"| total variation to exact | {c.tv_ar:.3f} | {c.tv_spec:.3f} |",
        f"| χ² goodness-of-fit p-value | {p(c.p_ar)} | {p(c.p_spec)} |",
        "",
        f"TV of {min(c.n_ar, c.n_spec)} samples drawn from the exact distribution itself is about "
        f"{c.tv_noise:.3f}: finite samples never match exactly. Both samplers should sit at that level, and "
        "their p-values should look like any uniform draw (a p-value below 0.01 would be suspicious).",
    ])


def token_labels(texts: list[str], ids: list[int]) -> list[str]:
    labels = [f"'{figures.short(x, 12)}'" for x in texts]
    return [f"{x} #{t}" if labels.count(x) > 1 else x for x, t in zip(labels, ids)]


def sample_distributions(session: Session, limits: Limits, prompt, settings: Settings, n, temperature
                         ) -> Iterator[tuple[Comparison, list[str], bool]]:
    """(comparison, the shown tokens' texts, done) every n/20 sample pairs."""
    n = _number("samples", n, int)
    if not 1 <= n <= limits.max_samples:
        raise InputError(f"samples must be between 1 and {limits.max_samples}, got {n}.")
    job = prepare(session, limits, prompt, replace(settings, temperature=temperature, max_new_tokens=2))
    if job.config.sampling.greedy:
        raise InputError("the same-distribution test needs sampling: set a temperature above 0.")
    with session.using() as pair:
        exact = next_token_distribution(pair, job.ids, job.config.sampling)
    samples = locked(session, lambda pair: sample_both(pair, job.ids, job.config, n, max(1, n // 20)))
    with closing(samples):
        for counts_ar, counts_spec, done in samples:
            c = compare(exact, counts_ar, counts_spec)
            yield c, [job.pair.tokenizer.decode([t]) for t in c.token_ids], done == n


@user_errors
def same_distribution(session: Session, limits: Limits, prompt, settings: Settings, n, temperature
                      ) -> Iterator[DistributionView]:
    with closing(sample_distributions(session, limits, prompt, settings, n, temperature)) as results:
        for c, texts, done in results:
            labels = token_labels(texts, c.token_ids)
            yield DistributionView(figures.distribution_figure(labels, c.exact, c.ar, c.spec, c.n_ar, c.n_spec),
                                   distribution_summary(c, done, prompt))


# ---------------------------------------------------------------- traces: export and replay


def export(record: RunRecord | None, options: Options = Options()) -> str:
    if record is None or not record.rounds:
        raise gr.Error("nothing to export yet: press Run, Step or Run race first.", print_exception=False)
    folder = options.trace_dir or Path(tempfile.gettempdir()) / "specviz-traces"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # the folder is shared by every user of the server: a unique name, never one derived from the time alone
    fd, path = tempfile.mkstemp(prefix=f"specviz-trace-{record.source.lower().replace(' ', '-')}-{stamp}-",
                                suffix=".json", dir=folder)
    os.close(fd)
    return str(tracefile.save(record.trace(), path))


def shipped_traces(assets_dir: Path | None) -> list[str]:
    """Names of the traces shipped in assets/ (the only server files replay may read)."""
    if assets_dir is None or not assets_dir.is_dir():
        return []
    return sorted(p.name for p in assets_dir.glob("*.json") if p.is_file())


def open_trace(upload, shipped: str | None, options: Options = Options()) -> tuple[Trace, str]:
    """An uploaded file wins; otherwise a shipped trace chosen by name from the listing (never a path)."""
    if upload:
        path = Path(upload if isinstance(upload, str) else getattr(upload, "name", upload))
        return tracefile.load(path), path.name
    if shipped:
        names = shipped_traces(options.assets_dir)
        if shipped not in names:
            raise InputError(f"{shipped!r} is not one of the shipped traces ({', '.join(names) or 'none'}).")
        return tracefile.load(options.assets_dir / shipped), shipped
    raise InputError("choose a shipped trace or upload a trace file (.json) first.")


MAX_TRACE_CHARS = 20_000_000  # as much as the UI's upload limit (20 MB)


def trace_text_or_name(value: str, options: Options = Options()) -> tuple[Trace, str]:
    """For the API: a shipped trace's name, or a whole trace as JSON text."""
    if value is not None and not isinstance(value, str):
        raise InputError("the trace must be text: a shipped trace's name or a trace as JSON.")
    value = (value or "").strip()
    if len(value) > MAX_TRACE_CHARS:
        raise InputError(f"the trace is {len(value)} characters long; the limit is {MAX_TRACE_CHARS}.")
    if value.startswith("{"):
        try:
            return tracefile.parse(json.loads(value)), "uploaded JSON"
        except json.JSONDecodeError as e:
            raise TraceError(f"the text is not valid JSON: {e}") from e
    return open_trace(None, value, options)


# what wrong types under the right keys raise on the way through a replay (and JSON nested absurdly deep)
TRACE_DATA_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, RecursionError)


def trace_data(fn: Callable) -> Callable:
    """For replays, which read nothing but the trace: a failure on the way is the trace's fault."""
    @functools.wraps(fn)
    def gen(*args, **kwargs):
        try:
            yield from fn(*args, **kwargs)
        except USER_ERRORS:
            raise
        except TRACE_DATA_ERRORS as e:
            raise TraceError(f"this specviz trace is damaged ({type(e).__name__}: {e}).") from e
    return gen


MAX_REPLAY_SECONDS = 300.0  # however slow a trace says it was, a replay holds a worker no longer than this


def pacer(speed, budget: float = MAX_REPLAY_SECONDS, sleep: Callable[[float], None] = time.sleep
          ) -> Callable[[float], None]:
    """Sleep each recorded interval divided by `speed` (0: no pauses), at most 5 s each and `budget` in all."""
    speed, left = float(speed or 0), [budget]

    def wait(seconds: float) -> None:
        pause = min(seconds / speed, 5.0, left[0]) if speed > 0 and seconds > 0 else 0.0
        if pause > 0:
            left[0] -= pause
            sleep(pause)
    return wait


@user_errors
@trace_data
def replay(upload, shipped, speed, show_rejected: bool = True, options: Options = Options()
           ) -> Iterator[MainView]:
    """Stream a recorded run round by round, at its recorded pace divided by `speed` (0: at once)."""
    t, name = open_trace(upload, shipped, options)
    record = RunRecord(t.meta, [], t.ar_steps, source=f"Replay of {name}")
    yield main_view(record, show_rejected=show_rejected)
    wait = pacer(speed)
    for i, r in enumerate(t.rounds):
        wait(r.draft_time + r.verify_time + r.overhead_time)
        record.rounds.append(r)
        yield main_view(record, show_rejected=show_rejected, live=i + 1 < len(t.rounds))


@user_errors
@trace_data
def replay_race_view(upload, shipped, speed, options: Options = Options()) -> Iterator[RaceView]:
    t, name = open_trace(upload, shipped, options)
    if not t.ar_steps:
        raise InputError(f"{name} has no target-alone steps to race against (record it with --with-ar).")
    record = RunRecord(t.meta, t.rounds, t.ar_steps, source=f"Replay of {name}")
    greedy = record.greedy
    shown, wait = 0.0, pacer(speed)
    for state in replay_race(t.rounds, t.ar_steps, greedy):
        wait(state.ar.clock + state.spec.clock - shown)
        shown = state.ar.clock + state.spec.clock
        yield race_view(state, record, recorded=True)


# ---------------------------------------------------------------- model loading


@user_errors
def load_pair(session: Session, draft, target, dtype) -> Iterator[str]:
    """Load in a worker thread and stream its status lines; errors end as gr.Error."""
    lines: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work():
        try:
            outcome["name"] = session.load(draft, target, dtype or "auto", status=lines.put)
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e
        finally:
            lines.put(None)

    worker = threading.Thread(target=work, name="specviz-load", daemon=True)
    log: list[str] = []
    worker.start()
    while (line := lines.get()) is not None:
        log.append(f"- {line}")
        yield "\n".join(log)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]  # user_errors turns the user's mistakes into gr.Error
    yield "\n".join(log + [f"**Loaded:** {outcome['name']}"])
