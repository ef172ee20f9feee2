"""What each view shows, as dataclasses built by pure functions from the run paths' results.

app.py maps a view's fields onto components in field order. Building a view reads events only,
never tensors; `gr.update`/`gr.skip` appear only where a component keeps its state (slider, drill-down).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from html import escape

import gradio as gr

from specviz.analysis.stats import run_stats
from specviz.engine.events import CORRECTION, REJECTED, EmittedToken, Round
from specviz.runs.distribution import DistributionResult
from specviz.runs.race import RaceState
from specviz.serving.recorded import clock_time
from specviz.runs.trace import Trace
from specviz.ui import figures, render, teach
from specviz.ui.tree_view import tree_html


def as_tuple(view) -> tuple:
    """A view dataclass as a tuple of its fields (dataclasses.astuple would deep-copy figures)."""
    return tuple(getattr(view, f.name) for f in fields(view))


# ---------------------------------------------------------------- decode (run, step, replay)


@dataclass
class MainView:
    tokens: str  # HTML
    caption: str  # Markdown
    pq: object  # plotly figure
    rounds: dict  # gr.update for the round slider
    positions: dict  # gr.update for the position dropdown
    drill: object  # plotly figure
    stats: str  # Markdown
    stats_fig: object
    record: Trace | None


def position_choices(r: Round | None) -> list[tuple[str, int]]:
    if r is None:
        return []
    choices = [(f"{i + 1}: {t.text!r} ({t.status.replace('_', ' ')})", i) for i, t in enumerate(r.drafted)]
    if r.emitted is not None:
        choices.append((f"{r.emitted.kind}: {r.emitted.text!r}", len(r.drafted)))
    return choices


def default_position(r: Round | None) -> int | None:
    """Where to look first: the rejected draft if any, else the correction/bonus, else the last draft."""
    if r is None:
        return None
    for i, t in enumerate(r.drafted):
        if t.status == REJECTED:
            return i
    return len(r.drafted) if r.emitted is not None else (len(r.drafted) - 1 if r.drafted else None)


def token_at(r: Round | None, position) -> object | None:
    if r is None or position is None:
        return None
    try:
        i = int(position)
    except (TypeError, ValueError):
        return None
    if 0 <= i < len(r.drafted):
        return r.drafted[i]
    return r.emitted if i == len(r.drafted) else None


def drill(r: Round | None, position, greedy: bool):
    token = token_at(r, position)
    emitted = r.emitted.id if r is not None and r.emitted is not None and r.emitted.kind == CORRECTION else None
    return figures.drilldown_figure(token, greedy, emitted if not isinstance(token, EmittedToken) else None)


def round_index(n_rounds: int, selected) -> int:
    """The 0-based round a 1-based slider value points at, kept within the rounds (None: the last)."""
    if selected is None:
        return max(n_rounds - 1, 0)
    return max(0, min(int(selected) - 1, n_rounds - 1))


def main_view(record: Trace | None, *, show_rejected: bool = True, selected: int | None = None,
              stage: str = "done", live: bool = False, tokens_html=render.rounds_html) -> MainView:
    """Everything the Decode tab shows for a record. `live` (mid-run) leaves the drill-down and the
    stats chart alone: plotly figures cost tens of ms each, which would slow a fast device's rounds.
    A stream of views of one growing run passes a `render.RoundsHtml()` as `tokens_html`."""
    rounds = record.rounds if record else []
    greedy = record.meta.greedy if record else True
    n = len(rounds)
    i = round_index(n, selected)
    current = rounds[i] if rounds else None
    done = stage == "done"
    pos = default_position(current) if done else None
    s = run_stats(rounds, record.ar_steps if record else None)
    return MainView(
        tokens=tokens_html(rounds, greedy, show_rejected=show_rejected, stage=stage)
        + (tree_html(current, greedy, stage) if current is not None and current.tree else ""),
        caption=teach.step_caption(current, greedy, stage) if current else "",
        pq=figures.pq_figure(current, greedy, verdict=stage != "draft"),
        rounds=gr.update(minimum=1, maximum=max(n, 2), value=i + 1, interactive=n > 1),  # min < max
        positions=gr.update(choices=position_choices(current) if done else [], value=pos),
        drill=gr.skip() if live else drill(current, pos, greedy),
        stats=teach.stats_markdown(s, record.source if record else ""),
        stats_fig=gr.skip() if live else figures.stats_figure(s),
        record=record,
    )


# ---------------------------------------------------------------- the race


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
            lines.append(
                f"⚠ Greedy texts **differ from token {d.position + 1}** (outlined). The target's top-2 logit gap "
                f"there is {gap(d.target_top2_gap)} (target alone) / {gap(d.spec_top2_gap)} (verify pass): a "
                "near-tie that low precision can flip when the target scores K+1 tokens at once instead of one. "
                "The rule is exact; the arithmetic of a batched forward is not bit-identical.")
    lines += [teach.recorded_note(state.recorded_at)] if state.recorded_at is not None else []
    lines += teach.race_caveats(state.shared_cpu, (state.ar.finished, state.spec.finished), state.timing_note)
    return "\n\n".join(lines)


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


# ---------------------------------------------------------------- same distribution


@dataclass
class DistributionView:
    fig: object
    summary: str


def distribution_summary(result: DistributionResult) -> str:
    def p(v):
        return "–" if v is None else f"{v:.3f}"
    spec_v, ar_v = result.spec, result.ar
    state = "" if result.done else " (sampling…)"
    notes = [n for n in (result.note, "⏱ Stopped at the server's time budget per request: the results cover the "
                         "samples drawn." if result.finished == "budget" else "") if n]
    after = f" after <i>{escape(figures.short(result.prompt, 80))}</i>" if result.prompt else ""
    rows = [f"| {c.position} | {c.stats_ar.tv:.3f} · {c.stats_spec.tv:.3f} | {c.stats_ar.tv_noise:.3f} "
            f"({c.stats_ar.tv_noise_high:.3f}) · {c.stats_spec.tv_noise:.3f} ({c.stats_spec.tv_noise_high:.3f}) | "
            f"{p(c.stats_ar.chi2_p)} · {p(c.stats_spec.chi2_p)} | {c.stats_ar.ks_p:.3f} · {c.stats_spec.ks_p:.3f} |"
            for c in result.positions]
    verdict = ("speculative decoding passes every test" if not spec_v.rejected else
               "speculative decoding is REJECTED as a sampler of the target: a bug")
    return "\n".join([
        f"**{spec_v.samples} speculative and {ar_v.samples} target-alone continuations{state}**{after}",
        *notes,
        "",
        "| token | total variation (target alone · speculative) | by chance at their n: mean (95 % below) | χ² p | "
        "PIT p |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Whole path (every token's PIT, Kolmogorov-Smirnov): p = {ar_v.ks_p:.3f} target alone, "
        f"{spec_v.ks_p:.3f} speculative; {verdict} at α = {spec_v.alpha:g}.",
        "",
        "Tokens 2 and 3 are scored against the target's exact distribution *given the tokens sampled before "
        "them*, so they test drafts accepted after earlier drafts, corrections and bonuses. Finite samples never "
        "match exactly: both samplers should sit at the chance level of TV, and their p-values should look like "
        "any uniform draw (below 0.001 would be suspicious). `specviz prove` runs the same test from the command "
        "line, with negative controls that must fail.",
    ])


def token_labels(texts: list[str], ids: list[int]) -> list[str]:
    labels = [f"'{figures.short(x, 12)}'" for x in texts]
    return [f"{x} #{t}" if labels.count(x) > 1 else x for x, t in zip(labels, ids)]


def distribution_view(result: DistributionResult) -> DistributionView:
    panels = [(token_labels(c.texts, c.token_ids), c.exact, c.ar, c.spec) for c in result.positions]
    tvs = [((c.stats_ar.tv, c.stats_ar.tv_noise, c.stats_ar.tv_noise_high),
            (c.stats_spec.tv, c.stats_spec.tv_noise, c.stats_spec.tv_noise_high)) for c in result.positions]
    return DistributionView(figures.distribution_figure(panels, result.ar.samples, result.spec.samples, tvs),
                            distribution_summary(result))
