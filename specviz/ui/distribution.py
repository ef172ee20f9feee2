"""The Same distribution tab (id distribution): many short continuations sampled with speculative decoding and
with the target alone, their first tokens against the target's exact distribution.

`distribution_view` is what it shows of a result (pure: `DistributionResult` in, view out); `same_distribution`
streams it from `runs.distribution`; `distribution_tab` lays the tab out and `wire` connects Sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from html import escape

import gradio as gr

from specviz.runs.distribution import DistributionResult, DistributionSettings, sample_distribution
from specviz.serving.session import Session
from specviz.serving.turns import Owner, Waiting
from specviz.settings.limits import Limits
from specviz.ui import figures, teach
from specviz.ui.controls import controls
from specviz.ui.handlers import Page, outputs, replaceable, shown, stream, user_errors


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


@user_errors
@replaceable
def same_distribution(session: Session, limits: Limits, prompt, settings: dict, experiment: dict,
                      owner: str | None = None) -> Iterator[DistributionView]:
    with closing(sample_distribution(session, limits, prompt, settings, experiment, owner)) as results:
        for result in results:
            if isinstance(result, Waiting):
                yield DistributionView(gr.skip(), teach.queue_line(result))
            else:
                yield distribution_view(result)


@dataclass(frozen=True)
class DistributionTab:
    """The experiment's controls (DistributionSettings), Sample, and the components named like the view's."""

    samples: gr.components.Component
    temperature: gr.components.Component
    button: gr.Button
    fig: gr.Plot
    summary: gr.Markdown


def distribution_tab(limits: Limits) -> DistributionTab:
    with gr.Tab("Same distribution", id="distribution"):
        gr.Markdown(teach.DISTRIBUTION_NOTE, elem_classes="sv-note")
        with gr.Row():
            experiment = controls(DistributionSettings, limits, prefix="sv-dist-")
            button = gr.Button("Sample", variant="primary", elem_id="sv-dist-run")
        fig = gr.Plot(figures.empty_figure("empirical vs exact distributions appear here", 340), show_label=False,
                      elem_id="sv-dist-plot")
        summary = gr.Markdown(elem_id="sv-dist-summary")
    return DistributionTab(**experiment, button=button, fig=fig, summary=summary)


def wire(page: Page, tab: DistributionTab):
    """Sample (the model's queue); returns the event Stop cancels."""
    def on_distribution(request: gr.Request, text, samples, temperature, *values):
        experiment = dict(samples=samples, temperature=temperature)
        yield from stream(same_distribution(page.session, page.limits, text, page.settings_of(values), experiment,
                                            Owner.of(request)), lambda view: shown(tab, view))

    return tab.button.click(on_distribution, [page.prompt, tab.samples, tab.temperature, *page.settings.values()],
                            outputs(tab, DistributionView), api_visibility="private", trigger_mode="multiple",
                            **page.model_queue)
