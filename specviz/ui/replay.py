"""The Replay tab (id replay): a recorded trace streamed again without any model, at its recorded pace: its
rounds in the Decode tab, its race (if it has target-alone steps) in the Race tab.

`replay_rounds` and `replay_race` (plain generators over `runs.replay`) yield the Decode and Race tabs' views;
`replay_tab` lays the tab out and `wire` connects its two buttons.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import gradio as gr

from specviz.runs import replay as replays
from specviz.runs.replay import shipped_traces, trace_data
from specviz.serving.pacing import paced
from specviz.ui import render
from specviz.ui.decode import DecodeTab, MainView, main_view
from specviz.serving.turns import REPLAY
from specviz.ui.handlers import Options, Page, shown, stream, user_errors
from specviz.ui.race import RaceTab, RaceView, race_blank, race_view


@user_errors
@trace_data
def replay_rounds(upload, shipped, speed, show_rejected: bool = True, options: Options = Options()
                  ) -> Iterator[MainView]:
    """Stream a recorded run round by round, at its recorded pace divided by `speed` (0: at once), shown at
    most every `options.pace.min_interval` seconds (and at the end) like a live run, each round rendered once."""
    t = replays.open_trace(upload, shipped)
    tokens_html = render.RoundsHtml()
    for shown_trace, show in paced(replays.replay(t, speed), options.pace.min_interval):
        last = len(shown_trace.rounds) == len(t.rounds)
        if show or last:
            yield main_view(shown_trace, show_rejected=show_rejected, live=not last, tokens_html=tokens_html)


@user_errors
@trace_data
def replay_race(upload, shipped, speed, options: Options = Options()) -> Iterator[RaceView]:
    t = replays.open_trace(upload, shipped)
    for state, show in paced(replays.replay_race_paced(t, speed), options.pace.min_interval):
        if show or state.done:
            yield race_view(state, t.source)


@dataclass(frozen=True)
class ReplayTab:
    upload: gr.File
    shipped: gr.Dropdown
    speed: gr.Slider
    rounds: gr.Button
    race: gr.Button


def replay_tab() -> ReplayTab:
    shipped = shipped_traces()
    with gr.Tab("Replay", id="replay"):
        gr.Markdown("Replay a recorded trace without loading any model: rounds in the Decode tab, and the race (if "
                    "the trace has target-alone steps) in the Race tab, at the recorded pace.", elem_classes="sv-note")
        with gr.Row():
            upload = gr.File(label="Upload a trace (.json)", file_types=[".json"], type="filepath")
            with gr.Column():
                menu = gr.Dropdown(shipped, value=shipped[0] if shipped else None, label="…or a shipped trace")
                speed = gr.Slider(0, 8, value=1, step=0.5, label="speed (1 = recorded pace, 0 = instant)",
                                  elem_id="sv-speed")
        with gr.Row():
            rounds = gr.Button("Replay rounds", variant="primary", elem_id="sv-replay")
            race = gr.Button("Replay race", elem_id="sv-replay-race")
    return ReplayTab(upload, menu, speed, rounds, race)


def wire(page: Page, tab: ReplayTab, decode: DecodeTab, race: RaceTab) -> list:
    """Replays wait in their own queue of one (REPLAY), so however many visitors replay at once, one replay at
    most takes CPU from a race being timed; that race notes it (RaceState.shared_cpu). Returns the events Stop
    cancels."""
    beside, options = page.session.beside, page.options

    def on_replay(file, name, pace, show_rejected):
        yield {page.tabs: gr.Tabs(selected="decode"), **shown(decode, main_view(None))}
        with beside.job():
            yield from stream(replay_rounds(file, name, pace, show_rejected, options), partial(shown, decode))

    def on_replay_race(file, name, pace):
        yield {page.tabs: gr.Tabs(selected="race"), **shown(race, race_blank())}
        with beside.job():
            yield from stream(replay_race(file, name, pace, options), partial(shown, race))

    source = [tab.upload, tab.shipped, tab.speed]
    queue = dict(api_visibility="private", concurrency_id=REPLAY, concurrency_limit=1)
    return [tab.rounds.click(on_replay, [*source, decode.show_rejected], [page.tabs, *decode.outputs], **queue),
            tab.race.click(on_replay_race, source, [page.tabs, *race.outputs], **queue)]
