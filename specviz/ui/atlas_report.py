"""The Atlas report as HTML: one self-contained page (plotly inline, no network), and the parts the app shows.

Pure functions of an `AtlasReport`. Everything that came from the prompts or the models (ids, kinds, token
text, contexts) is escaped, with whitespace made visible as everywhere else (`spans.visible`). Sections
have ids (sv-atlas-summary, -prompts, -where, -disagreements, -classes, -advice, -settings). The prompt
table sorts on a header click (a few lines of inline script); rows start worst first.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from specviz.analysis.atlas import ClassRow, Count, Disagreement, PromptRow
from specviz.analysis.atlas_advice import Advice, Setting
from specviz.runs.atlas import AtlasReport
from specviz.settings.spec import flat_values
from specviz.ui import render
from specviz.ui.atlas_figures import classes_figure, confidence_figure, entropy_figure, position_figure
from specviz.ui.share import PAGE_CSS, number
from specviz.ui.spans import visible

# scoped to .sv-atlas: the page and the app's Atlas tab (which wraps its parts in it) share it
ATLAS_CSS = """
.sv-atlas .sv-numbers { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 10px; }
.sv-atlas .sv-num { display: flex; flex-direction: column; padding: 10px 12px; border-radius: 8px;
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sv-atlas .sv-num b { font-size: 26px; line-height: 1.2; font-variant-numeric: tabular-nums; }
.sv-atlas .sv-num span { font-size: 12px; color: var(--body-text-color-subdued); }
.sv-atlas table { border-collapse: collapse; width: 100%; font-size: 14px; background: var(--background-fill-primary); }
.sv-atlas th, .sv-atlas td { border-bottom: 1px solid var(--border-color-primary); padding: 5px 8px; text-align: left;
  vertical-align: top; }
.sv-atlas th { font-size: 12px; color: var(--body-text-color-subdued); white-space: nowrap; }
.sv-atlas table.sv-sortable th { cursor: pointer; }
.sv-atlas td.sv-n { font-variant-numeric: tabular-nums; white-space: nowrap; }
.sv-atlas .sv-pair .sv-tok { padding: 1px 3px; font-family: ui-monospace, monospace; }
.sv-atlas .sv-context { font-family: ui-monospace, monospace; font-size: 13px; white-space: pre-wrap;
  color: var(--body-text-color-subdued); margin: 2px 0; }
.sv-atlas ol { padding-left: 22px; }
.sv-atlas li { margin-bottom: 10px; }
.sv-atlas .sv-problems li { margin-bottom: 2px; }
"""

SORT_SCRIPT = """
document.querySelectorAll('table.sv-sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], asc = th.dataset.dir !== 'asc';
  th.dataset.dir = asc ? 'asc' : 'desc';
  const key = r => { const c = r.cells[col], v = c.dataset.v ?? c.innerText, n = parseFloat(v);
                     return isNaN(n) ? v : n; };
  [...body.rows].sort((a, b) => { const x = key(a), y = key(b); return (x > y ? 1 : x < y ? -1 : 0) * (asc ? 1 : -1); })
    .forEach(r => body.appendChild(r));
}));
"""

PROMPT_COLUMNS = ("prompt", "kind", "prompt tokens", "acceptance", "accepted / drafted", "tokens per round",
                  "predicted speedup", "measured speedup", "finished", "accepted when tested", "expected (β)")


def share(c: Count) -> str:
    """A rate with its count: 62 % (31 of 50)."""
    return f"{c.rate:.0%} ({c.accepted} of {c.n})" if c.n else "— (none tested)"


def times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def expected(row: PromptRow) -> str:
    """The acceptance the drafts' βs predict (99 % range), flagged where the realised rate fell outside it."""
    if row.expected_range is None:
        return "—"
    low, high = row.expected_range
    flag = " ⚠ outside" if row.outside_expected else ""
    return f"{row.tested.expected:.0%} ({low:.0%}–{high:.0%}){flag}"


def prompt_values(row: PromptRow) -> list:
    """One table row, as plain values (the app's dataframe) in PROMPT_COLUMNS' order."""
    a = row.acceptance
    return [row.id, row.kind, row.prompt_tokens, round(a.rate, 3), f"{a.accepted} / {a.n}",
            round(row.tokens_per_round, 2), None if row.predicted_speedup is None else round(row.predicted_speedup, 2),
            None if row.measured_speedup is None else round(row.measured_speedup, 2), row.finished or "—",
            share(row.tested), expected(row)]


