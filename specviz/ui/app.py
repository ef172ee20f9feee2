"""The Gradio app: the prompt, the tabs and the side panel laid out, each part wired by its own module.

    demo = build_app(Session(pair, spec), Limits())

A tab is one module with its layout, its handlers and its events: live.py, decode.py, race.py, distribution.py,
replay.py, lesson.py (How it works), whatif.py, atlas.py, engines.py. So are the prompt's row (prompt.py), the
pair panel (pair.py), Export and Share (exports.py) and the presenter's room (follow.py). What their events
share (the session, the prompt, the settings, the tabs) is a `Page` (handlers.py). The JSON API is added by
`specviz.server`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from specviz.engine import DecodeConfig
from specviz.models.memory import pair_bytes
from specviz.runs.broadcast import Broadcast
from specviz.serving.session import Session
from specviz.settings.limits import Limits
from specviz.settings.spec import flat_values
from specviz.ui import (
    atlas, decode, distribution, engines, exports, follow, lesson, live, pair, prompt, race, render, replay,
    tree_view, whatif,
)
from specviz.ui.controls import controls
from specviz.ui.handlers import Options, Page

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


@dataclass(frozen=True)
class AppTabs:
    """Every tab's components, in the order the tabs appear."""

    live: live.LiveTab
    decode: decode.DecodeTab
    race: race.RaceTab
    distribution: distribution.DistributionTab
    replay: replay.ReplayTab
    whatif: dict
    atlas: atlas.AtlasTab
    engines: engines.EnginesTab

    @property
    def live_outputs(self) -> live.LiveOutputs:
        return live.LiveOutputs(self.live, self.race, self.decode)


def app_tabs(limits: Limits, options: Options, record: gr.State) -> AppTabs:
    """`record`: the last run, which the Decode and Race tabs both show."""
    shown_live, shown_decode, shown_race = live.live_tab(), decode.decode_tab(record), race.race_tab(record)
    experiment, replays = distribution.distribution_tab(limits), replay.replay_tab()
    lesson.formulas_tab()
    return AppTabs(shown_live, shown_decode, shown_race, experiment, replays, whatif.whatif_tab(limits.max_k),
                   atlas.atlas_tab(), engines.engines_tab(options.engines, limits))


@dataclass(frozen=True)
class SidePanel:
    pair: pair.PairPanel | None  # only where the operator allows switching the pair
    settings: dict  # one control per decoding setting, by name
    present: follow.PresenterControls | None  # only where a presenter key is set
    exports: exports.ExportPanel


def side_panel(session: Session, limits: Limits, defaults: DecodeConfig, room: bool) -> SidePanel:
    panel = pair.pair_panel(session) if session.allow_switch else None  # the operator's choice
    with gr.Group():  # generated from the spec, opening at `defaults`
        settings = controls(DecodeConfig, limits, flat_values(defaults))
    present = follow.presenter_controls() if room else None
    return SidePanel(panel, settings, present, exports.export_panel())


def build_app(session: Session, limits: Limits = Limits(), options: Options = Options(),
              defaults: DecodeConfig = DecodeConfig(), presenter_key: str | None = None) -> gr.Blocks:
    """`presenter_key`: the browser it is entered in presents (its Live runs stream to every follower);
    without one, nobody presents and there is nothing to follow."""
    # the queue and the loads keep the served limits
    session.turns.per_client, session.turns.stall_seconds = limits.max_waiting_per_client, limits.max_seconds
    session.load_seconds = limits.max_load_seconds
    room = presenter_key is not None
    # analytics_enabled=False: no telemetry and no version check calling home (whatever the environment says)
    # delete_cache: Gradio's copies of exported files go after an hour too, checked hourly
    with gr.Blocks(title="specviz: speculative decoding, visible", analytics_enabled=False, fill_width=True,
                   delete_cache=(3600, 3600)) as demo:
        header = gr.HTML(render.header_html(session.name, pair_bytes(session.pair)))
        # the presenter's page: where the room follows (shown once the key is entered)
        link = gr.HTML("", elem_id="sv-follow-link", visible=False) if room else None
        record = gr.State(None)  # the last run: Decode and Race show it, Export writes it, What if reads it
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=520):
                area = prompt.prompt_area(following=room)
                with gr.Tabs(elem_id="sv-tabs") as tabs:
                    parts = app_tabs(limits, options, record)
            with gr.Column(scale=1, min_width=290, elem_id="sv-side"):
                side = side_panel(session, limits, defaults, room)
        page = Page(session, limits, options, area.prompt, side.settings, tabs)
        broadcast = Broadcast() if room else None
        runs = [*live.wire(page, parts.live_outputs, area, broadcast), *decode.wire(page, parts.decode, area),
                *replay.wire(page, parts.replay, parts.decode, parts.race), distribution.wire(page, parts.distribution),
                atlas.wire(page, parts.atlas, parts.decode, side.exports.files),
                engines.wire(parts.engines, area.prompt, options.engines, limits)]
        if side.pair is not None:
            runs.append(pair.wire(page, side.pair, header))
        area.stop.click(None, None, None, cancels=runs)
        if room:
            follow.presenting(demo, presenter_key, side.present, parts.live.presenting, link)
            follow.following(page, parts.live_outputs, area, broadcast, demo.load)
        whatif.wire(parts.whatif, record)
        prompt.wire(area, tabs)
        # Gradio builds a visitor's session state (every component's config copied: tens of ms of CPU here) at its
        # first queued event: let that be the page's load, spread over the minutes a room takes to open it, not
        # the click they all make at once
        demo.load(lambda: None, None, None, api_visibility="private", concurrency_id="open", concurrency_limit=None)
        exports.wire(side.exports, record, options)
    return demo
