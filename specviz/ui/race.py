"""The Race tab (id race): both lanes of the last race side by side, their clocks, the verdict and the plot.

It has no button of its own: a Live run fills it once both lanes are done (live.py), a replayed race as it goes
(replay.py). `race_view` is what it shows of a race (pure: `RaceState` in, view out); `race_tab` lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from specviz.runs.race import RaceState
from specviz.runs.trace import Trace
from specviz.serving.recorded import clock_time
from specviz.ui import figures, render, teach
from specviz.ui.handlers import outputs


@dataclass
class RaceView:
    ar: str  # HTML lane
    spec: str
    fig: object
    result: str  # Markdown
    stats: str
    record: Trace | None


def gap(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def race_result(state: RaceState) -> str:
    """The verdict; a replayed race says where its trace was measured (its times are the trace's)."""
    if state.speedup is None:
        return "Both lanes are running, taking turns on the device…"
    s = state.speedup
    times, word = (s, "faster") if s >= 1 else (1 / s, "slower")  # 0.5× faster reads as 2.00× slower
    how = f"as recorded on {state.meta.recorded_on}" if state.recorded else "measured on each lane's own clock"
    how += f" at {clock_time(state.recorded_at)} on this server" if state.recorded_at is not None else ""
    lines = [f'<span class="sv-speedup">Speculative decoding: {times:.2f}× {word}</span> '
             f"({state.spec.tokens_per_s:.1f} vs {state.ar.tokens_per_s:.1f} tokens/s, {how})"]
    if state.greedy:
        d = state.divergence
        if d is None:
            lines.append("Greedy texts are **identical**." if state.identical else
                         "Greedy texts agree on their common length (one lane stopped earlier).")
        else:
            lines.append(divergence_note(d, state.meta.not_invariant))
    lines += [teach.recorded_note(state.recorded_at)] if state.recorded_at is not None else []
    lines += teach.race_caveats(state.shared_cpu, (state.ar.finished, state.spec.finished), state.timing_note)
    return "\n\n".join(lines)


def divergence_note(d, not_invariant: str | None) -> str:
    """Why greedy texts parted: where the verify was not made row-invariant, a near-tie rounded another way (and
    why it was not made so); where it was, something that should not happen."""
    where = (f"⚠ Greedy texts **differ from token {d.position + 1}** (outlined). The target's top-2 logit gap there "
             f"is {gap(d.target_top2_gap)} (target alone) / {gap(d.spec_top2_gap)} (verify pass)")
    if not_invariant is None:
        return (f"{where}, though this target's verify computes each row as its one-token step does, bit for bit: "
                "that should not happen. Please report it with the exported trace.")
    return (f"{where}: a near-tie that low precision can flip when the target scores K+1 tokens at once instead of "
            f"one. The rule is exact; this verify is not row-invariant here ({not_invariant}).")


def race_view(state: RaceState, source: str = "Race") -> RaceView:
    """The Race tab. The record (the Decode tab's slider and Export) is replaced only by a finished race,
    so starting a race, or stopping one, leaves the last run's record alone."""
    at = state.divergence.position if state.divergence else None
    return RaceView(
        ar=render.lane_html(state.ar, render.steps_html(state.ar.events, at), state.recorded),
        spec=render.lane_html(state.spec, render.spec_lane_html(state.spec.events, state.greedy, at), state.recorded),
        fig=figures.race_figure(state.lanes),
        result=race_result(state),
        stats=teach.stats_markdown(state.stats(), "Race, speculative lane") if state.done else "",
        record=state.trace(source) if state.done else gr.skip(),
    )


def race_blank() -> RaceView:
    """The Race tab as a race starts: empty lanes, and the last run's record kept."""
    return RaceView("", "", figures.race_figure(()), "Starting…", "", gr.skip())


@dataclass(frozen=True)
class RaceTab:
    """The tab's components, named like RaceView's fields."""

    ar: gr.HTML
    spec: gr.HTML
    result: gr.Markdown
    fig: gr.Plot
    stats: gr.Markdown
    record: gr.State  # the last run, shared with the Decode tab

    @property
    def outputs(self) -> list:
        return outputs(self, RaceView)


def race_tab(record: gr.State) -> RaceTab:
    with gr.Tab("Race", id="race"):
        gr.Markdown(teach.RACE_NOTE, elem_classes="sv-note", elem_id="sv-race-note")
        with gr.Row(equal_height=True):
            ar, spec = gr.HTML(elem_id="sv-race-ar"), gr.HTML(elem_id="sv-race-spec")
        result = gr.Markdown(elem_id="sv-race-result")
        fig = gr.Plot(figures.race_figure(()), show_label=False, elem_id="sv-race-plot")
        stats = gr.Markdown()
    return RaceTab(ar, spec, result, fig, stats, record)
