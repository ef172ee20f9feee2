"""The Gradio app: `build_app` lays out the components and wires events; handlers.py does the work.

    demo = build_app(Session(pair, spec), Limits())
    launch(demo, host="127.0.0.1", port=7860)

Every event that touches the model shares one concurrency group of size 1 (one model, one run at a
time; other requests wait in the queue). `register_api` adds the named JSON endpoints for scripts
(/generate, /race, /replay, /same_distribution, /load_pair, /info; see the README's API section).
The app is offline by default: no Gradio telemetry, no version check, no share link.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import fields
from html import escape
from pathlib import Path

import gradio as gr

from specviz.limits import Limits
from specviz.ui import api
from specviz.ui import handlers as h
from specviz.ui import render, teach
from specviz.ui.figures import drilldown_figure, empty_figure, race_figure, stats_figure
from specviz.ui.session import PRESETS, Session
from specviz.ui.stats import RunStats

ASSETS = Path(__file__).resolve().parents[2] / "assets"
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


def outputs_of(view_cls, components: dict) -> list:
    """The components for a view dataclass, in its field order."""
    return [components[f.name] for f in fields(view_cls)]


def build_app(session: Session, limits: Limits = Limits(), options: h.Options | None = None,
              defaults: h.Settings = h.Settings()) -> gr.Blocks:
    options = options or h.Options(assets_dir=ASSETS)
    shipped = h.shipped_traces(options.assets_dir)
    preset_names = list(PRESETS)

    # analytics_enabled=False: no telemetry and no version check calling home (whatever the environment says)
    with gr.Blocks(title="specviz: speculative decoding, visible", analytics_enabled=False) as demo:
        header = gr.HTML(header_html(session.name))
        record = gr.State(None)
        stepper = gr.State(None)

        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=520):
                prompt = gr.Textbox(label="Prompt", lines=4, max_lines=12, value=EXAMPLES[0][1], elem_id="sv-prompt")
                gr.Examples([[p] for _, p in EXAMPLES], inputs=[prompt], example_labels=[n for n, _ in EXAMPLES],
                            label="Examples")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                    step_btn = gr.Button("Step (one round)", elem_id="sv-step")
                    race_btn = gr.Button("Run race", elem_id="sv-race-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")

                with gr.Tabs() as tabs:
                    with gr.Tab("Decode", id="decode"):
                        gr.HTML(render.legend_html())
                        tokens = gr.HTML(render.rounds_html([], True), elem_id="sv-tokens")
                        show_rejected = gr.Checkbox(True, label="show rejected and unverified drafts",
                                                    container=False)
                        caption = gr.Markdown(elem_id="sv-caption")
                        with gr.Row():
                            pq = gr.Plot(empty_figure("p/q bars of the current round appear here"),
                                         show_label=False, elem_id="sv-pq")
                        with gr.Row():
                            round_slider = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="sv-round",
                                                     scale=1)
                            position = gr.Dropdown([], label="Drill-down position", scale=2, elem_id="sv-position")
                        drill_plot = gr.Plot(drilldown_figure(None, True), show_label=False, elem_id="sv-drill")
                        with gr.Accordion("Statistics", open=True):
                            stats_md = gr.Markdown(teach.stats_markdown(RunStats(), ""), elem_id="sv-stats")
                            stats_fig = gr.Plot(stats_figure(RunStats()), show_label=False)

                    with gr.Tab("Race", id="race"):
                        gr.Markdown(teach.RACE_NOTE, elem_classes="sv-note", elem_id="sv-race-note")
                        with gr.Row(equal_height=True):
                            ar_lane = gr.HTML(elem_id="sv-race-ar")
                            spec_lane = gr.HTML(elem_id="sv-race-spec")
                        race_result = gr.Markdown(elem_id="sv-race-result")
                        race_plot = gr.Plot(race_figure(()), show_label=False, elem_id="sv-race-plot")
                        race_stats = gr.Markdown()

                    with gr.Tab("Same distribution", id="distribution"):
                        gr.Markdown(
                            "Sample many short continuations of the prompt with speculative decoding and with the "
                            "target alone (seed i for sample i), and compare the **first token** with the "
                            "target's exact distribution. Each speculative first token went through "
                            "accept/reject: it is an accepted draft or a correction from the residual. K, drafter, "
                            "top-k and top-p come from the settings.", elem_classes="sv-note")
                        with gr.Row():
                            n_samples = gr.Slider(10, limits.max_samples, value=min(200, limits.max_samples), step=10,
                                                  label="samples per side", elem_id="sv-samples")
                            dist_temp = gr.Slider(0.1, 2.0, value=1.0, step=0.05, label="temperature")
                            dist_btn = gr.Button("Sample", variant="primary", elem_id="sv-dist-run")
                        dist_plot = gr.Plot(empty_figure("empirical vs exact distributions appear here", 340),
                                            show_label=False, elem_id="sv-dist-plot")
                        dist_md = gr.Markdown(elem_id="sv-dist-summary")

                    with gr.Tab("Replay", id="replay"):
                        gr.Markdown("Replay a recorded trace without loading any model: rounds in the Decode tab, "
                                    "and the race (if the trace has target-alone steps) in the Race tab, at the "
                                    "recorded pace.", elem_classes="sv-note")
                        with gr.Row():
                            upload = gr.File(label="Upload a trace (.json)", file_types=[".json"], type="filepath")
                            with gr.Column():
                                shipped_dd = gr.Dropdown(shipped, value=shipped[0] if shipped else None,
                                                         label="…or a shipped trace")
                                speed = gr.Slider(0, 8, value=1, step=0.5, label="speed (1 = recorded pace, 0 = instant)",
                                                  elem_id="sv-speed")
                        with gr.Row():
                            replay_btn = gr.Button("Replay rounds", variant="primary", elem_id="sv-replay")
                            replay_race_btn = gr.Button("Replay race", elem_id="sv-replay-race")

                    with gr.Tab("How it works", id="formulas"):
                        gr.Markdown(teach.FORMULAS, elem_id="sv-formulas", latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                                                       {"left": "$", "right": "$", "display": False}])

            with gr.Column(scale=1, min_width=290):
                with gr.Accordion("Model pair", open=False):
                    preset = gr.Dropdown(preset_names, value=preset_names[0], label="Preset")
                    draft_src = gr.Textbox(PRESETS[preset_names[0]][0] or "", label="Draft (hub id, folder, .gguf)",
                                           elem_id="sv-draft")
                    target_src = gr.Textbox(PRESETS[preset_names[0]][1], label="Target", elem_id="sv-target")
                    dtype = gr.Dropdown(["auto", "bfloat16", "float32", "float16"], value="auto", label="dtype")
                    load_btn = gr.Button("Load", elem_id="sv-load")
                    load_log = gr.Markdown(f"Serving **{session.name}**.", elem_id="sv-load-log")
                with gr.Group():
                    k = gr.Slider(1, limits.max_k, value=defaults.k, step=1, label="K (tokens drafted per round)")
                    adaptive = gr.Radio(["fixed", "confidence", "acceptance"], value=defaults.adaptive,
                                        label="adaptive K")
                    drafter = gr.Radio(["model", "lookup", "hybrid"], value=defaults.drafter, label="drafter")
                    temperature = gr.Slider(0, 2, value=defaults.temperature, step=0.05,
                                            label="temperature (0 = greedy)")
                    top_k = gr.Number(defaults.top_k, precision=0, label="top-k (0 = off)", minimum=0)
                    top_p = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="top-p")
                    seed = gr.Number(defaults.seed, precision=0, label="seed")
                    max_new = gr.Slider(1, limits.max_new_tokens, value=defaults.max_new_tokens, step=1,
                                        label="max new tokens", elem_id="sv-max-new")
                export_btn = gr.Button("Export last run as a trace", elem_id="sv-export-btn")
                export_file = gr.File(label="trace (JSON)", interactive=False, visible=False, elem_id="sv-export")

        controls = dict(k=k, adaptive=adaptive, drafter=drafter, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, max_new_tokens=max_new)  # Settings' fields
        settings = list(controls.values())

        def settings_of(values) -> h.Settings:
            return h.Settings(**dict(zip(controls, values)))
        main = dict(tokens=tokens, caption=caption, pq=pq, rounds=round_slider, positions=position,
                    drill=drill_plot, stats=stats_md, stats_fig=stats_fig, record=record)
        main_out = outputs_of(h.MainView, main)
        race_parts = dict(ar=ar_lane, spec=spec_lane, fig=race_plot, result=race_result, stats=race_stats,
                          record=record)
        race_out = outputs_of(h.RaceView, race_parts)

        def on_run(text, *values):
            *s, show = values
            yield from stream(h.run(session, limits, text, settings_of(s), show, options))

        def on_step(state, text, *values):
            *s, show = values
            yield from stream(h.step(session, limits, state, text, settings_of(s), show, options),
                              lambda pair: (*astuple_shallow(pair[0]), pair[1]))

        def on_race(text, *s):
            yield (gr.Tabs(selected="race"), *race_blank())
            yield from stream(h.run_race(session, limits, text, settings_of(s), options), with_tabs)

        def on_distribution(text, n, temp, *s):
            yield from stream(h.same_distribution(session, limits, text, settings_of(s), n, temp))

        def on_replay(file, name, pace, show):
            yield (gr.Tabs(selected="decode"), *astuple_shallow(h.main_view(None)))
            yield from stream(h.replay(file, name, pace, show, options), with_tabs)

        def on_replay_race(file, name, pace):
            yield (gr.Tabs(selected="race"), *race_blank())
            yield from stream(h.replay_race_view(file, name, pace, options), with_tabs)

        def race_blank():
            return ("", "", race_figure(()), "Starting…", "", gr.skip())

        def on_load(d, t, dt):
            yield from h.load_pair(session, d, t, dt)

        run_ev = run_btn.click(on_run, [prompt, *settings, show_rejected], main_out, api_visibility="private",
                               concurrency_id=MODEL)
        submit_ev = prompt.submit(on_run, [prompt, *settings, show_rejected], main_out, api_visibility="private",
                                  concurrency_id=MODEL)
        step_ev = step_btn.click(on_step, [stepper, prompt, *settings, show_rejected], [*main_out, stepper],
                                 api_visibility="private", concurrency_id=MODEL)
        race_ev = race_btn.click(on_race, [prompt, *settings], [tabs, *race_out], api_visibility="private",
                                 concurrency_id=MODEL)
        dist_ev = dist_btn.click(on_distribution, [prompt, n_samples, dist_temp, *settings], [dist_plot, dist_md],
                                 api_visibility="private", concurrency_id=MODEL)
        replay_ev = replay_btn.click(on_replay, [upload, shipped_dd, speed, show_rejected], [tabs, *main_out],
                                     api_visibility="private", concurrency_limit=4)
        replay_race_ev = replay_race_btn.click(on_replay_race, [upload, shipped_dd, speed], [tabs, *race_out],
                                               api_visibility="private", concurrency_limit=4)
        load_ev = load_btn.click(on_load, [draft_src, target_src, dtype], [load_log], api_visibility="private",
                                 concurrency_id=MODEL).then(lambda: header_html(session.name), None, [header],
                                                            api_visibility="private")
        stop_btn.click(None, None, None, cancels=[run_ev, submit_ev, step_ev, race_ev, dist_ev, replay_ev,
                                                  replay_race_ev, load_ev])
        for decode in (run_btn.click, prompt.submit):  # a plain run ends any paused step-mode run
            decode(h.reset_step, [stepper], [stepper], api_visibility="private", queue=False)

        gr.on([round_slider.input, show_rejected.input],
              lambda rec, n, show: astuple_shallow(h.browse(rec, n, show)),
              [record, round_slider, show_rejected], main_out, api_visibility="private")
        position.input(h.pick_position, [record, round_slider, position], [drill_plot], api_visibility="private")
        preset.input(lambda name: (PRESETS[name][0] or "", PRESETS[name][1]), [preset], [draft_src, target_src],
                     api_visibility="private")
        export_btn.click(lambda rec: gr.File(h.export(rec, options), visible=True), [record], [export_file],
                         api_visibility="private")

        register_api(session, limits, options)

    demo.queue(default_concurrency_limit=1, max_size=limits.max_queue)  # a full queue turns requests away
    return demo


def stream(views: Iterator, convert=None) -> Iterator:
    """Map a handler's views onto output tuples; closing this (Stop) closes the handler, which ends the
    run and releases the pair at once rather than whenever the garbage collector gets to it."""
    convert = convert or astuple_shallow
    with closing(views):
        for view in views:
            yield convert(view)


def with_tabs(view) -> tuple:
    return (gr.Tabs(), *astuple_shallow(view))


def astuple_shallow(view) -> tuple:
    """A view dataclass as a tuple of its fields (dataclasses.astuple would deep-copy figures)."""
    return tuple(getattr(view, f.name) for f in fields(view))


def register_api(session: Session, limits: Limits, options: h.Options) -> None:
    """JSON endpoints for scripts (gradio_client). Typed signatures become the API schema."""

    def generate(prompt: str, k: int = 4, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, drafter: str = "model", adaptive: str = "fixed"
                 ) -> Iterator[dict]:
        """Speculative decoding, streamed: one {"event": "round", "round": {...}} per round, then
        {"event": "done", "text", "rounds", "finished", "stats", "meta"}."""
        s = h.Settings(k=k, adaptive=adaptive, drafter=drafter, temperature=temperature, top_k=top_k, top_p=top_p,
                       seed=seed, max_new_tokens=max_new_tokens)
        yield from api.generate(session, limits, prompt, s)

    def race(prompt: str, k: int = 4, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, drafter: str = "model", adaptive: str = "fixed") -> Iterator[dict]:
        """The target alone vs speculative decoding, alternated on one device, each lane timed on its own
        clock. Streams {"event": "race", "ar": lane, "spec": lane, ...}; the last has "event": "done",
        "speedup", "identical", "divergence", "stats"."""
        s = h.Settings(k=k, adaptive=adaptive, drafter=drafter, temperature=temperature, top_k=top_k, top_p=top_p,
                       seed=seed, max_new_tokens=max_new_tokens)
        yield from api.run_race(session, limits, prompt, s, options)

    def replay(trace: str) -> Iterator[dict]:
        """Replay a trace without models: `trace` is a shipped trace's name (see /info) or a trace's JSON
        text. Streams its rounds, then a summary (with the recorded race if the trace has AR steps)."""
        yield from api.replay(trace, options)

    def same_distribution(prompt: str, samples: int = 200, temperature: float = 1.0, k: int = 4, top_k: int = 0,
                          top_p: float = 1.0, seed: int = 0, drafter: str = "model") -> Iterator[dict]:
        """First-token frequencies of speculative vs target-alone samples against the exact distribution,
        with total variation and χ² p-values. Streams progress; the last has "event": "done"."""
        s = h.Settings(k=k, drafter=drafter, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       max_new_tokens=2)
        yield from api.same_distribution(session, limits, prompt, s, samples, temperature)

    def load_pair(draft: str, target: str, dtype: str = "auto") -> str:
        """Swap the served pair (the previous one is released first). Returns the new pair's name."""
        for _ in h.load_pair(session, draft, target, dtype):  # run the load to its end; errors raise
            pass
        return session.name

    def info() -> dict:
        """The served pair, the limits, the model presets and the shipped traces."""
        return {"pair": session.name, "limits": limits.__dict__, "presets": {k: list(v) for k, v in PRESETS.items()},
                "shipped_traces": h.shipped_traces(options.assets_dir)}

    for fn in (generate, race, same_distribution, load_pair):
        gr.api(fn, api_name=fn.__name__, concurrency_id=MODEL)
    gr.api(replay, api_name="replay", concurrency_limit=4)
    gr.api(info, api_name="info", concurrency_limit=None, queue=False)


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, **kwargs):
    """Serve on loopback by default; never share through Gradio's tunnel unless asked."""
    return demo.launch(server_name=host, server_port=port, share=False, css=APP_CSS, show_error=True,
                       max_file_size="20mb", theme=gr.themes.Soft(), **kwargs)
