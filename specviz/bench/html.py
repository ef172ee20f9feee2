"""The benchmark's HTML report: plotly figures built from the JSON report alone.

plotly.js is embedded inline (about 4 MB), so the file opens on a machine with no network.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.graph_objects as go

LAYOUT = dict(template="plotly_white", height=380, margin=dict(l=60, r=20, t=50, b=50))


def speedup_figure(report: dict) -> go.Figure:
    by_k = report["by_k"]
    ks = [int(k) for k in by_k]
    fig = go.Figure()
    curve = report.get("predicted_by_k") or {}
    if curve:
        fig.add_scatter(x=[int(k) for k in curve], y=list(curve.values()), mode="lines", name="predicted",
                        line=dict(dash="dot"))
    fig.add_scatter(x=ks, y=[by_k[str(k)]["speedup"] for k in ks], mode="lines+markers", name="specviz (measured)")
    hf_k = [(k, report["hf"].get(f"k={k}", {}).get("speedup")) for k in ks]
    if any(v is not None for _, v in hf_k):
        fig.add_scatter(x=[k for k, _ in hf_k], y=[v for _, v in hf_k], mode="markers", name="HF assisted, same K",
                        marker=dict(symbol="x", size=10))
    if "default" in report["hf"]:
        fig.add_hline(y=report["hf"]["default"]["speedup"], line_dash="dash", annotation_text="HF defaults")
    fig.add_hline(y=1.0, line_color="grey", annotation_text="target alone")
    fig.update_layout(title="Speedup over the target alone vs K", xaxis_title="K (tokens drafted per round)",
                      yaxis_title="speedup (×)", **LAYOUT)
    return fig


def position_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    for k, b in report["by_k"].items():
        alpha = b["per_position_acceptance"]
        fig.add_scatter(x=list(range(1, len(alpha) + 1)), y=alpha, mode="lines+markers", name=f"K={k}")
    fig.update_layout(title="Acceptance by position: P(token i accepted | 1..i-1 accepted)",
                      xaxis_title="draft position i", yaxis_title="α̂ᵢ", yaxis_range=[0, 1.05], **LAYOUT)
    return fig


def kind_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    for k, b in report["by_k"].items():
        kinds = list(b["acceptance_by_kind"])
        fig.add_bar(x=kinds, y=[b["acceptance_by_kind"][kind] for kind in kinds], name=f"K={k}")
    fig.update_layout(title="Acceptance rate by prompt kind", yaxis_title="accepted / drafted",
                      yaxis_range=[0, 1.05], barmode="group", **LAYOUT)
    return fig


def breakdown_figure(report: dict) -> go.Figure:
    ks = [k for k, b in report["by_k"].items() if b["round_ms"]]
    fig = go.Figure()
    for part in ("draft", "verify", "overhead"):
        fig.add_bar(x=[f"K={k}" for k in ks], y=[report["by_k"][k]["round_ms"][part] for k in ks], name=part)
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
    figures = [f for f in (speedup_figure(report), position_figure(report), kind_figure(report),
                           breakdown_figure(report), verify_figure(report)) if f is not None]
    divs = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    summary = html.escape(json.dumps(report["summary"], indent=2))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specviz benchmark</title></head>"
            "<body style='font-family:sans-serif;max-width:1000px;margin:auto'>"
            f"<h1>specviz benchmark</h1><pre>{summary}</pre>{''.join(divs)}</body></html>")


def write_html(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render(report), encoding="utf-8")
    return path
