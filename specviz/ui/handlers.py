"""What the app's buttons do: plain generators from the run paths (`specviz.runs`) to views.

Each takes the session, the limits and raw control values, and yields view dataclasses that
app.py maps onto components. The user's errors become `gr.Error` with one sentence, so the app
keeps serving. Only run results are read, never tensors.
"""

from __future__ import annotations

import functools
import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from specviz.runs import decode as decoding
from specviz.runs.broadcast import Broadcast
from specviz.runs import trace as tracefile
from specviz.runs.distribution import sample_distribution
from specviz.settings.errors import translating
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace, paced
from specviz.runs import race as racing
from specviz.runs import replay as replays
from specviz.runs.replay import trace_data
from specviz.serving.session import Session
from specviz.runs.trace import Trace
from specviz.serving.turns import Replaced, Waiting
from specviz.ui import figures, render, teach
from specviz.ui.live import LiveView, live_view, waiting_view
from specviz.ui.share import share_html
from specviz.ui.views import (
    DistributionView, MainView, RaceView, distribution_view, drill, main_view, race_view, round_index,
)

user_errors = translating(lambda message: gr.Error(message, print_exception=False))  # no traceback in the log


def replaceable(fn):
    """A job whose place in the queue its own session's newer one took ends quietly: the newer one shows."""
    @functools.wraps(fn)
    def gen(*args, **kwargs):
        try:
            yield from fn(*args, **kwargs)
        except Replaced:
            return
    return gen


def waiting_main(w: Waiting) -> MainView:
    """The Decode tab while a run waits for the model: its place in the caption, the rest as it was."""
    return MainView(tokens=gr.skip(), caption=teach.queue_line(w), pq=gr.skip(), rounds=gr.skip(),
                    positions=gr.skip(), drill=gr.skip(), stats=gr.skip(), stats_fig=gr.skip(), record=gr.skip())


@dataclass(frozen=True)
class Options:
    """How the app paces its views (tests set everything to 0) and where exported traces go."""

    pace: Pace = Pace()
    trace_dir: Path | None = None  # a temp dir by default
    engines: tuple[str, ...] = ()  # the engine URLs the operator allowed (serve --allow-engine): the Engines tab's


@user_errors
@replaceable
def run(session: Session, limits: Limits, prompt, settings: dict, show_rejected: bool = True,
        options: Options = Options(), owner: str | None = None) -> Iterator[MainView]:
    """Stream a speculative run round by round (before it, its place in the queue while it waits)."""
    tokens_html = render.RoundsHtml()
    runs = decoding.decode(session, limits, prompt, settings, owner=owner)
    with closing(paced(runs, options.pace.min_interval)) as events:
        for trace, show in events:
            if isinstance(trace, Waiting):
                yield waiting_main(trace)
            elif show:
                yield main_view(trace, show_rejected=show_rejected, live=bool(trace.rounds) and not trace.finished,
                                tokens_html=tokens_html)


def browse(record: Trace | None, round_number, show_rejected: bool = True) -> MainView:
    """Look at an earlier round of the last run (slider), without running anything."""
    return main_view(record, show_rejected=show_rejected, selected=round_number)


def pick_position(record: Trace | None, round_number, position):
    if record is None or not record.rounds:
        return figures.drilldown_figure(None, True)
    r = record.rounds[round_index(len(record.rounds), round_number or 1)]
    return drill(r, position, record.meta.greedy)


@user_errors
@replaceable
def step(session: Session, limits: Limits, stepper: decoding.Stepper | None, prompt, settings: dict,
         show_rejected: bool = True, options: Options = Options(), owner: str | None = None
         ) -> Iterator[tuple[MainView, decoding.Stepper | None]]:
    """One round per call, shown in three captioned stages: draft → verify → accept/correct."""
    stepper, new = decoding.step(session, limits, stepper, prompt, settings, owner)
    if stepper.notice:
        gr.Warning(stepper.notice)
    stages = ("draft", "verify", "done") if new is not None else ("done",)
    for stage in stages:
        yield main_view(stepper.trace, show_rejected=show_rejected, stage=stage), stepper
        if stage != "done" and options.pace.stage_delay:
            time.sleep(options.pace.stage_delay)


def reset_step(stepper: decoding.Stepper | None) -> None:
    if stepper is not None:
        stepper.close()
    return None


@dataclass
class LiveUpdate:
    live: LiveView
    race: RaceView | None = None  # the detail tabs (Race, Decode), filled once the race is over
    main: MainView | None = None


