"""HTML for tokens: pure functions from events to markup (no models, no Gradio).

Every drafted token is a <span class="sv-tok sv-{status}"> inside one <span class="sv-round"> per
round, so "draft → verify → accept/correct" reads left to right. Token text is HTML-escaped and
whitespace made visible: newlines as ↵ followed by a real line break, tabs as →.
Hovering a token shows its numbers (the title attribute: native, keyboard-accessible, no script).
"""

from __future__ import annotations

from html import escape

from specviz.engine.events import ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, TARGET, DraftedToken, Round, Step
from specviz.ui.spans import DRAFTED, emitted_span, emitted_tip, token_span, visible  # noqa: F401 (shared)

COLORS = {  # one place for the outcome colours, shared with the figures
    ACCEPTED: "#16a34a",
    REJECTED: "#dc2626",
    NOT_VERIFIED: "#9ca3af",
    CORRECTION: "#2563eb",
    BONUS: "#9333ea",
    TARGET: "#475569",
    DRAFTED: "#d97706",
}

LABELS = {
    ACCEPTED: "accepted draft",
    REJECTED: "rejected draft",
    NOT_VERIFIED: "not verified (after a rejection)",
    CORRECTION: "correction (from the residual)",
    BONUS: "bonus (all drafts accepted)",
}

CSS = """
.sv-text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 15px;
  line-height: 2.05; white-space: pre-wrap; word-break: break-word; padding: 10px 12px;
  border: 1px solid var(--border-color-primary); border-radius: 8px; min-height: 84px;
  background: var(--background-fill-primary); color: var(--body-text-color); }
.sv-empty { color: var(--body-text-color-subdued); font-style: italic; font-family: var(--font); }
.sv-round { border: 1px dashed rgba(100, 116, 139, 0.45); border-radius: 5px; padding: 3px 1px;
  margin: 0 1px; }
.sv-round.sv-last { border: 1.5px solid rgba(217, 119, 6, 0.85); }
.sv-tok { border-radius: 3px; padding: 1px 0; cursor: help; }
.sv-accepted { background: rgba(22, 163, 74, 0.16); box-shadow: inset 0 -2px 0 #16a34a; }
.sv-rejected { background: rgba(220, 38, 38, 0.13); color: #b91c1c; text-decoration: line-through;
  text-decoration-thickness: 2px; box-shadow: inset 0 -2px 0 #dc2626; }
.sv-not_verified { background: rgba(156, 163, 175, 0.18); color: #9ca3af; text-decoration: line-through; }
.sv-correction { background: rgba(37, 99, 235, 0.16); box-shadow: inset 0 -2px 0 #2563eb; }
.sv-bonus { background: rgba(147, 51, 234, 0.16); box-shadow: inset 0 -2px 0 #9333ea; }
.sv-drafted { background: rgba(217, 119, 6, 0.14); box-shadow: inset 0 -2px 0 #d97706; }
.sv-target { }
.sv-undraftable { outline: 1.5px dotted currentColor; outline-offset: 1px; }
.sv-ws { color: var(--body-text-color-subdued); opacity: 0.75; }
.sv-hide-rejected .sv-rejected, .sv-hide-rejected .sv-not_verified { display: none; }
.sv-diverge { outline: 2px solid #f59e0b; outline-offset: 1px; background: rgba(245, 158, 11, 0.25); }
.sv-legend { display: flex; flex-wrap: wrap; gap: 6px 14px; font-size: 13px; align-items: center;
  margin: 2px 0 4px; }
.sv-legend .sv-tok { padding: 1px 5px; font-family: ui-monospace, monospace; cursor: default; }
.sv-legend-compact { gap: 2px 8px; font-size: 12px; margin: 0; }
.sv-legend-compact .sv-tok { padding: 0 4px; }
.sv-caption { font-size: 14px; }
.sv-lane { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 10px;
  background: var(--background-fill-primary); }
.sv-lane h4 { margin: 0 0 6px; font-size: 15px; display: flex; justify-content: space-between; gap: 8px; }
.sv-clock { display: grid; grid-template-columns: repeat(3, 1fr); gap: 8px; margin-bottom: 8px;
  font-variant-numeric: tabular-nums; }
.sv-clock div { display: flex; flex-direction: column; white-space: nowrap; }
.sv-clock b { font-size: 26px; line-height: 1.15; }
.sv-clock span { color: var(--body-text-color-subdued); font-size: 12px; }
.sv-scroll { max-height: 340px; overflow-y: auto; display: flex; flex-direction: column-reverse; }
.sv-lane .sv-text { min-height: 160px; font-size: 13px; line-height: 1.8; }
.sv-done { color: #16a34a; font-weight: 600; font-size: 13px; white-space: nowrap; }
.sv-running { color: #d97706; font-weight: 600; font-size: 13px; }
.sv-speedup { font-size: 22px; font-weight: 700; }
"""


