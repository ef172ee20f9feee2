"""The How it works tab (id formulas): the formulas, and a live lesson: a temperature slider moves a target's and a
draft's distributions apart, and the acceptance measured over a batch of rounds through the rule follows
β = Σ min(p, q) = 1 − TV(p, q)."""

from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.analysis.overlap_lesson import OverlapPoint, beta_curve, overlap_point
from specviz.ui import teach
from specviz.ui.figures import _layout

TEMPERATURES = [round(0.1 * i, 1) for i in range(1, 31)]
START = 1.0

INTRO = ("**Overlap is acceptance.** A drafted token x is drawn from q and kept with probability min(1, p(x)/q(x)); "
         "on average that is β = Σ min(p, q) = 1 − TV(p, q), the mass the two distributions share. Move the "
         "temperature: it reshapes both distributions, and the acceptance measured over a batch of rounds through "
         "the rule follows β.")


def lesson_text(point: OverlapPoint) -> str:
    low, high = point.expected_range
    return (f"At temperature {point.temperature:g}: β = 1 − TV(p, q) = **{point.beta:.2f}**. {point.drafted} drafts "
            f"through the rule: {point.accepted} accepted, **{point.measured:.2f}** (β predicts {low:.2f}–{high:.2f} "
            "99 times in 100).")


def lesson_figure(point: OverlapPoint) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1,
                        subplot_titles=["p (target) and q (draft); their overlap is β", "acceptance against β"])
    order = sorted(range(len(point.p)), key=lambda i: -point.p[i])[:12]
    xs = [f"x{i}" for i in order]
    fig.add_bar(x=xs, y=[point.q[i] for i in order], name="q (draft)", marker=dict(color="#94a3b8"), row=1, col=1)
    fig.add_bar(x=xs, y=[point.p[i] for i in order], name="p (target)", marker=dict(color="#475569"), row=1, col=1)
    fig.add_bar(x=xs, y=[min(point.p[i], point.q[i]) for i in order], name="min(p, q)",
                marker=dict(color="#7c3aed", opacity=0.6), row=1, col=1)
    fig.add_scatter(x=TEMPERATURES, y=beta_curve(TEMPERATURES), mode="lines", name="β = 1 − TV(p, q)",
                    line=dict(color="#7c3aed"), row=1, col=2)
    low, high = point.expected_range
    fig.add_scatter(x=[point.temperature], y=[point.measured], mode="markers", name="measured acceptance",
                    marker=dict(size=11, color="#16a34a"),
                    error_y=dict(type="data", symmetric=False, array=[max(0.0, high - point.measured)],
                                 arrayminus=[max(0.0, point.measured - low)]), row=1, col=2)
    fig.update_xaxes(title="temperature", row=1, col=2)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(barmode="overlay")
    fig.update_annotations(font=dict(size=12))
    return _layout(fig, "", 330)


def lesson_view(temperature: float) -> tuple[str, go.Figure]:
    point = overlap_point(float(temperature))
    return lesson_text(point), lesson_figure(point)


def lesson_panel() -> None:
    """The lesson's controls and views, wired (no model: it answers at once, outside the model's queue)."""
    gr.Markdown(INTRO)
    slider = gr.Slider(TEMPERATURES[0], TEMPERATURES[-1], value=START, step=0.1, label="temperature",
                       elem_id="sv-lesson-t")
    text, fig = lesson_view(START)
    summary = gr.Markdown(text, elem_id="sv-lesson-text")
    plot = gr.Plot(fig, show_label=False, elem_id="sv-lesson-plot")
    slider.change(lesson_view, slider, [summary, plot], api_visibility="private", queue=False)


def formulas_tab() -> None:
    with gr.Tab("How it works", id="formulas"):
        gr.Markdown(teach.FORMULAS, elem_id="sv-formulas", latex_delimiters=[
            {"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}])
        lesson_panel()
