"""The What-if tab (id sv-whatif): the calculator of `analysis.whatif`, pre-filled from the last run.

`whatif_tab` lays it out, `whatif_view` (values in, markdown and figure out) answers every change,
`prefill` turns the last run into the calculator's inputs; `wire` connects them.
"""

from __future__ import annotations

from dataclasses import astuple

import gradio as gr
import plotly.graph_objects as go

from specviz.analysis.stats import mean_beta, run_stats, tested_betas
from specviz.analysis.whatif import WhatIfInputs, table, teaching_lines, what_if
from specviz.runs.trace import Trace
from specviz.settings.errors import InputError
from specviz.settings.spec import validate
from specviz.ui.figures import empty_figure, speedup_figure

INPUTS = ("acceptance", "k", "draft_cost", "verify_ratio", "target_tokens_per_s", "gpu_hour_price")
# the articles' example (4 × 0.73, 30 tokens/s; an A100 at about $2/hour); they give no draft cost: 0.1 is ours
SEEDS = (0.73, 4, 0.1, 1.0, 30.0, 2.0)

NOTE = ("What would another acceptance, K or draft give? **Use the last run** (or opening this tab after a run) "
        "fills in what the run measured: α̂, its K, ĉ, the verify ratio and the target's speed. A run with the "
        "target alone (**Run**) measures the target's step; **Rounds only** takes the verify pass as the target "
        "step, so its verify ratio reads 1.0. **Use its mean β** takes the acceptance from what the run's draft and "
        "target distributions predict (β = Σ min(p, q), averaged over its tested drafts) instead of what its draws "
        "gave. Capacity and cost are for one stream on the hardware priced.")


def whatif_markdown(acceptance, k, draft_cost, verify_ratio, target_tokens_per_s=None, gpu_hour_price=None) -> str:
    w = what_if(acceptance, k, draft_cost, verify_ratio, target_tokens_per_s, gpu_hour_price)
    head, *rows = table(w)
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *("| " + " | ".join(r) + " |" for r in rows)]
    *steps, note = teaching_lines(w)
    return "\n".join([*lines, "", *(f"- {s}" for s in steps), "", f"**Where the shortcut misleads.** {note}"])


def whatif_view(acceptance, k, draft_cost, verify_ratio, target_tokens_per_s=None, gpu_hour_price=None
                ) -> tuple[str, go.Figure]:
    """The calculator's answer for the values in the controls (an emptied speed or price: not given)."""
    if None in (acceptance, k, draft_cost, verify_ratio):
        return "*Acceptance, K, draft cost and verify ratio are all needed.*", empty_figure("", 340)
    given = (acceptance, k, draft_cost, verify_ratio, target_tokens_per_s or None, gpu_hour_price)
    try:  # the spec names the bad input, as the API's /whatif does
        values = astuple(validate(WhatIfInputs, dict(zip(INPUTS, given))))
    except InputError as e:
        return f"*{e}*", empty_figure(str(e), 340)
    return whatif_markdown(*values), speedup_figure(what_if(*values))


def prefill(record: Trace | None, expected: bool = False) -> tuple[float, int, float, float, float] | None:
    """The last run's measurements as inputs (acceptance … target tokens/s); None before a run that drafted.
    `expected`: the acceptance is the run's mean β, what its distributions predict (where it recorded them)."""
    if record is None or not record.rounds:
        return None
    s = run_stats(record.rounds, record.ar_steps or None)
    if s.cost is None:  # nothing drafted: no ĉ
        return None
    t1 = s.cost.target_step_s
    beta = mean_beta(tested_betas(record.rounds)) if expected else None
    return (round(s.alpha if beta is None else beta, 2), s.k, round(s.cost.c, 3),
            round(s.cost.verify_time(s.k + 1) / t1, 3), round(1 / t1, 1))


def run_key(record: Trace | None) -> tuple[int, int] | None:
    """Which run (and how far) the inputs came from: no reference kept to the trace itself."""
    return None if record is None else (id(record), len(record.rounds))


def whatif_tab(max_k: int) -> dict:
    a, k, c, r, tps, price = SEEDS
    with gr.Tab("What if", id="whatif", elem_id="sv-whatif") as tab:
        gr.Markdown(NOTE, elem_classes="sv-note")
        with gr.Row():
            parts = dict(tab=tab, acceptance=gr.Slider(0, 1, value=a, step=0.01, label="acceptance a",
                                                       info="the chance each drafted token is accepted"))
            parts["k"] = gr.Slider(1, max(max_k, 16), value=k, step=1, label="K", info="tokens drafted per round")
            parts["draft_cost"] = gr.Number(c, minimum=0, label="draft cost c", info="draft step ÷ target step")
        with gr.Row():
            parts["verify_ratio"] = gr.Number(r, minimum=0.01, label="verify ratio R",
                                              info="verifying K+1 tokens ÷ one target step (1 = free)")
            parts["target_tokens_per_s"] = gr.Number(tps, minimum=0, label="target tokens/s",
                                                     info="the target alone (empty: no rates)")
            parts["gpu_hour_price"] = gr.Number(price, minimum=0, label="$ per GPU-hour",
                                                info="empty: no cost")
        with gr.Row():
            parts["use_run"] = gr.Button("Use the last run", elem_id="sv-whatif-run")
            parts["use_beta"] = gr.Button("Use its mean β as the acceptance", elem_id="sv-whatif-beta")
        summary, fig = whatif_view(*SEEDS)
        parts["summary"] = gr.Markdown(summary, elem_id="sv-whatif-summary", latex_delimiters=[])
        parts["fig"] = gr.Plot(fig, show_label=False, elem_id="sv-whatif-plot")
    return parts


def fill(record: Trace | None, used: tuple | None, always: bool, expected: bool = False) -> tuple:
    """The inputs but the price (never measured) and the run they came from: a skip for each input when there is
    no run, or when the tab is reopened on the run already used (keep the visitor's edits)."""
    values = prefill(record, expected)
    if values is None or (not always and run_key(record) == used):
        return (*[gr.skip()] * (len(INPUTS) - 1), used)
    return (*values, run_key(record))


def wire(parts: dict, record: gr.State) -> None:
    """Every edit recomputes; opening the tab after a new run, or the button, fills in that run's numbers."""
    inputs = [parts[name] for name in INPUTS]
    outputs = [parts["summary"], parts["fig"]]
    gr.on([c.input for c in inputs], whatif_view, inputs, outputs, api_visibility="private", queue=False)
    used = gr.State(None)  # the run_key the inputs were last filled from
    for trigger, always, expected in ((parts["tab"].select, False, False), (parts["use_run"].click, True, False),
                                      (parts["use_beta"].click, True, True)):
        trigger(lambda rec, key, always=always, expected=expected: fill(rec, key, always, expected), [record, used],
                [*inputs[:-1], used], api_visibility="private", queue=False).then(
            whatif_view, inputs, outputs, api_visibility="private", queue=False)