def drafted_tip(t: DraftedToken, greedy: bool) -> str:
    lines = [f"{t.status.replace('_', ' ')}: {t.text!r}"]
    if greedy:
        lines += ["greedy: accepted iff it is the target's argmax",
                  f"p (softmax, T=1) = {t.p_soft:.4f}", f"q (softmax, T=1) = {t.q_soft:.4f}"]
    else:
        lines += [f"p(x) = {t.p:.4f}", f"q(x) = {t.q:.4f}"]
    lines += [f"min(1, p/q) = {t.accept_prob:.4f}", "u: none drawn (greedy: min(1, p/q) is 0 or 1)" if greedy
              else f"u = {t.u:.4f}"]
    if t.beta is not None:  # what should happen on average, beside what did
        lines.append(f"β = Σ min(p, q) = {t.beta:.4f}: " + ("1 where the two argmaxes agree, else 0" if greedy else
                                                          "the chance a draft here is accepted, before u is drawn"))
    if t.status == NOT_VERIFIED:
        lines.append("(not tested: an earlier draft was rejected)")
    lines.append(f"target top-2 logit gap = {t.target_top2_gap:.3f}")
    if t.predicted is not None:
        outcome = {ACCEPTED: "accepted", REJECTED: "rejected"}.get(t.status, "not tested")
        lines.append(f"predicted acceptance = {t.predicted:.2f} (fitted model, from q alone); really: {outcome}")
    return "\n".join(lines)


def round_html(r: Round, greedy: bool, stage: str = "done", last: bool = False) -> str:
    """One round's box. stage "draft" shows the proposal before the verdict (step mode)."""
    parts = []
    for t in r.drafted:
        cls = DRAFTED if stage == "draft" else t.status
        tip = f"drafted: {t.text!r}\nq = {t.q:.4f}" if stage == "draft" else drafted_tip(t, greedy)
        parts.append(token_span(t.text, cls, tip))
    if r.emitted is not None and stage != "draft":
        parts.append(emitted_span(r.emitted))
    title = f"round {r.index + 1}: drafted {r.k}, accepted {r.n_accepted}"
    if r.emitted is not None:
        title += f", then a {r.emitted.kind}"
    cls = "sv-round sv-last" if last else "sv-round"
    return f'<span class="{cls}" data-round="{r.index + 1}" title="{escape(title)}">{"".join(parts)}</span>'


def rounds_html(rounds: list[Round], greedy: bool, *, show_rejected: bool = True, stage: str = "done",
                empty: str = "Press Run: tokens appear here round by round.", done: list[str] | None = None) -> str:
    """Every round's box. `done`: the boxes of the rounds before the last, already rendered (`RoundsHtml`)."""
    if not rounds:
        return f'<div class="sv-text"><span class="sv-empty">{escape(empty)}</span></div>'
    done = done if done is not None else [round_html(r, greedy) for r in rounds[:-1]]
    body = "".join(done) + round_html(rounds[-1], greedy, stage, last=True)
    hide = "" if show_rejected else " sv-hide-rejected"
    return f'<div class="sv-text{hide}" id="sv-tokens-body">{body}</div>'


class RoundsHtml:
    """`rounds_html` for one growing run (live or replayed): each round is rendered once, when it stops
    being the last, so an update costs the new rounds, not the whole run again."""

    def __init__(self):
        self.first: Round | None = None  # the run being rendered, known by its first round
        self.done: list[str] = []

    def __call__(self, rounds: list[Round], greedy: bool, **options) -> str:
        if not rounds or rounds[0] is not self.first or len(self.done) >= len(rounds):
            self.first, self.done = (rounds[0] if rounds else None), []  # another run: start over
        self.done += [round_html(r, greedy) for r in rounds[len(self.done):-1]]
        return rounds_html(rounds, greedy, done=self.done, **options)


def step_span(s: Step, diverge: bool = False) -> str:
    return token_span(s.token.text, TARGET, emitted_tip(s.token), " sv-diverge" if diverge else "")


