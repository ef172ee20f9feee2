"""Plotly figures built from events (pure: events in, figure out)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.engine.events import BONUS, CORRECTION, TARGET, Candidate, DraftedToken, EmittedToken, Round
from specviz.ui.render import COLORS
from specviz.analysis.stats import RunStats
from specviz.analysis.whatif import WhatIf

FONT = dict(family="Inter, system-ui, sans-serif", size=12)


CHANCE = "TV by chance at n (mean; 95 % of draws below the whisker)"
COMPACT = 260  # below this height a figure's legend goes to the right: above, it would run into the title


def _layout(fig: go.Figure, title: str, height: int = 330) -> go.Figure:
    if height < COMPACT:
        margin, legend = dict(l=45, r=10, t=30, b=35), dict(orientation="v", y=1.0, x=1.02, font=dict(size=10))
    else:
        margin = dict(l=50, r=15, t=70, b=45)
        legend = dict(orientation="h", yanchor="bottom", y=1.0, x=0.0, xanchor="left", font=dict(size=11))
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01, xanchor="left"), template="plotly_white",
                      height=height, margin=margin, font=FONT, legend=legend)
    return fig


def short(text: str, n: int = 10) -> str:
    r = repr(text)[1:-1]
    return r if len(r) <= n else r[: n - 1] + "…"


def position_label(i: int, text: str) -> str:
    return f"{i + 1}: '{short(text)}'"


def empty_figure(message: str, height: int = 330) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=13, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height)


def pq_figure(r: Round | None, greedy: bool, *, verdict: bool = True, height: int = 330) -> go.Figure:
    """q(x) and p(x) of each drafted token, the threshold min(1, p/q) and the draw u, by outcome.

    Greedy decoding warps both models to point masses, so the bars show the temperature-1 softmax
    instead (the rule itself is then "accept iff the draft's token is the target's argmax").
    `verdict=False` (step mode, draft stage) shows only what the draft proposed.
    """
    if r is None or (not r.drafted and r.emitted is None):
        return empty_figure("p/q bars of the current round appear here", height)
    x = [position_label(i, t.text) for i, t in enumerate(r.drafted)]
    colors = [COLORS["drafted"] if not verdict else COLORS[t.status] for t in r.drafted]
    q = [t.q_soft if greedy else t.q for t in r.drafted]
    p = [t.p_soft if greedy else t.p for t in r.drafted]
    fig = go.Figure()
    fig.add_bar(x=x, y=q, name="q(x) draft", marker=dict(color=colors, opacity=0.45, pattern_shape="/",
                                                          line=dict(color=colors, width=1.5)),
                hovertemplate="q(x) = %{y:.4f}<extra></extra>")
    if verdict:
        fig.add_bar(x=x, y=p, name="p(x) target", marker=dict(color=colors),
                    hovertemplate="p(x) = %{y:.4f}<extra></extra>")
        fig.add_scatter(x=x, y=[t.accept_prob for t in r.drafted], mode="markers", name="min(1, p/q)",
                        marker=dict(symbol="line-ew-open", size=34, color="#0f172a",
                                    line=dict(width=3, color="#0f172a")),
                        hovertemplate="min(1, p/q) = %{y:.4f}<extra></extra>")
        if r.expected_accepted is not None:  # what should happen on average: β = Σ min(p, q) at each position
            fig.add_scatter(x=x, y=[t.beta for t in r.drafted], mode="markers", name="β = Σ min(p, q)",
                            marker=dict(symbol="diamond-open", size=11, color="#7c3aed",
                                        line=dict(width=2, color="#7c3aed")),
                            hovertemplate="β = Σ min(p, q) = %{y:.4f}<extra></extra>")
        if not greedy:  # greedy draws no u: min(1, p/q) is 0 or 1
            fig.add_scatter(x=x, y=[t.u for t in r.drafted], mode="markers", name="u (accept iff u < min(1, p/q))",
                            marker=dict(symbol="x-thin-open", size=13, color="#f59e0b",
                                        line=dict(width=2.5, color="#f59e0b")),
                            hovertemplate="u = %{y:.4f}<extra></extra>")
        if r.emitted is not None:
            e = r.emitted
            label = f"{e.kind}: '{short(e.text)}'"
            fig.add_bar(x=[label], y=[e.p_soft if greedy else e.p], name=e.kind,
                        marker=dict(color=COLORS[e.kind]), hovertemplate=f"{e.kind} p = %{{y:.4f}}<extra></extra>")
    note = (" (softmax at T=1)" if height < COMPACT else " · greedy: bars show softmax at T=1") if greedy else ""
    stage = "" if verdict else " (drafted, not yet verified)"
    expected = (f" · accepted {r.n_accepted}, expected {r.expected_accepted:.2f}"
                if verdict and r.expected_accepted is not None else "")
    fig.update_yaxes(range=[0, 1.05], title="probability")
    fig.update_layout(barmode="group", bargap=0.25)
    return _layout(fig, f"Round {r.index + 1}: draft q vs target p{stage}{expected}{note}", height)


def _hbar(fig, cands: list[Candidate], col: int, color: str, highlight: int | None, name: str):
    labels = [f"{rank}. '{short(c.text, 12)}'" for rank, c in enumerate(cands, 1)]  # ranks keep labels unique
    cands, labels = list(reversed(cands)), list(reversed(labels))  # the most likely on top
    colors = [COLORS[CORRECTION] if c.id == highlight else color for c in cands]
    fig.add_bar(x=[c.prob for c in cands], y=labels,
                orientation="h", marker=dict(color=colors), name=name, showlegend=False,
                hovertemplate="%{y}: %{x:.4f}<extra></extra>", row=1, col=col)


def drilldown_figure(token: DraftedToken | EmittedToken | None, greedy: bool, emitted_id: int | None = None
                     ) -> go.Figure:
    """Top candidates at one position: q, p and the residual max(0, p − q) a correction is drawn from."""
    if token is None:
        return empty_figure("pick a position to see the top-k of q, p and the residual", height=300)
    dist = " (softmax, T=1)" if greedy else ""
    if isinstance(token, EmittedToken):
        fig = make_subplots(rows=1, cols=1, subplot_titles=[f"p{dist}: the target's distribution"])
        _hbar(fig, token.p_top, 1, COLORS[token.kind if token.kind != TARGET else BONUS], token.id, "p")
        return _layout(fig, f"{token.kind} '{short(token.text, 16)}'", height=300)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.16,
                        subplot_titles=[f"q{dist} (draft)", f"p{dist} (target)", "residual norm(max(0, p−q))"])
    _hbar(fig, token.q_top, 1, "#94a3b8", token.id, "q")
    _hbar(fig, token.p_top, 2, "#475569", token.id, "p")
    if token.residual_top:
        _hbar(fig, token.residual_top, 3, "#93c5fd", emitted_id, "residual")
    fig.update_annotations(font=dict(size=12))
    rule = (f"; min(1, p/q) {token.accept_prob:.2f}" + ("" if greedy else f", u {token.u:.2f}")
            + ("" if token.beta is None else f", β = Σ min(p, q) {token.beta:.2f}"))
    return _layout(fig, f"'{short(token.text, 16)}' ({token.status.replace('_', ' ')}{rule}); highlighted: the "
                        "drafted token, and in the residual the correction", height=300)


def stats_figure(stats: RunStats) -> go.Figure:
    s = stats.spec
    if not s.rounds:
        return empty_figure("acceptance by position and accepted lengths appear after a run", height=280)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["acceptance by draft position (when tested)",
                                        "accepted drafts per round"])
    positions = [str(i + 1) for i in range(len(s.per_position))]
    fig.add_bar(x=positions, y=s.per_position, marker_color=COLORS["accepted"], showlegend=False,
                customdata=s.tested, hovertemplate="position %{x}: %{y:.2f} (n=%{customdata})<extra></extra>",
                row=1, col=1)
    counts = s.accepted_lengths
    fig.add_bar(x=[str(n) for n in range(len(counts))], y=counts, marker_color="#64748b", showlegend=False,
                hovertemplate="%{x} accepted: %{y} rounds<extra></extra>", row=1, col=2)
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="position in the round", row=1, col=1)
    fig.update_xaxes(title_text="accepted drafts", row=1, col=2)
    fig.update_annotations(font=dict(size=12))
    return _layout(fig, "", height=280)


def race_figure(lanes) -> go.Figure:
    """Tokens against each lane's own compute clock: the steeper line is the faster decoder."""
    if not any(lane.points for lane in lanes):
        return empty_figure("tokens over each lane's own clock appear here", height=260)
    fig = go.Figure()
    colors = {"ar": COLORS[TARGET], "spec": COLORS["accepted"]}
    for lane in lanes:
        xs, ys = zip(*lane.points) if lane.points else ((), ())
        fig.add_scatter(x=[0.0, *xs], y=[0, *ys], mode="lines", name=lane.title, line_shape="hv",
                        line=dict(color=colors.get(lane.key, "#0f172a"), width=2.5))
    fig.update_xaxes(title="seconds of the lane's own compute", rangemode="tozero")
    fig.update_yaxes(title="tokens", rangemode="tozero")
    return _layout(fig, "", height=260)


