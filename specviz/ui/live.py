"""The Live tab (id live): the whole demo on one screen, both lanes of a race as they run.

Four parts, each with a stable element id: the speculative lane as coloured rounds (`sv-live-spec`),
the target-alone lane's text (`sv-live-ar`), the latest round's p/q bars (`sv-live-pq`) and the running
speedup with each lane's tokens/s, prefill apart, and a sentence saying why (`sv-live-speed`).
`live_view` builds them from a running race (pure: state in, view out); `live` streams them from `runs.race`,
and once the race is over fills the Race and Decode tabs too (a `LiveUpdate`, which `LiveOutputs` maps onto
the three tabs); `live_tab` lays the tab out and `wire` connects Run and the prompt's Enter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from html import escape

import gradio as gr

from specviz.analysis.explain import economics, economics_headline, explain, precisions, sentence
from specviz.runs import race as racing
from specviz.runs.broadcast import Broadcast
from specviz.runs.race import Lane, RaceState
from specviz.serving.session import Session
from specviz.serving.turns import Owner, Waiting
from specviz.settings.limits import Limits
from specviz.ui import figures, render, teach
from specviz.ui.decode import DecodeTab, MainView, main_view
from specviz.ui.handlers import Options, Page, outputs, replaceable, shown, stream, user_errors
from specviz.ui.prompt import PromptArea
from specviz.ui.race import RaceTab, RaceView, race_view
from specviz.ui.tree_view import latest_tree_html

PQ_HEIGHT = 210  # px: beside the verdict, above the legend and the lanes: all of it fits a 1366x768 screen

CSS = """
#sv-live-speed .sv-live-speed { display: flex; flex-wrap: wrap; align-items: baseline; gap: 2px 18px;
  font-variant-numeric: tabular-nums; }
