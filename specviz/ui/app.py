"""The Gradio app's layout: small layout functions, one per part, and `build_app`.

    demo = build_app(Session(pair, spec), Limits())

Handlers (handlers.py) do the work through the run paths; views.py and live.py say what each part
shows; wiring.py connects buttons to handlers. The JSON API is added by `specviz.server`.
"""

from __future__ import annotations

from dataclasses import fields

import gradio as gr

from specviz.analysis.stats import RunStats
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.models.memory import pair_bytes
from specviz.models.presets import PRESETS
from specviz.runs.distribution import DistributionSettings
from specviz.settings.limits import Limits
from specviz.runs.replay import shipped_traces
from specviz.serving.session import Session
from specviz.settings.spec import flat_values
from specviz.ui import handlers as h
from specviz.runs.broadcast import Broadcast
from specviz.runs.room import is_presenter
from specviz.ui import atlas, engines, follow, lesson, live, render, teach, tree_view, whatif
from specviz.ui.controls import controls
from specviz.ui.examples import EXAMPLES
from specviz.ui.figures import drilldown_figure, empty_figure, race_figure, stats_figure
from specviz.ui.views import MainView, RaceView
from specviz.ui.wiring import Buttons, Wiring

APP_CSS = render.CSS + tree_view.CSS + live.CSS + atlas.CSS + engines.CSS + follow.CSS + """
.sv-header { display: flex; align-items: baseline; gap: 6px 16px; flex-wrap: wrap; padding: 0 4px; }
.sv-header h1 { margin: 0; font-size: 22px; }
.sv-tagline { font-size: 15px; }
#sv-pair, #sv-memory { color: var(--body-text-color-subdued); font-size: 13px; }
#sv-caption { min-height: 150px; }
.sv-presenter .sv-tagline, .sv-presenter #sv-side, .sv-presenter #sv-examples, .sv-presenter #sv-rounds-run,
.sv-presenter #sv-step, .sv-presenter #sv-tabs > .tab-wrapper { display: none !important; }
.sv-presenter #sv-prompt textarea { font-size: 17px !important; }
.sv-note { font-size: 13px; color: var(--body-text-color-subdued); }
footer { display: none !important; }
"""


def outputs_of(view_cls, parts: dict) -> list:
    """The components for a view dataclass, in its field order."""
    return [parts[f.name] for f in fields(view_cls)]


# the presenter toggle runs in the browser: a class on <body> that the CSS above keys on
# plotly sizes a figure to its box when drawn; a resize event makes the p/q plot follow the wider presenter layout
TOGGLE_PRESENTER = ("() => { document.body.classList.toggle('sv-presenter'); "
                    "setTimeout(() => window.dispatchEvent(new Event('resize')), 50); }")


def prompt_area(following: bool = False) -> tuple[gr.Textbox, Buttons, gr.Button, gr.Checkbox | None]:
    prompt = gr.Textbox(label="Prompt", show_label=False, placeholder="Prompt", lines=2, max_lines=12,
                        value=EXAMPLES[0][1], elem_id="sv-prompt")
    with gr.Row(equal_height=True):
        buttons = Buttons(gr.Button("Run", variant="primary", elem_id="sv-run", scale=2, min_width=90),
                          gr.Button("Rounds only", elem_id="sv-rounds-run", scale=1, min_width=90),
                          gr.Button("Step", elem_id="sv-step", scale=1, min_width=70),
                          gr.Button("Stop", variant="stop", elem_id="sv-stop", scale=1, min_width=70))
        # a dropdown, not gr.Examples: one line instead of three, so the Live view fits a laptop screen
        examples = gr.Dropdown([name for name, _ in EXAMPLES], value=EXAMPLES[0][0], show_label=False,
                               container=False, elem_id="sv-examples", scale=2, min_width=270, label="Examples")
        presenter = gr.Button("Presenter", elem_id="sv-presenter-btn", scale=1, min_width=90)
        # only where someone can present (the operator set a presenter key)
        # (its label on one line, the width it needs: at 1366 px a share of the row cut it to "Follow the present")
        box = gr.Checkbox(False, label="Follow the presenter", elem_id="sv-follow", container=False, scale=0,
                          min_width=0) if following else None
    examples.input(lambda name: dict(EXAMPLES).get(name, gr.skip()), [examples], [prompt], api_visibility="private")
    return prompt, buttons, presenter, box


