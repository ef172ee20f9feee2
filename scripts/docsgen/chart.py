"""The README's chart: the newest bench run per machine and precision as bars (the target alone beside speculative
decoding, tokens a second, end to end), drawn as SVG from the reports' own numbers (no plotting library, no image
export: a generated text file `docs.py --check` compares like any page)."""

from __future__ import annotations

from html import escape

from pathlib import Path

from docsgen import claims, machines
from docsgen.paths import ROOT
from docsgen.reports import REPORTS, load_report

CHART = ROOT / "assets" / "charts" / "headline.svg"
COLORS = {"target alone": "#94a3b8", "speculative": "#16a34a"}
WIDTH, BAR, GAP, LABEL = 760, 16, 14, 330


def headline(folder: Path = REPORTS["bench"]) -> list[Path]:
    """The newest run of each machine and precision with every default but K and the confidence cut (each bar says
    its own), by machine then precision; a machine the report does not name by its CPUID family is not charted."""
    newest: dict[tuple, Path] = {}
    for path in sorted(folder.glob("*.json")):
        r = load_report(path)
        if claims.at_defaults(r, free=("k", "confidence")) and claims.on_cpu(r) and "family" in claims.described(r):
            key = (claims.described(r), claims.dtype(r))
            if key not in newest or claims.order(path) > claims.order(newest[key]):
                newest[key] = path
    return [newest[k] for k in sorted(newest)]


def label(report: dict) -> str:
    return machines.name(report["meta"]["machine"])


def settings(report: dict) -> str:
    """What the bar ran: its precision, K and how often the text was the target alone's, from the report itself."""
    s = report["summary"]
    return f"{s['dtype']}, K = {s['k']}, identical text {round(100 * s['identical_fraction'])}%"


def rows_of(report: dict) -> list[tuple[str, float]]:
    s = report["summary"]
    return [("target alone", max(s["ar_tokens_per_s"], s.get("ar_hf_tokens_per_s") or 0.0)),
            ("speculative", s["spec_tokens_per_s"])]


def svg(reports: list[dict]) -> str:
    """Grouped horizontal bars, one group per report, with each group's speedup and date."""
    top = max(v for r in reports for _, v in rows_of(r))
    scale = (WIDTH - LABEL - 90) / top
    group = 2 * BAR + GAP + 18
    height = 40 + group * len(reports) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui, sans-serif" font-size="13">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           '<text x="10" y="22" font-size="15" font-weight="600">Tokens a second, end to end (the embedded pair, '
           'greedy)</text>']
    y = 40
    for r in reports:
        s = r["summary"]
        out.append(f'<text x="10" y="{y + BAR}" >{escape(label(r))}</text>')
        out.append(f'<text x="10" y="{y + 2 * BAR + 4}" fill="#475569" font-size="11">{escape(settings(r))}; '
                   f'{escape(r["meta"]["date"])}, {len(s["reported_on"])} prompts: <tspan font-weight="700" fill="#15803d">'
                   f'{s["speedup"]:.2f}×</tspan> [{s["speedup_ci95"][0]:.2f}, {s["speedup_ci95"][1]:.2f}]</text>')
        for i, (name, value) in enumerate(rows_of(r)):
            top_y = y + i * BAR
            out.append(f'<rect x="{LABEL}" y="{top_y}" width="{value * scale:.1f}" height="{BAR - 2}" '
                       f'fill="{COLORS[name]}"/>')
            out.append(f'<text x="{LABEL + value * scale + 6:.1f}" y="{top_y + BAR - 4}">{value:.1f} {name}</text>')
        y += group
    out.append(f'<text x="10" y="{height - 10}" fill="#475569" font-size="11">Made by scripts/docs.py from '
               'assets/bench/*.json; every run and its command: docs/benchmarks.md</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