def distribution_figure(positions: list[tuple[list[str], list[float], list[float], list[float]]], n_ar: int,
                        n_spec: int, tvs: list[tuple[tuple[float, float, float], tuple[float, float, float]]]
                        ) -> go.Figure:
    """One column per generated position: above, (labels, exact, target alone, speculative) shares of its likeliest
    tokens; below, each sampler's total variation from the exact distribution beside the TV its n draws reach by
    chance alone (`tvs`: per position, (TV, chance's mean, the TV 95 % of chance's draws stay below) for the target
    alone, then for speculative decoding). With few samples both samplers sit far from the exact bars, and either
    may look 'worse': the chance marks say how far chance alone moves them."""
    if not positions:
        return empty_figure("empirical vs exact distributions of the first tokens appear here", height=340)
    cols = len(positions)
    fig = make_subplots(rows=2, cols=cols, horizontal_spacing=0.06, vertical_spacing=0.2, row_heights=[0.68, 0.32],
                        subplot_titles=[f"token {i + 1}" + (" (after a sampled prefix)" if i else "")
                                        for i in range(cols)] + [""] * cols)
    samplers = ["target alone", "speculative"]
    for col, ((labels, exact, ar, spec), pair) in enumerate(zip(positions, tvs), start=1):
        first = col == 1  # one legend entry per sampler
        fig.add_bar(x=labels, y=exact, name="exact p (target)", legendgroup="exact", showlegend=first, row=1, col=col,
                    marker=dict(color="rgba(15,23,42,0.12)", line=dict(color="#0f172a", width=1.5)))
        fig.add_bar(x=labels, y=ar, name=f"target alone (n={n_ar})", legendgroup="ar", showlegend=first,
                    marker_color=COLORS[TARGET], row=1, col=col)
        fig.add_bar(x=labels, y=spec, name=f"speculative (n={n_spec})", legendgroup="spec", showlegend=first,
                    marker_color=COLORS["accepted"], row=1, col=col)
        (tv_ar, mean_ar, high_ar), (tv_spec, mean_spec, high_spec) = pair
        fig.add_bar(x=samplers, y=[tv_ar, tv_spec], marker_color=[COLORS[TARGET], COLORS["accepted"]],
                    showlegend=False, name="total variation", row=2, col=col)
        fig.add_scatter(x=samplers, y=[mean_ar, mean_spec], mode="markers", row=2, col=col,
                        name=CHANCE, legendgroup="chance",
                        showlegend=first, marker=dict(symbol="line-ew", size=34, line=dict(width=3, color="#b45309")),
                        error_y=dict(type="data", symmetric=False, array=[high_ar - mean_ar, high_spec - mean_spec],
                                     arrayminus=[0, 0], color="#b45309", thickness=2, width=10))
    fig.update_layout(barmode="group", bargap=0.2)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title="probability", row=1, col=1)
    fig.update_yaxes(title="TV", row=2, col=1)
    _layout(fig, "Generated tokens 1-3: empirical frequencies vs the target's exact distribution", 540)
    # the legend below the panels: above them it covered the title and the panels' own
    return fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.1, x=0), margin=dict(b=70))