def live_tab() -> dict:
    """The four parts of one picture (ids sv-live-*): the verdict on top, the lanes, the latest round's bars."""
    blank = live.live_blank()
    with gr.Tab("Live", id="live"):
        with gr.Row(equal_height=True):
            parts = dict(speed=gr.HTML(blank.speed, elem_id="sv-live-speed"))
            parts["pq"] = gr.Plot(blank.pq, show_label=False, elem_id="sv-live-pq")
        gr.HTML(render.legend_html(compact=True), elem_id="sv-live-legend")  # the lanes' colours, one line
        with gr.Row(equal_height=True):
            parts["spec"] = gr.HTML(blank.spec, elem_id="sv-live-spec")
            parts["ar"] = gr.HTML(blank.ar, elem_id="sv-live-ar")
    return {name: parts[name] for name in ("speed", "spec", "ar", "pq")}


def decode_tab() -> dict:
    """The Decode tab: MainView's components (but the record) and the show-rejected toggle."""
    with gr.Tab("Decode", id="decode"):
        gr.HTML(render.legend_html())
        parts = dict(tokens=gr.HTML(render.rounds_html([], True), elem_id="sv-tokens"))
        parts["show_rejected"] = gr.Checkbox(True, label="show rejected and unverified drafts", container=False)
        parts["caption"] = gr.Markdown(elem_id="sv-caption")
        with gr.Row():
            parts["pq"] = gr.Plot(empty_figure("p/q bars of the current round appear here"), show_label=False,
                                  elem_id="sv-pq")
        with gr.Row():
            parts["rounds"] = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="sv-round",
                                        scale=1)
            parts["positions"] = gr.Dropdown([], label="Drill-down position", scale=2, elem_id="sv-position")
        parts["drill"] = gr.Plot(drilldown_figure(None, True), show_label=False, elem_id="sv-drill")
        with gr.Accordion("Statistics", open=True):
            parts["stats"] = gr.Markdown(teach.stats_markdown(RunStats(), ""), elem_id="sv-stats")
            parts["stats_fig"] = gr.Plot(stats_figure(RunStats()), show_label=False)
    return parts


def race_tab() -> dict:
    with gr.Tab("Race", id="race"):
        gr.Markdown(teach.RACE_NOTE, elem_classes="sv-note", elem_id="sv-race-note")
        with gr.Row(equal_height=True):
            parts = dict(ar=gr.HTML(elem_id="sv-race-ar"), spec=gr.HTML(elem_id="sv-race-spec"))
        parts["result"] = gr.Markdown(elem_id="sv-race-result")
        parts["fig"] = gr.Plot(race_figure(()), show_label=False, elem_id="sv-race-plot")
        parts["stats"] = gr.Markdown()
    return parts


def distribution_tab(limits: Limits) -> dict:
    with gr.Tab("Same distribution", id="distribution"):
        gr.Markdown(teach.DISTRIBUTION_NOTE, elem_classes="sv-note")
        with gr.Row():
            parts = controls(DistributionSettings, limits, prefix="sv-dist-")
            parts["button"] = gr.Button("Sample", variant="primary", elem_id="sv-dist-run")
        parts["fig"] = gr.Plot(empty_figure("empirical vs exact distributions appear here", 340), show_label=False,
                               elem_id="sv-dist-plot")
        parts["summary"] = gr.Markdown(elem_id="sv-dist-summary")
    return parts


