"""The Gradio app's layout and event wiring: small layout functions, one per part, and `build_app`.

    demo = build_app(Session(pair, spec), Limits())

Handlers (handlers.py) do the work through the run paths; views.py says what each part shows.
Every event that touches the model shares one concurrency group of size 1 (one model, one run at a
time; other requests wait in the queue). The JSON API is added by `specviz.server`.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, fields
from html import escape

import gradio as gr

from specviz.analysis.stats import RunStats
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.models.presets import PRESETS
from specviz.runs.distribution import DistributionSettings
from specviz.runs.limits import Limits
from specviz.runs.replay import shipped_traces
from specviz.runs.session import Session
from specviz.runs.settings import flat_values
from specviz.ui import handlers as h
from specviz.ui import render, teach
from specviz.ui.controls import controls
from specviz.ui.figures import drilldown_figure, empty_figure, race_figure, stats_figure
from specviz.ui.views import MainView, RaceView, as_tuple, main_view, race_blank

MODEL = "model"  # the concurrency group of everything that runs the pair

EXAMPLES = [
    ("Code (high acceptance)", "Write a Python function `is_prime(n)` with a docstring and type hints, "
     "then a loop that prints the primes below 50."),
    ("JSON (high acceptance)", "Return only a JSON array of three fictional employees, each with the keys "
     "\"name\", \"age\", \"department\" and \"email\"."),
    ("Rewrite (try the lookup drafter)", "Rename the variable `x` to `total` and return the whole code:\n\n"
     "def add_all(items):\n    x = 0\n    for item in items:\n        x = x + item\n    return x\n"),
    ("Story (low acceptance)", "Write a short surreal story about a lighthouse keeper who collects lost colours."),
]

APP_CSS = render.CSS + """
.sv-header { display: flex; align-items: baseline; gap: 6px 16px; flex-wrap: wrap; padding: 2px 4px; }
.sv-header h1 { margin: 0; font-size: 26px; }
.sv-tagline { font-size: 15px; }
#sv-pair { color: var(--body-text-color-subdued); font-size: 13px; }
#sv-caption { min-height: 150px; }
.sv-note { font-size: 13px; color: var(--body-text-color-subdued); }
footer { display: none !important; }
"""


def header_html(pair: str) -> str:
    return (f'<div class="sv-header"><h1>specviz</h1><span class="sv-tagline">speculative decoding, visible</span>'
            f'<span id="sv-pair">serving {escape(pair)}</span></div>')


def outputs_of(view_cls, parts: dict) -> list:
    """The components for a view dataclass, in its field order."""
    return [parts[f.name] for f in fields(view_cls)]


@dataclass
class Buttons:
    run: gr.Button
    step: gr.Button
    race: gr.Button
    stop: gr.Button


def prompt_area() -> tuple[gr.Textbox, Buttons]:
    prompt = gr.Textbox(label="Prompt", lines=4, max_lines=12, value=EXAMPLES[0][1], elem_id="sv-prompt")
    gr.Examples([[p] for _, p in EXAMPLES], inputs=[prompt], example_labels=[n for n, _ in EXAMPLES], label="Examples")
    with gr.Row():
        buttons = Buttons(gr.Button("Run", variant="primary", elem_id="sv-run"),
                          gr.Button("Step (one round)", elem_id="sv-step"),
                          gr.Button("Run race", elem_id="sv-race-run"),
                          gr.Button("Stop", variant="stop", elem_id="sv-stop"))
    return prompt, buttons


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


def pair_panel(session: Session) -> dict:
    first = next(iter(PRESETS))
    with gr.Accordion("Model pair", open=False):
        parts = dict(preset=gr.Dropdown(list(PRESETS), value=first, label="Preset"))
        draft, target = PRESETS[first]
        parts.update(controls(PairSpec, values=dict(draft=draft or "", target=target), only=("draft", "target", "dtype")))
        parts["load"] = gr.Button("Load", elem_id="sv-load")
        parts["log"] = gr.Markdown(f"Serving **{session.name}**.", elem_id="sv-load-log")
    return parts


def settings_panel(limits: Limits, defaults: DecodeConfig) -> dict:
    """One control per decoding setting, generated from the spec, opening at `defaults`."""
    with gr.Group():
        return controls(DecodeConfig, limits, flat_values(defaults))


def build_app(session: Session, limits: Limits = Limits(), options: h.Options = h.Options(),
              defaults: DecodeConfig = DecodeConfig()) -> gr.Blocks:
    # analytics_enabled=False: no telemetry and no version check calling home (whatever the environment says)
    with gr.Blocks(title="specviz: speculative decoding, visible", analytics_enabled=False) as demo:
        header = gr.HTML(header_html(session.name))
        record, stepper = gr.State(None), gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=520):
                prompt, buttons = prompt_area()
                with gr.Tabs() as tabs:
                    decode, race, dist, replay = decode_tab(), race_tab(), distribution_tab(limits), replay_tab()
                    formulas_tab()
            with gr.Column(scale=1, min_width=290):
                pair = pair_panel(session)
                settings = settings_panel(limits, defaults)
                export_btn = gr.Button("Export last run as a trace", elem_id="sv-export-btn")
                export_file = gr.File(label="trace (JSON)", interactive=False, visible=False, elem_id="sv-export")
        wiring = Wiring(session, limits, options, prompt, list(settings), record, tabs,
                        outputs_of(MainView, {**decode, "record": record}),
                        outputs_of(RaceView, {**race, "record": record}))
        runs = wiring.runs(buttons, decode["show_rejected"], list(settings.values()), stepper)
        runs += wiring.replays(replay, decode["show_rejected"])
        runs += [wiring.distribution(dist, list(settings.values())), wiring.loading(pair, header)]
        buttons.stop.click(None, None, None, cancels=runs)
        wiring.browsing(decode)
        export_btn.click(lambda rec: gr.File(h.export(rec, options), visible=True), [record], [export_file],
                         api_visibility="private")
    return demo


@dataclass
class Wiring:
    """The app's events: each handler's inputs and outputs, in one place per group of buttons."""

    session: Session
    limits: Limits
    options: h.Options
    prompt: gr.Textbox
    names: list[str]  # the decoding settings' names, in their controls' order
    record: gr.State
    tabs: gr.Tabs
    main_out: list
    race_out: list

    def settings_of(self, values) -> dict:
        return dict(zip(self.names, values))

    def runs(self, buttons: Buttons, show_rejected, settings: list, stepper) -> list:
        s, lim, opt = self.session, self.limits, self.options

        def on_run(text, *values):
            *values, show = values
            yield from stream(h.run(s, lim, text, self.settings_of(values), show, opt))

        def on_step(state, text, *values):
            *values, show = values
            yield from stream(h.step(s, lim, state, text, self.settings_of(values), show, opt),
                              lambda pair: (*as_tuple(pair[0]), pair[1]))

        def on_race(text, *values):
            yield (gr.Tabs(selected="race"), *as_tuple(race_blank()))
            yield from stream(h.race(s, lim, text, self.settings_of(values), opt), with_tabs)

        inputs = [self.prompt, *settings, show_rejected]
        events = [trigger(on_run, inputs, self.main_out, api_visibility="private", concurrency_id=MODEL)
                  for trigger in (buttons.run.click, self.prompt.submit)]
        for trigger in (buttons.run.click, self.prompt.submit):  # a plain run ends any paused step-mode run
            trigger(h.reset_step, [stepper], [stepper], api_visibility="private", queue=False)
        events.append(buttons.step.click(on_step, [stepper, *inputs], [*self.main_out, stepper],
                                         api_visibility="private", concurrency_id=MODEL))
        events.append(buttons.race.click(on_race, [self.prompt, *settings], [self.tabs, *self.race_out],
                                         api_visibility="private", concurrency_id=MODEL))
        return events

    def replays(self, replay: dict, show_rejected) -> list:
        def on_replay(file, name, pace, show):
            yield (gr.Tabs(selected="decode"), *as_tuple(main_view(None)))
            yield from stream(h.replay_rounds(file, name, pace, show), with_tabs)

        def on_replay_race(file, name, pace):
            yield (gr.Tabs(selected="race"), *as_tuple(race_blank()))
            yield from stream(h.replay_race(file, name, pace), with_tabs)

        source = [replay["upload"], replay["shipped"], replay["speed"]]
        return [replay["rounds"].click(on_replay, [*source, show_rejected], [self.tabs, *self.main_out],
                                       api_visibility="private", concurrency_limit=4),
                replay["race"].click(on_replay_race, source, [self.tabs, *self.race_out], api_visibility="private",
                                     concurrency_limit=4)]

    def distribution(self, dist: dict, settings: list):
        def on_distribution(text, samples, temperature, *values):
            experiment = dict(samples=samples, temperature=temperature)
            yield from stream(h.same_distribution(self.session, self.limits, text, self.settings_of(values),
                                                  experiment))

        return dist["button"].click(on_distribution, [self.prompt, dist["samples"], dist["temperature"], *settings],
                                    [dist["fig"], dist["summary"]], api_visibility="private", concurrency_id=MODEL)

    def loading(self, pair: dict, header: gr.HTML):
        def on_load(d, t, dt):
            yield from h.load_models(self.session, d, t, dt)

        pair["preset"].input(lambda name: (PRESETS[name][0] or "", PRESETS[name][1]), [pair["preset"]],
                             [pair["draft"], pair["target"]], api_visibility="private")
        return pair["load"].click(on_load, [pair["draft"], pair["target"], pair["dtype"]], [pair["log"]],
                                  api_visibility="private", concurrency_id=MODEL).then(
            lambda: header_html(self.session.name), None, [header], api_visibility="private")

    def browsing(self, decode: dict) -> None:
        gr.on([decode["rounds"].input, decode["show_rejected"].input],
              lambda rec, n, show: as_tuple(h.browse(rec, n, show)),
              [self.record, decode["rounds"], decode["show_rejected"]], self.main_out, api_visibility="private")
        decode["positions"].input(h.pick_position, [self.record, decode["rounds"], decode["positions"]],
                                  [decode["drill"]], api_visibility="private")


def stream(views, convert=as_tuple):
    """Map a handler's views onto output tuples; closing this (Stop) closes the handler, which ends the
    run and releases the pair at once rather than whenever the garbage collector gets to it."""
    with closing(views):
        for view in views:
            yield convert(view)


def with_tabs(view) -> tuple:
    return (gr.Tabs(), *as_tuple(view))