@user_errors
@replaceable
def live(session: Session, limits: Limits, prompt, settings: dict, options: Options = Options(),
         owner: str | None = None, broadcast: Broadcast | None = None) -> Iterator[LiveUpdate]:
    """Both lanes on one screen as they run; the finished race also fills the Race and Decode tabs. While the
    run waits for the model, its place in the queue. With `broadcast` (the presenter's run: it goes ahead of
    the waiting ones, the room is watching), every state is published to the followers too."""
    states = racing.race(session, limits, prompt, settings, owner=owner, first=broadcast is not None)
    if broadcast is not None:
        states = broadcast.publishing(states)
    with closing(paced(states, options.pace.min_interval)) as events:
        yield from live_updates(events)


def live_updates(events: Iterator[tuple]) -> Iterator[LiveUpdate]:
    """(state or Waiting, show) pairs as the Live view's updates, each round rendered once."""
    plotted = 0  # rounds the p/q plot has seen
    tokens_html = render.RoundsHtml()
    for state, show in events:
        if isinstance(state, Waiting):
            yield LiveUpdate(waiting_view(state))
        elif show:
            yield live_update(state, tokens_html, plot=len(state.spec.events) > plotted)
            plotted = len(state.spec.events)


def live_update(state: racing.RaceState, tokens_html, plot: bool = True) -> LiveUpdate:
    view = live_view(state, plot=plot, tokens_html=tokens_html)
    if not state.done:
        return LiveUpdate(view)
    details = race_view(state)
    return LiveUpdate(view, details, main_view(details.record))


@user_errors
@replaceable
def same_distribution(session: Session, limits: Limits, prompt, settings: dict, experiment: dict,
                      owner: str | None = None) -> Iterator[DistributionView]:
    with closing(sample_distribution(session, limits, prompt, settings, experiment, owner)) as results:
        for result in results:
            if isinstance(result, Waiting):
                yield DistributionView(gr.skip(), teach.queue_line(result))
            else:
                yield distribution_view(result)


@user_errors
@trace_data
def replay_rounds(upload, shipped, speed, show_rejected: bool = True, options: Options = Options()
                  ) -> Iterator[MainView]:
    """Stream a recorded run round by round, at its recorded pace divided by `speed` (0: at once), shown at
    most every `options.pace.min_interval` seconds (and at the end) like a live run, each round rendered once."""
    t = replays.open_trace(upload, shipped)
    tokens_html = render.RoundsHtml()
    for shown, show in paced(replays.replay(t, speed), options.pace.min_interval):
        last = len(shown.rounds) == len(t.rounds)
        if show or last:
            yield main_view(shown, show_rejected=show_rejected, live=not last, tokens_html=tokens_html)


@user_errors
@trace_data
def replay_race(upload, shipped, speed, options: Options = Options()) -> Iterator[RaceView]:
    t = replays.open_trace(upload, shipped)
    for state, show in paced(replays.replay_race_paced(t, speed), options.pace.min_interval):
        if show or state.done:
            yield race_view(state, t.source)


EXPORT_MAX_AGE = 3600.0  # seconds an exported file stays in the shared folder (Gradio serves its own copy)


def sweep(folder: Path, max_age: float = EXPORT_MAX_AGE, now: float | None = None) -> None:
    """Remove exports older than max_age: every visitor's exports land in one folder, which must not grow forever."""
    now = time.time() if now is None else now
    for f in folder.glob("specviz-*"):
        try:
            if now - f.stat().st_mtime > max_age:
                f.unlink()
        except OSError:  # another request removed it first
            pass


def remove_files(paths: list[str] | None) -> None:
    """A visitor's exports, when their browser session ends (Gradio's State delete callback)."""
    for path in paths or []:
        Path(path).unlink(missing_ok=True)


def export(record: Trace | None, options: Options = Options(), html: bool = False) -> str:
    """The last run as a trace (JSON, replayable) or, with `html`, as one self-contained page to share."""
    if record is None or not record.rounds:
        raise gr.Error("nothing to export yet: press Run, Rounds only or Step first.", print_exception=False)
    folder = options.trace_dir or Path(tempfile.gettempdir()) / "specviz-traces"
    folder.mkdir(parents=True, exist_ok=True)
    sweep(folder)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # the folder is shared by every user of the server: a unique name, never one derived from the time alone
    fd, path = tempfile.mkstemp(prefix=f"specviz-{record.source.lower().replace(' ', '-')}-{stamp}-",
                                suffix=".html" if html else ".json", dir=folder)
    os.close(fd)
    if html:
        Path(path).write_text(share_html(record), encoding="utf-8")
        return path
    return str(tracefile.save(record, path))


@user_errors
def load_models(session: Session, draft, target, dtype, target_quant=None) -> Iterator[str]:
    """Load in a worker thread and stream its status lines; errors end as gr.Error."""
    lines: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work():
        try:
            outcome["name"] = session.switch(draft, target, dtype or "auto", status=lines.put,
                                             target_quant=target_quant or None)
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