def replay_tab() -> dict:
    shipped = shipped_traces()
    with gr.Tab("Replay", id="replay"):
        gr.Markdown("Replay a recorded trace without loading any model: rounds in the Decode tab, and the race (if "
                    "the trace has target-alone steps) in the Race tab, at the recorded pace.", elem_classes="sv-note")
        with gr.Row():
            parts = dict(upload=gr.File(label="Upload a trace (.json)", file_types=[".json"], type="filepath"))
            with gr.Column():
                parts["shipped"] = gr.Dropdown(shipped, value=shipped[0] if shipped else None,
                                               label="…or a shipped trace")
                parts["speed"] = gr.Slider(0, 8, value=1, step=0.5, label="speed (1 = recorded pace, 0 = instant)",
                                           elem_id="sv-speed")
        with gr.Row():
            parts["rounds"] = gr.Button("Replay rounds", variant="primary", elem_id="sv-replay")
            parts["race"] = gr.Button("Replay race", elem_id="sv-replay-race")
    return parts


def formulas_tab() -> None:
    with gr.Tab("How it works", id="formulas"):
        gr.Markdown(teach.FORMULAS, elem_id="sv-formulas", latex_delimiters=[
            {"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}])
        lesson.lesson_panel()


def pair_panel(session: Session) -> dict:
    first = next(iter(PRESETS))
    with gr.Accordion("Model pair", open=False):
        parts = dict(preset=gr.Dropdown(list(PRESETS), value=first, label="Preset"))
        draft, target = PRESETS[first]
        # the target's precision: race a GPU's economics (a bf16 target) against a CPU engine's (an int4 one)
        parts.update(controls(PairSpec, values=dict(draft=draft or "", target=target),
                              only=("draft", "target", "dtype", "target_quant")))
        parts["load"] = gr.Button("Load", elem_id="sv-load")
        parts["log"] = gr.Markdown(f"Serving **{session.name}**.", elem_id="sv-load-log")
    return parts


def settings_panel(limits: Limits, defaults: DecodeConfig) -> dict:
    """One control per decoding setting, generated from the spec, opening at `defaults`."""
    with gr.Group():
        return controls(DecodeConfig, limits, flat_values(defaults))


def presenting_events(demo: gr.Blocks, key: str, parts: dict, presenting: gr.State, link: gr.HTML) -> None:
    """The key, typed once in the presenter's browser, is kept there (encrypted in its storage) and checked
    again on every page load; a wrong key is one sentence. Visitors never see it."""
    stored = gr.BrowserState(None, storage_key="specviz-presenter-key")

    def on_present(given, request: gr.Request):
        if not is_presenter(key, given):
            gr.Warning(follow.WRONG_KEY)
            return gr.skip(), gr.skip(), gr.skip(), ""
        return True, given, gr.HTML(follow.follow_link(request), visible=True), ""

    def on_restore(kept, request: gr.Request):
        ok = is_presenter(key, kept)
        return ok, gr.HTML(follow.follow_link(request), visible=True) if ok else gr.skip()

    # queued (at once: no limit), so that a wrong key comes back as a toast
    parts["button"].click(on_present, [parts["key"]], [presenting, stored, link, parts["key"]],
                          api_visibility="private", concurrency_limit=None, concurrency_id="present")
    demo.load(on_restore, [stored], [presenting, link], api_visibility="private", queue=False)


def build_app(session: Session, limits: Limits = Limits(), options: h.Options = h.Options(),
              defaults: DecodeConfig = DecodeConfig(), presenter_key: str | None = None) -> gr.Blocks:
    """`presenter_key`: the browser it is entered in presents (its Live runs stream to every follower);
    without one, nobody presents and there is nothing to follow."""
    # the queue and the loads keep the served limits
    session.turns.per_client, session.turns.stall_seconds = limits.max_waiting_per_client, limits.max_seconds
    session.load_seconds = limits.max_load_seconds
    # analytics_enabled=False: no telemetry and no version check calling home (whatever the environment says)
    # delete_cache: Gradio's copies of exported files go after an hour too, checked hourly
    with gr.Blocks(title="specviz: speculative decoding, visible", analytics_enabled=False, fill_width=True,
                   delete_cache=(3600, 3600)) as demo:
        header = gr.HTML(render.header_html(session.name, pair_bytes(session.pair)))
        # the presenter's page: where the room follows (shown once the key is entered)
        link = gr.HTML("", elem_id="sv-follow-link", visible=False) if presenter_key is not None else None
        presenting = gr.State(False)  # set by the presenter key only: a visitor cannot broadcast
        # what a visitor's session holds is let go when it ends: the paused run's caches, the exported files
        record, stepper = gr.State(None), gr.State(None, delete_callback=h.reset_step)
        exports = gr.State([], delete_callback=h.remove_files)
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=520):
                prompt, buttons, presenter, box = prompt_area(following=presenter_key is not None)
                with gr.Tabs(elem_id="sv-tabs") as tabs:
                    live_parts, decode, race = live_tab(), decode_tab(), race_tab()
                    dist, replay = distribution_tab(limits), replay_tab()
                    formulas_tab()
                    what_if = whatif.whatif_tab(limits.max_k)
                    atlas_parts = atlas.atlas_tab()
                    engine_parts = engines.engines_tab(options.engines, limits)
            with gr.Column(scale=1, min_width=290, elem_id="sv-side"):
                pair = pair_panel(session) if session.allow_switch else None  # the operator's choice
                settings = settings_panel(limits, defaults)
                present = follow.presenter_controls() if presenter_key is not None else None
                with gr.Row():
                    export_btn = gr.Button("Export trace (JSON)", elem_id="sv-export-btn", min_width=100)
                    share_btn = gr.Button("Share as HTML", elem_id="sv-share-btn", min_width=100)
                export_file = gr.File(label="last run", interactive=False, visible=False, elem_id="sv-export")
        wiring = Wiring(session, limits, options, prompt, list(settings), record, tabs,
                        outputs_of(MainView, {**decode, "record": record}),
                        outputs_of(RaceView, {**race, "record": record}), outputs_of(live.LiveView, live_parts),
                        presenting, Broadcast() if presenter_key is not None else None)
        runs = wiring.runs(buttons, decode["show_rejected"], list(settings.values()), stepper)
        runs += wiring.replays(replay, decode["show_rejected"])
        runs.append(wiring.distribution(dist, list(settings.values())))
        runs.append(wiring.atlas_runs(atlas_parts, list(settings.values()), exports))
        runs.append(engines.wire(engine_parts, prompt, options.engines, limits))
        if pair is not None:
            runs.append(wiring.loading(pair, header))
        buttons.stop.click(None, None, None, cancels=runs)
        if presenter_key is not None:
            presenting_events(demo, presenter_key, present, presenting, link)
            wiring.following(box, follow.Followers(), [buttons.run.click, prompt.submit, buttons.rounds.click,
                                                       buttons.step.click, buttons.stop.click], demo.load)
        wiring.browsing(decode)
        whatif.wire(what_if, record)
        presenter.click(lambda: gr.Tabs(selected="live"), None, [tabs], js=TOGGLE_PRESENTER, api_visibility="private")
        # Gradio builds a visitor's session state (every component's config copied: tens of ms of CPU here) at its
        # first queued event: let that be the page's load, spread over the minutes a room takes to open it, not
        # the click they all make at once
        demo.load(lambda: None, None, None, api_visibility="private", concurrency_id="open", concurrency_limit=None)

        def on_export(rec, paths, html):
            path = h.export(rec, options, html)
            return gr.File(path, visible=True), [*paths, path]

        for button, html in ((export_btn, False), (share_btn, True)):
            button.click(lambda rec, paths, html=html: on_export(rec, paths, html), [record, exports],
                         [export_file, exports], api_visibility="private")
    return demo
