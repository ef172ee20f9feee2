"""The Atlas's plotly figures: where in the round, by the draft's confidence and entropy, by token class.

Pure: the Atlas's findings in, a figure out. Every bar says its count on hover and in its label.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.analysis.atlas import Bin, ClassRow, Count, Where
from specviz.engine.events import ACCEPTED, REJECTED
from specviz.ui.figures import _layout, empty_figure
from specviz.ui.render import COLORS


def n_label(c: Count) -> str:
    return f"{c.rate:.0%}<br>n={c.n}"


def expected_markers(fig: go.Figure, xs: list, counts: list[Count], **where) -> None:
    """The mean β = Σ min(p, q) of the same drafts beside each realised rate: what should have happened."""
    shown = [(x, c.expected) for x, c in zip(xs, counts) if c.expected is not None]
    if shown:
        fig.add_scatter(x=[x for x, _ in shown], y=[e for _, e in shown], mode="markers", name="expected (mean β)",
                        marker=dict(symbol="diamond-open", size=12, color="#7c3aed", line=dict(width=2)),
                        hovertemplate="%{x}: expected %{y:.1%} (mean β)<extra></extra>", **where)


def position_figure(where: Where) -> go.Figure:
    counts = [c for c in where.by_position if c.n]
    if not counts:
        return empty_figure("no drafted token was tested", 300)
    xs = [str(i + 1) for i, c in enumerate(where.by_position) if c.n]
    fig = go.Figure(go.Bar(x=xs, y=[c.rate for c in counts], text=[n_label(c) for c in counts],
                           textposition="outside", marker_color=COLORS[ACCEPTED], customdata=[c.n for c in counts],
                           name="accepted", hovertemplate="position %{x}: %{y:.1%} of %{customdata} accepted"
                                                          "<extra></extra>"))
    expected_markers(fig, xs, counts)
    fig.update_xaxes(title="draft position in the round")
    fig.update_yaxes(title="accepted, when tested", range=[0, 1.2], tickformat=".0%")
    return _layout(fig, "Acceptance by draft position (given the drafts before it were accepted)", 300)


def bin_label(b: Bin, digits: int) -> str:
    high = "∞" if b.high is None else f"{b.high:.{digits}f}"
    return f"{b.low:.{digits}f}–{high}"


def confidence_figure(where: Where) -> go.Figure:
    """A reliability curve: among tokens the draft gave probability ~x, how many the target accepted."""
    bins = where.by_confidence
    if not bins:
        return empty_figure("no drafted token was tested", 300)
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated (accepted = confidence)",
                    line=dict(color="#94a3b8", dash="dash"), hoverinfo="skip")
    fig.add_scatter(x=[b.mean for b in bins], y=[b.acceptance.rate for b in bins], mode="lines+markers+text",
                    name="measured", text=[f"n={b.acceptance.n}" for b in bins], textposition="top center",
                    marker=dict(size=10, color=COLORS[ACCEPTED]), customdata=[bin_label(b, 1) for b in bins],
                    hovertemplate="confidence %{customdata} (mean %{x:.2f}): %{y:.1%} accepted<extra></extra>")
    known = [b for b in bins if b.acceptance.expected is not None]
    if known:  # what the βs of the same drafts predicted
        fig.add_scatter(x=[b.mean for b in known], y=[b.acceptance.expected for b in known], mode="markers",
                        name="expected (mean β)", marker=dict(symbol="diamond-open", size=11, color="#7c3aed"),
                        hovertemplate="confidence %{x:.2f}: expected %{y:.1%} (mean β)<extra></extra>")
    fig.update_xaxes(title="the draft's probability of its token (softmax, T=1)", range=[0, 1.02])
    fig.update_yaxes(title="accepted", range=[0, 1.1], tickformat=".0%")
    return _layout(fig, "Acceptance by the draft's confidence (a reliability curve)", 300)


def entropy_figure(where: Where) -> go.Figure:
    bins = where.by_entropy
    if not bins:
        return empty_figure("no entropy recorded (a trace from before it was)", 300)
    fig = go.Figure(go.Bar(x=[bin_label(b, 1) for b in bins], y=[b.acceptance.rate for b in bins],
                           text=[n_label(b.acceptance) for b in bins], textposition="outside",
                           marker_color="#0ea5e9",
                           hovertemplate="entropy %{x} nats: %{y:.1%} accepted<extra></extra>"))
    fig.update_xaxes(title="entropy of the draft's distribution where it drafted (nats)", type="category")
    fig.update_yaxes(title="accepted", range=[0, 1.2], tickformat=".0%")
    return _layout(fig, "Acceptance by the entropy the draft showed", 300)


def classes_figure(rows: tuple[ClassRow, ...]) -> go.Figure:
    rows = tuple(r for r in rows if r.acceptance.n)
    if not rows:
        return empty_figure("no drafted token was tested", 300)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["accepted, where the target wrote this class", "tokens lost"])
    names = [r.name for r in rows]
    fig.add_bar(x=names, y=[r.acceptance.rate for r in rows], text=[n_label(r.acceptance) for r in rows],
                textposition="outside", marker_color=COLORS[ACCEPTED], showlegend=False,
                hovertemplate="%{x}: %{y:.1%} accepted<extra></extra>", row=1, col=1)
    expected_markers(fig, names, [r.acceptance for r in rows], row=1, col=1, showlegend=False)
    fig.add_bar(x=names, y=[r.tokens_lost for r in rows], text=[f"{r.rejections} rej." for r in rows],
                textposition="outside", marker_color=COLORS[REJECTED], showlegend=False,
                hovertemplate="%{x}: %{y} drafts thrown away<extra></extra>", row=1, col=2)
    fig.update_yaxes(range=[0, 1.2], tickformat=".0%", row=1, col=1)
    fig.update_annotations(font=dict(size=12))
    return _layout(fig, "", 300)
