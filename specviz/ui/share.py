"""Share a run: one self-contained HTML file that opens in any browser, offline.

The app needs Python, a model and a server; someone you send a run to should need none of them.
`share_html` turns a finished trace into a single page (inline CSS, no script, no external URL of
any kind) showing what the app shows of a finished run: the speculative lane's coloured rounds
(hover a token for p, q, min(1, p/q) and u), the target alone's text, the race numbers, the
settings, the pair and the prompt. It reuses the app's own token markup (`render`) and the race
replay (`replay_race`), so the page and the app cannot disagree. Pure functions: no Gradio, no
model. No plotly on purpose: plotly.js alone is 3.5 MB; a 256-token page is a few hundred kB.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from specviz.analysis.stats import RunStats, run_stats
from specviz.runs.race import RaceState, replay_race
from specviz.runs.trace import RunMeta, Trace
from specviz.ui import render, tree_view

MONO = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace'

PAGE_CSS = f"""
:root {{ color-scheme: light dark; --font: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue",
  Arial, sans-serif; --body-text-color: #1f2937; --body-text-color-subdued: #6b7280;
  --border-color-primary: #e5e7eb; --background-fill-primary: #ffffff; --background-fill-secondary: #f6f7f9; }}
@media (prefers-color-scheme: dark) {{ :root {{ --body-text-color: #e5e7eb; --body-text-color-subdued: #9ca3af;
  --border-color-primary: #374151; --background-fill-primary: #111827; --background-fill-secondary: #0b0f19; }} }}
* {{ box-sizing: border-box; }}
body {{ margin: 0; font-family: var(--font); color: var(--body-text-color); line-height: 1.5;
  background: var(--background-fill-secondary); }}
.sv-page {{ max-width: 1180px; margin: 0 auto; padding: 32px 20px 48px; }}
.sv-page section {{ margin-top: 28px; }}
.sv-page h1 {{ font-size: 26px; line-height: 1.25; margin: 4px 0 6px; }}
.sv-page h1 .sv-arrow {{ color: var(--body-text-color-subdued); font-weight: 400; }}
.sv-page h2 {{ font-size: 12px; text-transform: uppercase; letter-spacing: .07em; margin: 0 0 8px;
  color: var(--body-text-color-subdued); }}
.sv-kicker, .sv-sub, .sv-note {{ color: var(--body-text-color-subdued); margin: 0; font-size: 14px; }}
.sv-kicker {{ text-transform: uppercase; letter-spacing: .08em; font-size: 12px; }}
.sv-note {{ margin-top: 10px; }}
.sv-prompt {{ font-family: {MONO}; font-size: 14px; white-space: pre-wrap; word-break: break-word; margin: 0;
  padding: 10px 12px; border: 1px solid var(--border-color-primary); border-radius: 8px;
  background: var(--background-fill-primary); }}
.sv-numbers {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 10px; }}
.sv-num {{ display: flex; flex-direction: column; padding: 10px 12px; border-radius: 8px;
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }}
.sv-num b {{ font-size: 26px; line-height: 1.2; font-variant-numeric: tabular-nums; }}
.sv-num span {{ font-size: 12px; color: var(--body-text-color-subdued); }}
#sv-speedup b {{ color: #16a34a; }}
.sv-lanes {{ display: grid; grid-template-columns: 1fr 1fr; gap: 14px; align-items: start; }}
@media (max-width: 860px) {{ .sv-lanes {{ grid-template-columns: 1fr; }} .sv-page h1 {{ font-size: 21px; }} }}
.sv-page .sv-scroll {{ max-height: none; overflow: visible; }}
.sv-page .sv-round.sv-last {{ border: 1px dashed rgba(100, 116, 139, 0.45); }}
.sv-toggle {{ font-size: 13px; margin-left: 4px; cursor: pointer; }}
#sv-committed:checked ~ .sv-lanes .sv-rejected, #sv-committed:checked ~ .sv-lanes .sv-not_verified {{ display: none; }}
.sv-settings {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 8px 16px; margin: 0; }}
.sv-settings div {{ border-bottom: 1px dashed var(--border-color-primary); padding-bottom: 4px; }}
.sv-settings dt {{ font-size: 12px; color: var(--body-text-color-subdued); }}
.sv-settings dd {{ margin: 0; font-family: {MONO}; font-size: 14px; word-break: break-word; }}
.sv-page footer {{ margin-top: 36px; padding-top: 12px; border-top: 1px solid var(--border-color-primary);
  font-size: 13px; color: var(--body-text-color-subdued); }}
"""


def finished_race(trace: Trace) -> RaceState:
    """The race replayed over the trace's recorded times, at its end (a plain Run: the AR lane stays empty)."""
    state = None
    for state in replay_race(trace):
        pass
    return state


def header_html(meta: RunMeta) -> str:
    return ('<header><p class="sv-kicker">specviz · speculative decoding</p>'
            f'<h1>{escape(meta.draft)} <span class="sv-arrow">drafts for</span> {escape(meta.target)}</h1>'
            f'<p class="sv-sub">Recorded on {escape(meta.device)} in {escape(meta.dtype)}.</p></header>')


def number(value: str, label: str, extra: str = "") -> str:
    """One big number with its label; `extra` is trusted markup for the opening tag (a class, an id)."""
    return f'<div class="sv-num"{extra}><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def numbers_html(state: RaceState, stats: RunStats, raced: bool) -> str:
    """The race's numbers, the lanes' own (a plain Run: `run_stats` of its rounds, and why there is no speedup)."""
    s = stats.spec
    cells = [number(f"{state.speedup:.2f}×" if state.speedup else "—", "speedup over the target alone",
                    ' id="sv-speedup"')] if raced else []
    cells += [number(f"{(state.spec if raced else s).tokens_per_s:.1f}", "tokens/s, speculative")]
    cells += [number(f"{state.ar.tokens_per_s:.1f}", "tokens/s, target alone")] if raced else []
    cells += [number(f"{s.acceptance_rate:.0%}", "of drafted tokens accepted"),
              number(f"{s.mean_accepted_tokens:.2f}", "tokens per round (per target forward)"),
              number(str(s.rounds), "rounds"), number(str(s.tokens), "tokens generated")]
    note = (f"{verdict(state)} Times are the ones recorded, each lane on its own clock." if raced else
            "The target alone did not run (a plain Run, not a Race), so there is no measured speedup.")
    return (f'<section><h2>{"Race" if raced else "Run"}</h2><div class="sv-numbers">{"".join(cells)}</div>'
            f'<p class="sv-note">{escape(note)}</p></section>')


def verdict(state: RaceState) -> str:
    """What the two texts should have in common, and whether they do."""
    if not state.greedy:
        return "Sampled (temperature > 0): the lanes draw different random numbers, so their texts may differ."
    if state.divergence is None:
        return f"Greedy: both lanes emitted the same {state.spec.tokens} tokens, as the method guarantees."
    d = state.divergence
    gap = "" if d.target_top2_gap is None else f" (target top-2 logit gap {d.target_top2_gap:.3f}: a near-tie)"
    return f"Greedy: the lanes first differ at token {d.position + 1}{gap}; it is outlined in the target's lane."


def lanes_html(trace: Trace, state: RaceState) -> str:
    """The legend on top, then the speculative lane and the target alone, side by side on wide screens."""
    rounds = render.rounds_html(trace.rounds, trace.meta.greedy, empty="No rounds were recorded.")
    spec = render.lane_html(state.spec, rounds, recorded=True)
    if trace.ar_steps:
        at = state.divergence.position if state.divergence else None
        ar = render.lane_html(state.ar, render.steps_html(trace.ar_steps, at), recorded=True)
    else:
        ar = ('<div class="sv-lane" id="sv-lane-ar"><h4><span>Target alone (autoregressive)</span></h4>'
              '<p class="sv-empty">The target alone did not run: this was a plain Run, not a Race.</p></div>')
    toggle = ('<input type="checkbox" id="sv-committed"><label class="sv-toggle" for="sv-committed">'
              "hide rejected and unverified drafts (show only the committed text)</label>")
    return (f'<section><h2>Tokens</h2>{render.legend_html()}{toggle}'
            f'<div class="sv-lanes">{spec}{ar}</div></section>')


def settings(meta: RunMeta) -> list[tuple[str, object]]:
    c, s = meta.config, meta.config.sampling
    rows = [("K (drafted per round)", c.k), ("adaptive K", c.adaptive)]
    rows += [({"confidence": "confidence cut", "predicted": "predicted-acceptance cut"}[c.adaptive], c.cut)] if c.cut else []
    rows += [("drafter", c.drafter)] + ([("exit layer", c.exit_layer)] if c.drafter == "self" else []) + (
        [("tree budget (nodes per round)", c.tree_budget)] if c.drafter == "tree" else [])
    rows += [("temperature", f"{s.temperature:g}" + (" (greedy)" if s.greedy else "")),
             ("top-k", s.top_k or "off"), ("top-p", f"{s.top_p:g}" if s.top_p < 1 else "off"),
             ("seed", "fresh each run" if c.seed is None else c.seed), ("max new tokens", c.max_new_tokens),
             ("prompt tokens", meta.prompt_tokens), ("dtype", meta.dtype), ("device", meta.device)]
    return rows


def settings_html(meta: RunMeta) -> str:
    rows = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(str(v))}</dd></div>" for k, v in settings(meta))
    return f'<section><h2>Settings</h2><dl class="sv-settings">{rows}</dl></section>'


def share_html(trace: Trace, *, exported: datetime | None = None) -> str:
    """The finished run as one self-contained HTML page. `exported` (default: now, UTC) is the footer's date."""
    state = finished_race(trace)
    stats = state.stats() if trace.ar_steps else run_stats(trace.rounds)
    when = (exported or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M %Z").strip()
    meta = trace.meta
    body = "".join([
        header_html(meta),
        f'<section><h2>Prompt</h2><pre class="sv-prompt">{escape(meta.prompt)}</pre></section>',
        numbers_html(state, stats, bool(trace.ar_steps)),
        lanes_html(trace, state),
        settings_html(meta),
        f"<footer>Exported by specviz on {escape(when)}. One self-contained file: it needs no server, no network.</footer>",
    ])
    title = escape(f"specviz · {meta.draft} → {meta.target}")
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title><style>{render.CSS}{tree_view.CSS}{PAGE_CSS}</style></head>"
            f'<body><main class="sv-page">{body}</main></body></html>\n')