def prompts_table(rows: tuple[PromptRow, ...], traces: dict[str, str] | None = None) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in PROMPT_COLUMNS)
    body = []
    for row in rows:
        href = (traces or {}).get(row.id)
        name = (f'<a href="{escape(href)}" title="its trace: open it in the app\'s Replay tab">{escape(row.id)}</a>'
                if href else escape(row.id))
        a = row.acceptance
        cells = [f"<td>{name}</td>", f"<td>{escape(row.kind)}</td>", f'<td class="sv-n">{row.prompt_tokens}</td>',
                 f'<td class="sv-n" data-v="{a.rate}">{a.rate:.0%}</td>',
                 f'<td class="sv-n" data-v="{a.n}">{a.accepted} / {a.n}</td>',
                 f'<td class="sv-n">{row.tokens_per_round:.2f}</td>',
                 f'<td class="sv-n" data-v="{row.predicted_speedup or 0}">{times(row.predicted_speedup)}</td>',
                 f'<td class="sv-n" data-v="{row.measured_speedup or 0}">{times(row.measured_speedup)}</td>',
                 f"<td>{escape(row.finished or '—')}</td>",
                 f'<td class="sv-n" data-v="{row.tested.rate}">{escape(share(row.tested))}</td>',
                 f'<td class="sv-n" data-v="{row.tested.expected or 0}">{escape(expected(row))}</td>']
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f'<table class="sv-sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def token_html(text: str, cls: str, tip: str) -> str:
    return render.token_span(text, cls, tip)


def disagreements_html(items: tuple[Disagreement, ...]) -> str:
    if not items:
        return '<p class="sv-note">No draft was rejected.</p>'
    out = []
    for d in items:
        pair = (f'<span class="sv-pair">draft {token_html(d.drafted.text, "rejected", f"id {d.drafted.id}")} '
                f'→ target {token_html(d.wanted.text, "correction", f"id {d.wanted.id}")}</span>')
        contexts = "".join(f'<div class="sv-context">{escape(e.prompt_id)}, round {e.round + 1}: …'
                           f'{visible(e.context)}<b>▮</b></div>' for e in d.examples)
        out.append(f"<li>{pair} <b>{d.tokens_lost}</b> {plural(d.tokens_lost, 'token')} lost in <b>{d.count}</b> "
                   f"{plural(d.count, 'rejection')}{contexts}</li>")
    return f'<ol class="sv-disagreements">{"".join(out)}</ol>'


def classes_table(rows: tuple[ClassRow, ...], undraftable: ClassRow) -> str:
    body = "".join(f"<tr><td>{escape(r.name)}</td><td class='sv-n'>{share(r.acceptance)}</td>"
                   f"<td class='sv-n'>{r.rejections}</td><td class='sv-n'>{r.tokens_lost}</td></tr>"
                   for r in (*rows, undraftable))
    return ("<table><thead><tr><th>the target's token</th><th>draft accepted, of tested</th><th>rejections</th>"
            f"<th>tokens lost</th></tr></thead><tbody>{body}</tbody></table>")


def setting_text(s: Setting) -> str:
    cut = f", cut {s.cut:g}" if s.cut else ", no cut"
    return f"K = {s.k}{cut}: {s.predicted_speedup:.2f}×"


def best_text(k) -> str:
    return "keep it" if k.best == k.current else setting_text(k.best)


def advice_html(advice: Advice) -> str:
    if not advice.kinds:
        return '<p class="sv-note">Nothing to advise: no round drafted anything.</p>'
    rows = []
    for k in advice.kinds:
        hybrid = "—" if k.hybrid is None else f"{k.hybrid.acceptance:.0%} ({k.hybrid.accepted} of {k.hybrid.drafted})"
        rows.append(f"<tr><td>{escape(k.kind)}</td><td class='sv-n'>{k.prompts}</td><td class='sv-n'>"
                    f"{share(k.acceptance)}</td><td>{setting_text(k.current)}</td><td><b>{best_text(k)}</b></td>"
                    f"<td class='sv-n'>{k.whatif_best_k or '—'}</td><td class='sv-n'>{k.lookup.acceptance:.0%} "
                    f"({k.lookup.accepted} of {k.lookup.drafted})</td><td class='sv-n'>{hybrid}</td></tr>")
    kinds = ("<table><thead><tr><th>kind</th><th>prompts</th><th>acceptance</th><th>now (predicted)</th>"
             "<th>best K and cut (replayed)</th><th>what-if best K (fixed)</th><th>lookup accepted</th>"
             f"<th>hybrid accepted</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    lines = [f"<li><b>{escape(a.name)}</b> would have accepted {a.replay.acceptance:.0%} of {a.replay.drafted} drafts "
             f"({a.replay.tokens_per_round:.2f} tokens per round over {a.replay.rounds} rounds): predicted "
             f"{times(a.predicted_speedup)}" + (f"; {a.replay.unknown} rounds reached a position where the draft's "
                                               "proposal was never recorded" if a.replay.unknown else "") + "</li>"
             for a in advice.alternatives]
    c = advice.ceiling
    lines.append(f"<li><b>ceiling</b>: a draft that is always right at K = {c.k} and this draft's cost: "
                 f"{c.tokens_per_round:.0f} tokens per round, predicted {c.predicted_speedup:.2f}×</li>")
    note = ("Best K and cut: the recorded rounds replayed with fewer drafts or a stricter confidence cut, priced "
            "by the cost model; the what-if best K extrapolates the kind's acceptance to any K without a cut. "
            "Lookup and hybrid: replayed offline on the recorded target tokens (exact for greedy runs).")
    return f'{kinds}<ul>{"".join(lines)}</ul><p class="sv-note">{escape(note)}</p>'


