"""The Engines tab: the same prompt through a deployed engine with speculation and without, streamed side by side.

The engines (llama.cpp's llama-server, vLLM, SGLang) report what they accepted, never what they rejected, so this
view shows their texts growing, their speeds, the acceptance they report (per draft position where they do) and
what the cost model makes of it; the coloured per-token view of the same prompt is specviz's own decoder (Live).
Only the URLs the operator allowed (`specviz serve --allow-engine URL ...`) are offered or fetched.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from html import escape

import gradio as gr
import plotly.graph_objects as go

from specviz.engine import DecodeConfig
from specviz.remote.engine import Partial, completing, connect
from specviz.remote.policy import EngineError, EnginePolicy, display
from specviz.remote.race import PLAIN, SPEC, Prompt, Run
from specviz.remote.results import RequestResult
from specviz.remote.summary import RaceSummary, summarise
from specviz.remote.transport import make_client
from specviz.settings.limits import Limits
from specviz.settings.spec import validate
from specviz.ui.figures import empty_figure
from specviz.ui.handlers import outputs, shown, stream

CSS = """
.sv-engines .sv-lane { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 12px;
  min-height: 160px; background: var(--background-fill-primary); }
.sv-engines .sv-lane h3 { margin: 0 0 4px; font-size: 14px; }
.sv-engines .sv-lane .sv-url { font-size: 12px; color: var(--body-text-color-subdued); }
.sv-engines .sv-lane pre { white-space: pre-wrap; font-family: inherit; margin: 6px 0; }
.sv-engines .sv-lane .sv-speed { font-variant-numeric: tabular-nums; font-size: 13px; }
"""
NOTE = ("The same prompt through an engine with speculative decoding and one without, one after the other in a "
        "random order, each timed on this server as its tokens arrive. Engines report what they accepted but not "
        "what they rejected: for the coloured per-token view of this prompt, run it in **Live** (specviz's own "
        "decoder, on the pair this server loaded).")
NO_ENGINE = ("No engine is allowed on this server. Its operator starts one with `specviz engines llamacpp` (or "
             "points at a vLLM or SGLang deployment) and serves with `specviz serve --allow-engine URL ...`.")


@dataclass(frozen=True)
class EnginesView:
    spec: str  # HTML: the speculative engine's lane
    plain: str  # HTML: the target-alone engine's lane
    summary: str  # HTML: speeds, acceptance, the cost model
    positions: go.Figure  # acceptance per draft position, where the engine reports it


def lane_html(title: str, url: str, text: str, status: str) -> str:
    return (f'<div class="sv-lane"><h3>{escape(title)}</h3><div class="sv-url">{escape(display(url))}</div>'
            f'<pre>{escape(text)}</pre><div class="sv-speed">{escape(status)}</div></div>')


def result_status(r: RequestResult) -> str:
    rate = f"{r.decode_tokens_per_s:.1f} tokens/s decoding" if r.decode_tokens_per_s else "too short to time"
    first = f", first token after {r.ttft_s:.2f} s" if r.ttft_s is not None else ""
    return f"{r.tokens} tokens: {rate}{first}"


def number(x: float | None, form: str = "{:.2f}") -> str:
    return "—" if x is None else form.format(x)


def summary_html(s: RaceSummary) -> str:
    """The race in sentences: the measured speedup, what the engine accepted, and what that makes of the draft's
    cost (the round's cost in target steps it implies, and the most a draft step may cost for speculation to pay)."""
    acc, pred = s.acceptance, s.prediction
    lines = [f"<b>Measured: {number(s.speedup.value, '{:.2f}×')}</b> decoding speed with speculation over without."]
    if acc is None:
        lines.append("The engine reported no speculative statistics for this request.")
    else:
        lines.append(f"It accepted {acc.accepted} of {acc.drafted} drafted tokens "
                     f"({number(acc.acceptance.value, '{:.0%}')}); tokens per verify round "
                     f"{number(acc.mean_accepted_length.value)} (source: {', '.join(acc.sources)}).")
    if pred.implied_round_cost is not None and pred.k:
        lines.append(f"So one round of {pred.k} drafts and a verify cost {pred.implied_round_cost:.2f} target steps "
                     "here; speculation pays only while a draft step costs less than "
                     f"{number(pred.break_even_draft_cost)} of a target step (c decides it).")
    return "<div class='sv-engines-summary'>" + "<br>".join(lines) + "</div>"


def positions_figure(s: RaceSummary | None) -> go.Figure:
    per = s.acceptance.per_position if s and s.acceptance else None
    if not per:
        return empty_figure("acceptance per draft position (when the engine reports it)")
    fig = go.Figure(go.Bar(x=[f"draft {i + 1}" for i in range(len(per))], y=list(per),
                           text=[f"{v:.0%}" for v in per], textposition="outside", marker_color="#16a34a"))
    fig.update_layout(title="rounds that accepted each draft position (the engine's own counters)",
                      yaxis=dict(range=[0, 1.1], tickformat=".0%"), height=280, margin=dict(l=40, r=10, t=40, b=30))
    return fig


def race_engines(policy: EnginePolicy, limits: Limits, spec_url, plain_url, prompt, max_new_tokens, temperature
                 ) -> Iterator[EnginesView]:
    """Both lanes, one request at a time in a random order, each view as text arrives; then the summary."""
    if not policy.allowed:
        raise gr.Error(NO_ENGINE, print_exception=False)
    try:
        config = validate(DecodeConfig, {"max_new_tokens": max_new_tokens, "temperature": temperature}, limits)
        text = str(prompt or "").strip()
        if not text:
            raise EngineError("the prompt is empty: type one above.")
        urls = {SPEC: str(spec_url or ""), PLAIN: str(plain_url or "")}
        with make_client(policy) as client:  # the CLI's client: no proxy from the environment
            lanes = {lane: connect(client, policy, url) for lane, url in urls.items()}
            shown = {SPEC: "waiting for its turn…", PLAIN: "waiting for its turn…"}
            texts = {SPEC: "", PLAIN: ""}
            runs = []
            for order, lane in enumerate(random.sample([SPEC, PLAIN], 2)):
                for piece in completing(client, policy, lanes[lane], text, config):
                    if isinstance(piece, Partial):
                        texts[lane], shown[lane] = piece.text, f"streaming: {piece.tokens} tokens"
                    else:
                        texts[lane], shown[lane] = piece.text, result_status(piece)
                        runs.append(Run(Prompt("prompt", text), 0, lane, order, piece))
                    yield view(urls, texts, shown)
    except (EngineError, ValueError) as e:
        raise gr.Error(str(e), print_exception=False) from None
    summary = summarise(runs, k=lanes[SPEC].info.k)
    yield view(urls, texts, shown, summary)


def view(urls: dict, texts: dict, shown: dict, summary: RaceSummary | None = None) -> EnginesView:
    return EnginesView(lane_html("with speculation", urls[SPEC], texts[SPEC], shown[SPEC]),
                       lane_html("target alone", urls[PLAIN], texts[PLAIN], shown[PLAIN]),
                       summary_html(summary) if summary else "", positions_figure(summary))


@dataclass(frozen=True)
class EnginesTab:
    """The tab's inputs, Run, and the components named like EnginesView's fields."""

    spec_url: gr.Dropdown
    plain_url: gr.Dropdown
    max_new_tokens: gr.Slider
    temperature: gr.Slider
    run: gr.Button
    spec: gr.HTML
    plain: gr.HTML
    summary: gr.HTML
    positions: gr.Plot


def engines_tab(allowed: tuple[str, ...], limits: Limits) -> EnginesTab:
    urls = [display(u) for u in allowed]
    with gr.Tab("Engines", id="engines", elem_id="sv-engines", elem_classes="sv-engines"):
        gr.Markdown(NOTE if urls else NO_ENGINE, elem_classes="sv-note")
        with gr.Row():
            spec_url = gr.Dropdown(urls, value=urls[0] if urls else None, label="with speculation",
                                   elem_id="sv-engines-spec")
            plain_url = gr.Dropdown(urls, value=urls[-1] if urls else None, label="target alone",
                                    elem_id="sv-engines-plain")
            max_new_tokens = gr.Slider(1, limits.max_new_tokens, value=min(64, limits.max_new_tokens), step=1,
                                       label="new tokens", elem_id="sv-engines-tokens")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0: greedy)",
                                    elem_id="sv-engines-temperature")
        run = gr.Button("Race the engines on the prompt", variant="primary", elem_id="sv-engines-run",
                        interactive=bool(urls))
        with gr.Row():
            spec = gr.HTML(elem_id="sv-engines-spec-lane")
            plain = gr.HTML(elem_id="sv-engines-plain-lane")
        summary = gr.HTML(elem_id="sv-engines-summary")
        positions = gr.Plot(elem_id="sv-engines-positions")
    return EnginesTab(spec_url, plain_url, max_new_tokens, temperature, run, spec, plain, summary, positions)


def wire(tab: EnginesTab, prompt: gr.Textbox, allowed: tuple[str, ...], limits: Limits):
    """The Run button: its own queue (it loads no model here, so it never waits behind the model's jobs)."""
    policy = EnginePolicy(allowed=allowed)

    def run(text, spec, plain, max_new_tokens, temperature):
        yield from stream(race_engines(policy, limits, spec, plain, text, max_new_tokens, temperature),
                          partial(shown, tab))

    return tab.run.click(run, [prompt, tab.spec_url, tab.plain_url, tab.max_new_tokens, tab.temperature],
                         outputs(tab, EnginesView), concurrency_id="engines", concurrency_limit=1,
                         api_visibility="private")