.sv-live-x { font-size: 30px; font-weight: 750; line-height: 1.1; }
.sv-live-apart { font-size: 16px; font-weight: 600; margin-left: 10px; }
.sv-live-x.sv-slower { color: #dc2626; } .sv-live-x.sv-faster { color: #16a34a; }
.sv-live-nums { font-size: 13px; color: var(--body-text-color); }
.sv-live-nums b { color: var(--body-text-color); }
.sv-live-why { flex-basis: 100%; font-size: 13px; line-height: 1.35; }
.sv-live-recorded { flex-basis: 100%; font-size: 13px; font-weight: 600; color: #2563eb; }
.sv-live-economics summary { cursor: pointer; }
.sv-live-lane h4 { margin: 0 0 4px; font-size: 13px; display: flex; justify-content: space-between; }
.sv-live-lane .sv-scroll { height: 112px; max-height: none; }  /* the text grows upward: its end in view */
.sv-live-lane .sv-text { flex: 1 0 auto; min-height: 0; font-size: 13px; line-height: 1.75; padding: 6px 8px; }
/* presenter mode (a class on <body>, outside the container Gradio prefixes its rules with: !important) */
.sv-presenter .sv-live-lane .sv-scroll { height: 230px !important; }
.sv-presenter .sv-live-lane .sv-text { font-size: 19px !important; }
.sv-presenter .sv-live-x { font-size: 44px !important; }
.sv-presenter .sv-live-nums, .sv-presenter .sv-live-why { font-size: 17px !important; }
"""

# Gradio's page keeps an elapsed-time counter for each output of a pending event and redraws it every animation
# frame, even where its progress is hidden: 60 frames a second of the browser's work on the cores a race is timing (a
# fifth of a core in headless Chromium on a 2-core Zen 4, measured with Chrome's tracing). Here those counters tick
# once a second. So does what a throttled tick asks for next: the loading animation a status tracker starts at page
# load runs on Svelte's shared animation loop, which asks for its next frame from its own code, not the tracker's,
# and it never stops (an idle page asked for 19 frames a second, now one; other Svelte springs and tweens then move
# at that pace too, and this page has none a visitor needs). Gradio's modules keep the browser's
# requestAnimationFrame from when they load, so this runs before them: the server puts it first in the page's <head>
# (`ui.early_head`), not where `launch(head=...)` would (after them).
HEAD = """<script>
(() => {
  const frame = window.requestAnimationFrame.bind(window);
  let slow = false;
  const late = tick => () => { slow = true; try { tick(performance.now()); } finally { slow = false; } };
  window.requestAnimationFrame = tick => slow || /statustracker/.test(new Error().stack || "")
    ? setTimeout(late(tick), 1000) : frame(tick);
})();
</script>"""


@dataclass
class LiveView:
    speed: str  # HTML
    spec: str  # HTML
    ar: str  # HTML
    pq: object  # plotly figure, or gr.skip() while no new round arrived


def lane_box(lane: Lane, body: str) -> str:
    state = f"finished ({lane.finished})" if lane.finished else "running…"
    return (f'<div class="sv-live-lane"><h4><span>{escape(lane.title)}</span><span>{lane.tokens} tokens · '
            f'{state}</span></h4><div class="sv-scroll">{body}</div></div>')


def lane_numbers(lane: Lane) -> str:
    return (f"{lane.tokens_per_s:.1f} tok/s (prefill {lane.prefill:.2f} s, then "
            f"{lane.decode_tokens_per_s:.1f} tok/s decoding)")


def speed_html(state: RaceState) -> str:
    """The running verdict, each lane's numbers, and (once over) why it came out that way."""
    x = state.running_speedup
    if x is None:
        verdict = '<span class="sv-live-x">…</span>'
    else:
        word, cls = ("faster", "sv-faster") if x >= 1 else ("slower", "sv-slower")
        label = "" if state.done else " so far"
        decode = state.decode_speedup
        # end to end includes the prompt's forward, the same work in both lanes; decoding alone is what rounds speed up
        apart = (f'<span class="sv-live-apart" title="the prompt\'s reading costs both lanes the same; after it, '
                 f'speculation decodes this much faster">prompt apart {decode:.2f}×</span>'
                 if state.done and decode and abs(decode - x) >= 0.05 else "")
        verdict = f'<span class="sv-live-x {cls}">{x:.2f}× {word}{label}{apart}</span>'
    stats = state.stats()
    nums = (f'<span class="sv-live-nums">speculative <b>{lane_numbers(state.spec)}</b> · target alone '
            f'<b>{lane_numbers(state.ar)}</b> · acceptance <b>{stats.spec.acceptance_rate:.0%}</b>, '
            f'<b>{stats.spec.mean_accepted_tokens:.1f}</b> tokens per round</span>')
    e = explain(stats) if state.done else None
    why = (f'<span class="sv-live-why">{escape(sentence(e))}</span>{economics_html(e, state.meta)}'
           if e else "")
    notes = "".join(f'<span class="sv-live-why">{escape(n)}</span>'
                    for n in teach.race_caveats(state.shared_cpu, (state.ar.finished, state.spec.finished),
                                                    state.timing_note))
    if state.recorded_at is not None:  # plainly, under the verdict: these numbers were measured before
        nums = f'<span class="sv-live-recorded">{escape(teach.recorded_note(state.recorded_at))}</span>' + nums
    return f'<div class="sv-live-speed">{verdict}{nums}{why}{notes}</div>'


def economics_html(e, meta) -> str:
    """The economics in one line (c, the precisions behind it, the regime, where it stops paying); the full
    sentence opens below it, so the four parts still fit one laptop screen."""
    which = precisions(meta.target, meta.draft, meta.dtype)
    return (f'<details class="sv-live-why sv-live-economics"><summary>{escape(economics_headline(e, *which))}'
            f'</summary>{escape(economics(e, *which))}</details>')


def latest_drafted(rounds: list) -> object:
    """The newest round that drafted anything: a run's last round may have room for its final token only."""
    return next((r for r in reversed(rounds) if r.drafted), rounds[-1])


def live_view(state: RaceState, plot: bool = True, tokens_html=render.rounds_html,
              steps_html=render.steps_html) -> LiveView:
    """The four parts after an event of either lane. `plot=False` keeps the p/q plot as it is: the caller
    rebuilds it only when a new round arrived (a plotly figure costs tens of ms, and the target-alone
    lane moves one token at a time). `tokens_html`, `steps_html`: a live run's renderers, each token rendered once
    (`render.RoundsHtml`, `render.StepsHtml`)."""
    rounds = state.spec.events
    return LiveView(
        speed=speed_html(state),
        spec=lane_box(state.spec, tokens_html(rounds, state.greedy, empty="waiting for the first round…"))
        + latest_tree_html(rounds, state.greedy),  # tree rounds: below the lane, where it has room
        ar=lane_box(state.ar, steps_html(state.ar.events)),
        pq=figures.pq_figure(latest_drafted(rounds), state.greedy, height=PQ_HEIGHT) if plot and rounds else gr.skip(),
    )


WAITING = "Press Run: speculative decoding and the target alone decode the same prompt, each on its own clock."
STARTING = ("Reading the prompt (prefill): the speculative lane runs it through both models, then drafts its first "
            "round; the target alone follows on its own clock.")


def waiting_view(w) -> LiveView:
    """While the run waits for the model (`serving.turns.Waiting`): its place and estimated wait; the rest stays."""
    return LiveView(speed=f'<div class="sv-live-speed"><span class="sv-live-x">…</span><span class="sv-live-why '
                          f'sv-live-queue">{escape(teach.queue_line(w))}</span></div>',
                    spec=gr.skip(), ar=gr.skip(), pq=gr.skip())


def live_blank(starting: bool = False) -> LiveView:
    """The Live view before a run (`starting`: the moment Run was pressed): where each part will appear."""
    return LiveView(
        speed=f'<div class="sv-live-speed"><span class="sv-live-x">–</span><span class="sv-live-nums">'
              f'{STARTING if starting else WAITING}</span></div>',
        spec=f'<div class="sv-live-lane"><h4><span>Speculative decoding</span></h4><div class="sv-scroll">'
             f'{render.rounds_html([], True)}</div></div>',
        ar='<div class="sv-live-lane"><h4><span>Target alone (autoregressive)</span></h4><div class="sv-scroll">'
           f'{render.steps_html([])}</div></div>',
        pq=figures.empty_figure("p/q bars of the latest round appear here", PQ_HEIGHT),
    )


# ---------------------------------------------------------------- handlers: values in, views out


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
    with closing(options.pace.timed(states, session.turns.visitor_waiting, session.warmers)) as events:
        yield from live_updates(events)


def live_updates(events: Iterator[tuple]) -> Iterator[LiveUpdate]:
    """(state or Waiting, show) pairs as the Live view's updates, each round rendered once."""
    plotted = 0  # rounds the p/q plot has seen
    tokens_html, steps_html = render.RoundsHtml(), render.StepsHtml()
    for state, show in events:
        if isinstance(state, Waiting):
            yield LiveUpdate(waiting_view(state))
        elif show:
            yield live_update(state, tokens_html, plot=len(state.spec.events) > plotted, steps_html=steps_html)
            plotted = len(state.spec.events)


def live_update(state: racing.RaceState, tokens_html, plot: bool = True, steps_html=render.steps_html) -> LiveUpdate:
    view = live_view(state, plot=plot, tokens_html=tokens_html, steps_html=steps_html)
    if not state.done:
        return LiveUpdate(view)
    details = race_view(state)
    return LiveUpdate(view, details, main_view(details.record))


# ---------------------------------------------------------------- the tab


@dataclass(frozen=True)
class LiveTab:
    """The tab's components, named like LiveView's fields."""

    speed: gr.HTML
    spec: gr.HTML
    ar: gr.HTML
    pq: gr.Plot
    presenting: gr.State  # True in the browser the presenter key was entered in: its runs are broadcast


@dataclass(frozen=True)
class LiveOutputs:
    """Where a Live run shows: the Live tab as it runs, the Race and Decode tabs once it is over."""

    live: LiveTab
    race: RaceTab
    decode: DecodeTab

    @property
    def outputs(self) -> list:
        return list(dict.fromkeys([*outputs(self.live, LiveView), *self.details]))

    @property
    def details(self) -> list:
        """The Race and Decode tabs' components, each once (they share the record)."""
        return list(dict.fromkeys([*self.race.outputs, *self.decode.outputs]))

    def updates(self, u: LiveUpdate) -> dict:
        return {**shown(self.live, u.live), **self.detail_updates(u)}

    def detail_updates(self, u: LiveUpdate | None) -> dict:
        """The Race and Decode tabs once the race is over (one record for both); nothing before."""
        return {**shown(self.race, u.race), **shown(self.decode, u.main)} if u is not None and u.race else {}


def live_tab() -> LiveTab:
    """The four parts of one picture (ids sv-live-*): the verdict on top, the lanes, the latest round's bars."""
    blank = live_blank()
    with gr.Tab("Live", id="live"):
        with gr.Row(equal_height=True):
            speed = gr.HTML(blank.speed, elem_id="sv-live-speed")
            pq = gr.Plot(blank.pq, show_label=False, elem_id="sv-live-pq")
        gr.HTML(render.legend_html(compact=True), elem_id="sv-live-legend")  # the lanes' colours, one line
        with gr.Row(equal_height=True):
            spec = gr.HTML(blank.spec, elem_id="sv-live-spec")
            ar = gr.HTML(blank.ar, elem_id="sv-live-ar")
        presenting = gr.State(False)  # set by the presenter key only: a visitor cannot broadcast
    return LiveTab(speed, spec, ar, pq, presenting)


def wire(page: Page, out: LiveOutputs, area: PromptArea, broadcast: Broadcast | None) -> list:
    """Run and the prompt's Enter race both lanes (the model's queue); the presenter's runs are broadcast
    (`broadcast`: None where nobody presents). The race streams into the Live tab's parts only; once it is over,
    a second event fills the Race and Decode tabs from it. Returns the events Stop cancels."""
    last = gr.State(None)  # the race's last update, for the detail tabs

    def on_live(request: gr.Request, presenting, text, *values):
        yield {page.tabs: gr.Tabs(selected="live"), **shown(out.live, live_blank(starting=True)), last: None}
        yield from stream(live(page.session, page.limits, text, page.settings_of(values), page.options,
                               owner=Owner.of(request), broadcast=broadcast if presenting else None),
                          lambda u: {**shown(out.live, u.live), **({last: u} if u.race else {})})

    # Few outputs while the race runs, and no loading overlay: Gradio's page runs a timer every frame for each
    # output of a pending event (shown or not), and on a laptop that also runs the browser that work takes CPU
    # from the two lanes being timed. "multiple": a second Run while the first waits is sent, and takes its place in
    # the queue (serving.turns)
    runs = [trigger(on_live, [out.live.presenting, page.prompt, *page.settings.values()],
                    [page.tabs, *outputs(out.live, LiveView), last], api_visibility="private", show_progress="hidden",
                    trigger_mode="multiple", **page.model_queue) for trigger in (area.run.click, page.prompt.submit)]
    for run in runs:
        run.then(out.detail_updates, [last], out.details, api_visibility="private", queue=False)
    return runs
