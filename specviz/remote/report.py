"""A race's report: as JSON (everything, every run), as a printed table, and as one self-contained HTML page
(plotly inline, as `specviz bench --html` writes its own)."""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict
from pathlib import Path

from specviz.remote.race import Run
from specviz.remote.results import EngineInfo, SpecStats
from specviz.remote.summary import Estimate, RaceSummary
from specviz.runs.outputs import write_atomic


def rounded(obj, digits: int = 4):
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


STATS_FIELDS = ("drafted", "accepted", "drafts", "acceptance", "mean_accepted_length", "accepted_per_position",
                "source", "note")  # `SpecStats`' own names, in the report's order
REPORTED_AS = {"drafts": "rounds"}


def stats_record(s: SpecStats | None) -> dict:
    """One request's engine statistics as the report's run fields (every one None where the engine told none)."""
    record = {REPORTED_AS.get(name, name): getattr(s, name, None) for name in STATS_FIELDS}
    per_position = record["accepted_per_position"]
    record["accepted_per_position"] = list(per_position) if per_position else None
    return record


def run_record(run: Run) -> dict:
    r = run.result
    return {"prompt": run.prompt.id, "kind": run.prompt.kind, "repeat": run.repeat, "lane": run.lane,
            "order": run.order, "tokens": r.tokens, "ttft_s": r.ttft_s, "decode_s": r.decode_s,
            "decode_tokens_per_s": r.decode_tokens_per_s, "total_s": r.total_s, **stats_record(r.stats),
            "text": r.text}


def build_report(summary: RaceSummary, engines: dict[str, EngineInfo], runs: tuple[Run, ...], meta: dict) -> dict:
    return rounded({"meta": meta, "engines": {lane: asdict(info) for lane, info in engines.items()},
                    "summary": asdict(summary), "runs": [run_record(r) for r in runs]})


def est(e: Estimate, fmt: str = "{:.2f}", unit: str = "") -> str:
    if e.value is None:
        return "n/a"
    ci = f" [{fmt.format(e.ci95[0])}, {fmt.format(e.ci95[1])}]" if e.ci95 else ""
    return f"{fmt.format(e.value)}{unit}{ci}"


def format_table(summary: RaceSummary, engines: dict[str, EngineInfo]) -> str:
    s = summary
    lines = [f"{s.prompts} prompts x {s.repeats} repetition(s), lanes in a shuffled order "
             "(95% bootstrap intervals over prompts in brackets; none below 3 prompts):", "",
             f"{'lane':<14} {'engine':<9} {'decode tokens/s':<26} {'first token (s)':<24} {'end to end tok/s':>16}"]
    for lane in s.lanes:
        info = engines.get(lane.lane)
        lines.append(f"{lane.lane:<14} {(info.kind if info else '?'):<9} {est(lane.decode_tokens_per_s):<26} "
                     f"{est(lane.ttft_s, '{:.3f}'):<24} {(lane.end_to_end_tokens_per_s or 0):>16.2f}")
    lines += ["", f"measured speedup (decode rates): {est(s.speedup, unit='x')}"
              + (f"; end to end {s.end_to_end_speedup:.2f}x" if s.end_to_end_speedup else "")]
    a = s.acceptance
    if a is None:
        lines.append("acceptance: the speculative engine reported none (see its notes).")
    else:
        lines.append(f"acceptance: {est(a.acceptance, '{:.1%}')} ({a.accepted} of {a.drafted} drafted; "
                     f"source: {', '.join(a.sources)})")
        lines.append(f"tokens per verify round: {est(a.mean_accepted_length)}"
                     + (f" over {a.rounds} rounds" if a.rounds is not None else ""))
        if a.conditional:
            lines.append("acceptance per draft position, P(i accepted | 1..i-1 accepted): "
                         + " ".join(f"{x:.2f}" for x in a.conditional))
    p = s.prediction
    if p.predicted_speedup is not None:
        lines.append(f"specviz's cost model predicts {p.predicted_speedup:.2f}x (K = {p.k}, c = {p.draft_cost:.2f} "
                     f"from {p.draft_cost_from}, R = {p.verify_ratio:.2f}, E(K) = {p.expected_tokens:.2f}); "
                     f"measured {est(s.speedup, unit='x')}")
    else:
        lines.append("no predicted speedup: it needs the draft's cost (a --draft lane or --draft-cost) and K.")
    if p.implied_round_cost is not None:
        lines.append(f"the measurement implies a round costs K·c + R = {p.implied_round_cost:.2f} target steps"
                     + (f"; at K = {p.k} speculation pays while c < {p.break_even_draft_cost:.2f}"
                        if p.break_even_draft_cost is not None else ""))
    for lane, info in engines.items():
        lines += [f"note ({lane}): {n}." for n in info.notes]
    return "\n".join(lines)


def figures(report: dict) -> list:
    import plotly.graph_objects as go

    layout = dict(template="plotly_white", height=360, margin=dict(l=60, r=20, t=50, b=50))
    lanes = report["summary"]["lanes"]

    def bars(key: str, title: str, axis: str):
        values = [lane[key]["value"] or 0 for lane in lanes]
        cis = [lane[key]["ci95"] or [v, v] for lane, v in zip(lanes, values)]
        fig = go.Figure(go.Bar(x=[lane["lane"] for lane in lanes], y=values, error_y=dict(
            type="data", symmetric=False, array=[hi - v for (_, hi), v in zip(cis, values)],
            arrayminus=[v - lo for (lo, _), v in zip(cis, values)])))
        fig.update_layout(title=title, yaxis_title=axis, **layout)
        return fig

    out = [bars("decode_tokens_per_s", "Decode rate per lane (95 % bootstrap CI)", "tokens/s"),
           bars("ttft_s", "Time to first token per lane (95 % bootstrap CI)", "seconds")]
    acc = report["summary"]["acceptance"]
    if acc and acc["conditional"]:
        fig = go.Figure(go.Scatter(x=list(range(1, len(acc["conditional"]) + 1)), y=acc["conditional"],
                                   mode="lines+markers"))
        fig.update_layout(title="Acceptance by draft position: P(i accepted | 1..i-1 accepted)",
                          xaxis_title="draft position i", yaxis_range=[0, 1.05], **layout)
        out.append(fig)
    p = report["summary"]["prediction"]
    if p["predicted_speedup"] is not None and p["measured_speedup"] is not None:
        fig = go.Figure(go.Bar(x=["predicted (cost model)", "measured"],
                               y=[p["predicted_speedup"], p["measured_speedup"]]))
        fig.add_hline(y=1.0, line_color="grey")
        fig.update_layout(title="Speedup: specviz's cost model beside the race", yaxis_title="x", **layout)
        out.append(fig)
    return out


def write_html(report: dict, table: str, path: str | Path) -> Path:
    divs = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures(report))]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>specviz engines race</title></head>"
            "<body style='font-family:sans-serif;max-width:1000px;margin:auto'><h1>specviz engines race</h1>"
            f"<pre>{html.escape(table)}</pre>{''.join(divs)}"
            f"<details><summary>the report as JSON</summary><pre>{html.escape(json.dumps(report['summary'], indent=1))}"
            "</pre></details></body></html>")
    path = Path(path)
    write_atomic(path, page)
    return path
