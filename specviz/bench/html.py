"""The benchmark's HTML report: plotly figures built from the JSON report alone.

plotly.js is embedded inline (about 4 MB), so the file opens on a machine with no network.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.graph_objects as go

from specviz.runs.outputs import write_atomic

LAYOUT = dict(template="plotly_white", height=380, margin=dict(l=60, r=20, t=50, b=50))


def methods_figure(report: dict) -> go.Figure:
    """Every method's speedup over the baseline, with its bootstrap 95 % interval."""
    methods = report["methods"]
    names = list(methods)
    ys = [methods[m]["speedup"] for m in names]
    cis = [methods[m]["speedup_ci95"] or [y, y] for m, y in zip(names, ys)]
    fig = go.Figure(go.Bar(x=names, y=ys, error_y=dict(type="data", symmetric=False,
                                                       array=[hi - y for (_, hi), y in zip(cis, ys)],
                                                       arrayminus=[y - lo for (lo, _), y in zip(cis, ys)])))
    fig.add_hline(y=1.0, line_color="grey")
    fig.update_layout(title=f"Speedup over the target alone ({report['summary']['baseline']}), 95 % bootstrap CI",
                      yaxis_title="speedup (×)", **LAYOUT)
    return fig


def settings_figure(report: dict) -> go.Figure:
    """The tuning grid: tokens/s per setting, beside the cost model's prediction over K."""
    settings = report["settings"]
    fig = go.Figure(go.Bar(x=list(settings), y=[t["spec_tokens_per_s"] for t in settings.values()],
                           marker_color=["crimson" if n == report["summary"]["setting"] else "steelblue"
                                         for n in settings]))
    fig.update_layout(title="Settings tried (the chosen one in red): speculative tokens/s",
                      yaxis_title="tokens/s", **LAYOUT)
    return fig


def predicted_figure(report: dict) -> go.Figure | None:
    curve = report.get("predicted_by_k") or {}
    if not curve:
        return None
    s = report["summary"]
    fig = go.Figure(go.Scatter(x=[int(k) for k in curve], y=list(curve.values()), mode="lines", name="predicted",
                               line=dict(dash="dot")))
    fig.add_scatter(x=[s["k"]], y=[s["speedup"]], mode="markers", name="measured", marker=dict(size=12))
    fig.add_hline(y=1.0, line_color="grey", annotation_text="target alone")
    fig.update_layout(title="Predicted speedup vs K (the chosen setting's acceptance) and the measured one",
                      xaxis_title="K (tokens drafted per round)", yaxis_title="speedup (×)", **LAYOUT)
    return fig


def position_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    for name, t in report["settings"].items():
        alpha = t["per_position_acceptance"]
        fig.add_scatter(x=list(range(1, len(alpha) + 1)), y=alpha, mode="lines+markers", name=name)
    fig.update_layout(title="Acceptance by position: P(token i accepted | 1..i-1 accepted)",
                      xaxis_title="draft position i", yaxis_title="α̂ᵢ", yaxis_range=[0, 1.05], **LAYOUT)
    return fig


def kind_figure(report: dict) -> go.Figure:
    kinds = report["acceptance_by_kind"]
    fig = go.Figure(go.Bar(x=list(kinds), y=list(kinds.values())))
    fig.update_layout(title="Acceptance rate by prompt kind (the chosen setting)", yaxis_title="accepted / drafted",
                      yaxis_range=[0, 1.05], **LAYOUT)
    return fig


def breakdown_figure(report: dict) -> go.Figure:
    settings = {n: t for n, t in report["settings"].items() if t["round_ms"]}
    fig = go.Figure()
    for part in ("draft", "verify", "overhead"):
        fig.add_bar(x=list(settings), y=[t["round_ms"][part] for t in settings.values()], name=part)
    fig.update_layout(title="Time per round", yaxis_title="ms", barmode="stack", **LAYOUT)
    return fig


def verify_figure(report: dict) -> go.Figure | None:
    costs = report.get("costs")
    if not costs:
        return None
    ratio = costs["verify_ratio"]
    fig = go.Figure(go.Scatter(x=list(range(1, len(ratio) + 1)), y=ratio, mode="lines+markers", name="verify"))
    fig.update_layout(title=f"Target verify cost: T(n) / T(1)   (T1 = {costs['target_step_ms']} ms, "
                            f"draft step {costs['draft_step_ms']} ms, ĉ = {costs['c']})",
                      xaxis_title="new tokens in one target forward", yaxis_title="× one-token step", **LAYOUT)
    return fig


def render(report: dict) -> str:
    figures = [f for f in (methods_figure(report), settings_figure(report), predicted_figure(report),
                           position_figure(report), kind_figure(report), breakdown_figure(report),
                           verify_figure(report)) if f is not None]
    divs = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    summary = html.escape(json.dumps(report["summary"], indent=2))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specviz benchmark</title></head>"
            "<body style='font-family:sans-serif;max-width:1000px;margin:auto'>"
            f"<h1>specviz benchmark</h1><pre>{summary}</pre>{''.join(divs)}</body></html>")


def write_html(report: dict, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, render(report))
    return path
