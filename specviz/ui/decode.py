"""The Decode tab (id decode): the speculative lane alone, round by round: its coloured tokens, each round's
caption and p/q bars, a drill-down into one position, the run's statistics.

`main_view` is what the tab shows of a record (pure: events in, view out, never tensors); `run` and `step` stream
it from `runs.decode`; `decode_tab` lays the tab out and `wire` connects Rounds only, Step and the round slider.
A Live run, a replay and an Atlas row show their record here too (`shown(tab, main_view(record))`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from functools import partial

import gradio as gr

from specviz.analysis.stats import RunStats, run_stats
from specviz.engine.events import CORRECTION, REJECTED, EmittedToken, Round
from specviz.runs import decode as decoding
from specviz.runs.trace import Trace
from specviz.serving.session import Session
from specviz.serving.turns import Owner, Waiting
from specviz.settings.limits import Limits
from specviz.ui import figures, render, teach
from specviz.ui.handlers import Options, Page, outputs, replaceable, shown, stream, user_errors
from specviz.ui.prompt import PromptArea
from specviz.ui.tree_view import tree_html


@dataclass
class MainView:
    """Everything the Decode tab shows; `gr.update`/`gr.skip` only where a component keeps its state."""

    tokens: str  # HTML
    caption: str  # Markdown
    pq: object  # plotly figure
    rounds: dict  # gr.update for the round slider
    positions: dict  # gr.update for the position dropdown
    drill: object  # plotly figure
    stats: str  # Markdown
    stats_fig: object
    record: Trace | None


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


def main_view(record: Trace | None, *, show_rejected: bool = True, selected: int | None = None,
              stage: str = "done", live: bool = False, tokens_html=render.rounds_html) -> MainView:
    """Everything the Decode tab shows for a record. `live` (mid-run) leaves the drill-down and the
    stats chart alone: plotly figures cost tens of ms each, which would slow a fast device's rounds.
    A stream of views of one growing run passes a `render.RoundsHtml()` as `tokens_html`."""
    rounds = record.rounds if record else []
    greedy = record.meta.greedy if record else True
    n = len(rounds)
    i = round_index(n, selected)
    current = rounds[i] if rounds else None
    done = stage == "done"
    pos = default_position(current) if done else None
    s = run_stats(rounds, record.ar_steps if record else None)
    return MainView(
        tokens=tokens_html(rounds, greedy, show_rejected=show_rejected, stage=stage)
        + (tree_html(current, greedy, stage) if current is not None and current.tree else ""),
        caption=teach.step_caption(current, greedy, stage) if current else "",
        pq=figures.pq_figure(current, greedy, verdict=stage != "draft"),
        rounds=gr.update(minimum=1, maximum=max(n, 2), value=i + 1, interactive=n > 1),  # min < max
        positions=gr.update(choices=position_choices(current) if done else [], value=pos),
        drill=gr.skip() if live else drill(current, pos, greedy),
        stats=teach.stats_markdown(s, record.source if record else ""),
        stats_fig=gr.skip() if live else figures.stats_figure(s),
        record=record,
    )


def waiting_main(w: Waiting) -> MainView:
    """The Decode tab while a run waits for the model: its place in the caption, the rest as it was."""
    return MainView(tokens=gr.skip(), caption=teach.queue_line(w), pq=gr.skip(), rounds=gr.skip(),
                    positions=gr.skip(), drill=gr.skip(), stats=gr.skip(), stats_fig=gr.skip(), record=gr.skip())


# ---------------------------------------------------------------- handlers: values in, views out


@user_errors
@replaceable
def run(session: Session, limits: Limits, prompt, settings: dict, show_rejected: bool = True,
        options: Options = Options(), owner: str | None = None) -> Iterator[MainView]:
    """Stream a speculative run round by round (before it, its place in the queue while it waits)."""
    tokens_html = render.RoundsHtml()
    runs = decoding.decode(session, limits, prompt, settings, owner=owner)
    with closing(options.pace.timed(runs, session.turns.visitor_waiting, session.warmers)) as events:
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


# ---------------------------------------------------------------- the tab


@dataclass(frozen=True)
class DecodeTab:
    """The tab's components; those named like MainView's fields show it."""

    tokens: gr.HTML  # every round's drafts, coloured by verdict
    show_rejected: gr.Checkbox
    caption: gr.Markdown  # what the round picked below did
    pq: gr.Plot  # that round's p/q bars
    rounds: gr.Slider  # picks the round the bars and the drill-down show
    positions: gr.Dropdown  # picks the draft position the drill-down opens
    drill: gr.Plot
    stats: gr.Markdown
    stats_fig: gr.Plot
    record: gr.State  # the last run, shared with the Race tab
    stepper: gr.State  # a paused step-mode run

    @property
    def outputs(self) -> list:
        return outputs(self, MainView)


def decode_tab(record: gr.State) -> DecodeTab:
    with gr.Tab("Decode", id="decode"):
        gr.HTML(render.legend_html())
        tokens = gr.HTML(render.rounds_html([], True), elem_id="sv-tokens")
        show_rejected = gr.Checkbox(True, label="show rejected and unverified drafts", container=False)
        caption = gr.Markdown(elem_id="sv-caption")
        with gr.Row():
            pq = gr.Plot(figures.empty_figure("p/q bars of the current round appear here"), show_label=False,
                         elem_id="sv-pq")
        with gr.Row():
            rounds = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="sv-round", scale=1)
            positions = gr.Dropdown([], label="Drill-down position", scale=2, elem_id="sv-position")
        drill_plot = gr.Plot(figures.drilldown_figure(None, True), show_label=False, elem_id="sv-drill")
        with gr.Accordion("Statistics", open=True):
            stats = gr.Markdown(teach.stats_markdown(RunStats(), ""), elem_id="sv-stats")
            stats_fig = gr.Plot(figures.stats_figure(RunStats()), show_label=False)
        # what a visitor's session holds is let go when it ends: the paused run's caches
        stepper = gr.State(None, delete_callback=reset_step)
    return DecodeTab(tokens, show_rejected, caption, pq, rounds, positions, drill_plot, stats, stats_fig, record,
                     stepper)


def wire(page: Page, tab: DecodeTab, area: PromptArea) -> list:
    """Rounds only and Step (the model's queue), a plain run ending step mode, and browsing the last run; returns
    the events Stop cancels."""
    s, limits, options = page.session, page.limits, page.options
    show = partial(shown, tab)

    def on_rounds(request: gr.Request, text, show_rejected, *values):
        yield {page.tabs: gr.Tabs(selected="decode"), **show(main_view(None))}
        yield from stream(run(s, limits, text, page.settings_of(values), show_rejected, options,
                              owner=Owner.of(request)), show)

    def on_step(request: gr.Request, stepper, text, show_rejected, *values):
        def staged(view_and_stepper) -> dict:
            view, kept = view_and_stepper
            return {page.tabs: gr.Tabs(selected="decode"), **show(view), tab.stepper: kept}

        yield from stream(step(s, limits, stepper, text, page.settings_of(values), show_rejected, options,
                               Owner.of(request)), staged)

    inputs = [page.prompt, tab.show_rejected, *page.settings.values()]
    events = [area.rounds.click(on_rounds, inputs, [page.tabs, *tab.outputs], api_visibility="private",
                                trigger_mode="multiple", **page.model_queue)]
    for trigger in (area.run.click, page.prompt.submit, area.rounds.click):  # a plain run ends step mode
        trigger(reset_step, [tab.stepper], [tab.stepper], api_visibility="private", queue=False)
    events.append(area.step.click(on_step, [tab.stepper, *inputs], [page.tabs, *tab.outputs, tab.stepper],
                                  api_visibility="private", **page.model_queue))
    browsing(tab)
    return events


def browsing(tab: DecodeTab) -> None:
    """The round slider and the show-rejected box redraw the last run; the position menu its drill-down."""
    def on_browse(record, round_number, show_rejected):
        return shown(tab, browse(record, round_number, show_rejected))

    gr.on([tab.rounds.input, tab.show_rejected.input], on_browse, [tab.record, tab.rounds, tab.show_rejected],
          tab.outputs, api_visibility="private")
    tab.positions.input(pick_position, [tab.record, tab.rounds, tab.positions], [tab.drill], api_visibility="private")