def steps_html(steps: list[Step], diverge_at: int | None = None, done: list[str] | None = None) -> str:
    """The target-alone lane: one span per token, the first divergent one outlined. `done`: the spans of the first
    steps, already rendered (`StepsHtml`)."""
    if not steps:
        return '<div class="sv-text"><span class="sv-empty">waiting…</span></div>'
    done = done or []
    spans = done + [step_span(s, i == diverge_at) for i, s in enumerate(steps[len(done):], len(done))]
    return f'<div class="sv-text">{"".join(spans)}</div>'


class StepsHtml:
    """`steps_html` for one growing target-alone lane (live): each step is rendered once, so an update costs the new
    steps, not the whole lane again."""

    def __init__(self):
        self.first: Step | None = None  # the lane being rendered, known by its first step
        self.done: list[str] = []

    def __call__(self, steps: list[Step]) -> str:
        if not steps or steps[0] is not self.first or len(self.done) > len(steps):
            self.first, self.done = (steps[0] if steps else None), []  # another run: start over
        self.done += [step_span(s) for s in steps[len(self.done):]]
        return steps_html(steps, done=self.done)


def spec_lane_html(rounds: list[Round], greedy: bool, diverge_at: int | None = None) -> str:
    """The speculative lane: only what was committed, coloured by where each token came from."""
    if not rounds:
        return '<div class="sv-text"><span class="sv-empty">waiting…</span></div>'
    spans = []
    for r in rounds:
        for t in r.drafted[:r.n_accepted]:
            spans.append(token_span(t.text, ACCEPTED, drafted_tip(t, greedy),
                                    " sv-diverge" if len(spans) == diverge_at else ""))
        if r.emitted is not None:
            spans.append(emitted_span(r.emitted, " sv-diverge" if len(spans) == diverge_at else ""))
    return f'<div class="sv-text">{"".join(spans)}</div>'


def lane_html(lane, body: str, recorded: bool) -> str:
    """A race lane (specviz.runs.race.Lane): title, state, its own clock, tokens/s, tokens, then its text."""
    state = (f'<span class="sv-done">finished ({lane.finished})</span>' if lane.finished
             else '<span class="sv-running">running…</span>')
    clock = "s, recorded" if recorded else "s of own compute"
    return (f'<div class="sv-lane" id="sv-lane-{lane.key}"><h4><span>{lane.title}</span>{state}</h4>'
            f'<div class="sv-clock" data-lane="{lane.key}">'
            f'<div><b class="sv-elapsed">{lane.clock:.2f}</b><span>{clock}</span></div>'
            f'<div><b class="sv-rate">{lane.tokens_per_s:.1f}</b><span>tokens/s</span></div>'
            f'<div><b class="sv-count">{lane.tokens}</b><span>tokens</span></div></div>'
            f'<div class="sv-scroll">{body}</div></div>')  # column-reverse keeps the newest tokens in view


def legend_html(compact: bool = False) -> str:
    """What the token colours mean; `compact`: one short line (the Live view, which must fit a laptop's screen)."""
    if compact:
        items = "".join(f'<span class="sv-tok sv-{k}">{escape(v.split(" (")[0])}</span>' for k, v in LABELS.items())
        return (f'<div class="sv-legend sv-legend-compact">{items}'
                '<span class="sv-empty">hover a token for p and q</span></div>')
    items = "".join(f'<span class="sv-tok sv-{k}">{escape(v)}</span>' for k, v in LABELS.items())
    return (f'<div class="sv-legend">{items}<span class="sv-empty">dashed box = one round '
            "(one target forward) · hover a token for p, q, min(1, p/q), u</span></div>")


def size_text(n: int) -> str:
    """Bytes in decimal units, three significant figures: 346 kB, 1.23 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def memory_text(memory: dict[str, int]) -> str:
    """Each loaded model's weights in memory: what self-speculation saves is the draft's share."""
    return "weights in memory: " + ", ".join(f"{role} {size_text(n)}" for role, n in memory.items())


def header_html(pair: str, memory: dict[str, int] | None = None) -> str:
    """The page's header line, naming the pair being served and, given `memory` (bytes by role, as
    `models.memory.pair_bytes` returns), what its models hold (updated after a load)."""
    shown = f'<span id="sv-memory">{escape(memory_text(memory))}</span>' if memory else ""
    return (f'<div class="sv-header"><h1>specviz</h1><span class="sv-tagline">speculative decoding, visible</span>'
            f'<span id="sv-pair">serving {escape(pair)}</span>{shown}</div>')
