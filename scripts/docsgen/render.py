"""The renderer: pages from `docs/templates/*.md` (Jinja) over the reports they read, and the generated regions of
hand-written files (`<!-- docs.py: _partial.md -->` … `<!-- /docs.py -->`, the README's headline table)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from docsgen import about, architecture, claims, code_values, machines
from docsgen.formats import FILTERS
from docsgen.markdown import banner
from docsgen.paths import ROOT, TEMPLATES
from docsgen.reports import REPORTS, Readings, Report

REGION = re.compile(r"^(<!-- docs\.py: (?P<partial>[\w.-]+) -->\n)(?P<body>.*?)^(<!-- /docs\.py -->)", re.S | re.M)


@dataclass
class Rendered:
    text: str
    reports: list[Path] = field(default_factory=list)  # every report the page read


def about_report(report: Report) -> str:
    """`about` with a link to the report, as the site serves it (at its path in the repository)."""
    return about.about(report, report.source.relative_to(ROOT).as_posix())


def environment(readings: Readings):
    """The Jinja environment templates render in: a reader per report folder (each recording the file it read in
    `readings`), `about`, the code's own values and the number formats. A missing key is an error, never an empty
    cell."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals.update({kind: partial(readings.report, kind) for kind in REPORTS})
    env.globals.update(claim=readings.claim, session=readings.session, rates=claims.rates, verdict=claims.verdict,
                       loadtest_run=claims.loadtest_run, by_example=claims.by_example,
                       bench_defaults=claims.bench_defaults,
                       machine=lambda r: machines.name(r["meta"]["machine"]))
    env.globals.update(modules=architecture.modules, layers=architecture.layers,
                       limit_options=code_values.limit_options,
                       pytest_counts=readings.pytest_counts, about=about_report)
    env.filters.update(FILTERS)
    return env


def render(template: str, **context) -> Rendered:
    readings = Readings()
    text = environment(readings).get_template(template).render(**context)
    return Rendered(text, readings.used)


def template_pages() -> list[str]:
    """The templates that are pages (a name starting with _ is a partial, included by others)."""
    return sorted(p.name for p in TEMPLATES.glob("*.md") if not p.name.startswith("_"))


def rendered_page(template: str) -> Rendered:
    r = render(template, docs="")
    return Rendered(banner(f"docs/templates/{template}") + r.text, r.reports)


def with_regions(text: str, docs: str) -> str:
    """`text` with each generated region rendered afresh from its partial."""
    return REGION.sub(lambda m: m.group(1) + render(m.group("partial"), docs=docs).text + m.group(4), text)