def summary_html(report: AtlasReport) -> str:
    t = report.findings.totals
    cells = [number(f"{t.acceptance.rate:.0%}", f"accepted ({t.acceptance.accepted} of {t.acceptance.n} drafted)"),
             number(f"{t.tokens_per_round:.2f}", f"tokens per round ({t.rounds} rounds)"),
             number(times(t.predicted_speedup), "predicted speedup (cost model)"),
             number(f"{len(report.runs)} / {report.given}", "prompts run")]
    if report.race:
        cells.append(number(times(t.measured_speedup), "measured speedup (races)"))
        if t.measured_speedup and t.predicted_speedup:  # how far the cost model runs ahead of the loop here
            cells.append(number(f"{t.measured_speedup / t.predicted_speedup:.2f}", "measured ÷ predicted"))
    problems = "".join(f"<li>{escape(p)}</li>" for p in report.problems)
    more = f'<ul class="sv-problems">{problems}</ul>' if problems else ""
    ended = {"done": "every valid prompt ran", "budget": "stopped by the time budget: the report covers what ran",
             "stopped": "stopped: the report covers what ran"}.get(report.finished, report.finished)
    return (f'<div class="sv-numbers">{"".join(cells)}</div><p class="sv-note">{escape(ended.capitalize())}.</p>'
            f"{more}")


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="sv-atlas-{sid}"><h2>{escape(title)}</h2>{body}</section>'


def figure_html(fig, first: bool) -> str:
    """plotly.js inline once (the first figure), so the page needs no network."""
    return fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})


def atlas_html(report: AtlasReport, traces: dict[str, str] | None = None, *, exported: datetime | None = None) -> str:
    """The whole report as one page. `traces`: prompt id -> a link to its trace file (relative to the page)."""
    f, pair = report.findings, report.pair
    figs = [position_figure(f.where), confidence_figure(f.where), entropy_figure(f.where), classes_figure(f.classes)]
    plots = [figure_html(fig, i == 0) for i, fig in enumerate(figs)]
    settings = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(str(v))}</dd></div>"
                       for k, v in flat_values(report.config).items())
    when = (exported or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M %Z").strip()
    body = "".join([
        '<header><p class="sv-kicker">specviz · atlas: where the draft fails</p>'
        f'<h1>{escape(pair["draft"])} <span class="sv-arrow">drafts for</span> {escape(pair["target"])}</h1>'
        f'<p class="sv-sub">On {escape(pair["device"])} in {escape(pair["dtype"])}; '
        f'{"raced against the target alone" if report.race else "speculative runs"}.</p></header>',
        section("summary", "Summary", summary_html(report)),
        section("prompts", "Per prompt (worst first; click a header to sort)", prompts_table(f.prompts, traces)),
        section("where", "Where in the round", "".join(plots[:3])),
        section("disagreements", "What: the top disagreements, by tokens lost", disagreements_html(f.disagreements)),
        section("classes", "Token classes", plots[3] + classes_table(f.classes, f.undraftable)),
        section("advice", "What to change", advice_html(report.advice)),
        section("settings", "Settings", f'<dl class="sv-settings">{settings}</dl>'),
        f"<footer>Exported by specviz on {escape(when)}. One self-contained file: it needs no server, no network."
        "</footer>",
    ])
    title = escape(f"specviz atlas · {pair['draft']} → {pair['target']}")
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title><style>{render.CSS}{PAGE_CSS}{ATLAS_CSS}</style></head>"
            f'<body><main class="sv-page sv-atlas">{body}</main><script>{SORT_SCRIPT}</script></body></html>\n')