def speedup_figure(w: WhatIf) -> go.Figure:
    """Predicted speedup against K for one acceptance and draft cost, the shortcut K × a beside it, the chosen K marked."""
    ks = list(range(1, len(w.curve) + 1))
    fig = go.Figure()
    fig.add_scatter(x=ks, y=[k * w.acceptance for k in ks], mode="lines", name="shortcut K × a (drafting free)",
                    line=dict(color=COLORS["drafted"], dash="dot"), hovertemplate="K = %{x}: %{y:.2f}×<extra></extra>")
    fig.add_scatter(x=ks, y=list(w.curve), mode="lines+markers", name="predicted E / (K·c + R)",
                    line=dict(color=COLORS["accepted"], width=2.5), hovertemplate="K = %{x}: %{y:.2f}×<extra></extra>")
    fig.add_scatter(x=[w.k], y=[w.speedup], mode="markers", name=f"K = {w.k}: {w.speedup:.2f}×",
                    marker=dict(size=15, color=COLORS[CORRECTION], line=dict(width=2, color="white")))
    fig.add_hline(y=1.0, line=dict(color=COLORS[TARGET], dash="dash", width=1))  # the target alone
    top = max(max(w.curve), 1.0)  # the shortcut's line keeps climbing: the axis follows the prediction
    fig.update_xaxes(title="K (tokens drafted per round)", dtick=1 if len(ks) <= 16 else None)
    fig.update_yaxes(title="speedup over the target alone", range=[0, top * 1.25])
    return _layout(fig, f"a = {w.acceptance:.2f}, c = {w.draft_cost:.2f}, R = {w.verify_ratio:.2f}: "
                        f"best K = {w.best_k}", height=340)
