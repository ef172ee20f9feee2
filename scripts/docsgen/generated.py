"""Every generated file and what it should hold, and which of the committed ones differ (`docs.py --check`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from docsgen.api_reference import Endpoint, api_page, served_endpoints
from docsgen.cli_reference import build_parser, cli_page
from docsgen.paths import DOCS, ROOT
from docsgen.chart import CHART, headline, svg
from docsgen.render import REGION, rendered_page, template_pages, with_regions
from docsgen.reports import load_report


def pages(parser: argparse.ArgumentParser | None = None, endpoints: list[Endpoint] | None = None) -> dict[Path, str]:
    """Every generated file and what it should hold (a parser and endpoints given are used, not built afresh)."""
    out = {DOCS / "reference" / "cli.md": cli_page(parser or build_parser()),
           DOCS / "reference" / "api.md": api_page(endpoints if endpoints is not None else served_endpoints())}
    out |= {DOCS / name: rendered_page(name).text for name in template_pages()}
    out[CHART] = svg([load_report(path) for path in headline()])
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:  # hand-written files with generated regions
        text = path.read_text(encoding="utf-8") if path.exists() and path not in out else ""
        if REGION.search(text):
            out[path] = with_regions(text, docs="docs/" if path.parent == ROOT else "")
    return out


def stale(generated: dict[Path, str]) -> list[Path]:
    return [p for p, text in generated.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
