"""The report readers: the JSON reports under assets/ that pages quote, and the pytest logs whose counts they show.

A `Readings` records every file a rendering read, so that the docs' test can check each number on a page against
the reports behind it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from docsgen.paths import ROOT

# a template reads a report by its folder's kind: `bench("cpu2_zen5_fp32_lean")` is assets/bench/cpu2_zen5_fp32_lean.json
REPORTS = MappingProxyType({
    "bench": ROOT / "assets" / "bench", "proof": ROOT / "assets" / "proof", "atlas": ROOT / "assets" / "atlas",
    "engines": ROOT / "assets" / "engines", "costs": ROOT / "assets" / "costs", "gpu": ROOT / "assets" / "gpu",
    "setup": ROOT / "assets" / "setup", "room": ROOT / "assets" / "room", "acceptance": ROOT / "assets" / "acceptance",
    "screenshot": ROOT / "assets" / "screenshots",
    "data": ROOT / "specviz" / "data"})  # data: the package's fitted models (the acceptance predictor)


class Report(dict):
    """A JSON report as a dict (templates read `r.summary.speedup`), knowing the file it came from."""

    source: Path


@dataclass
class Readings:
    """The files one rendering read, each once, in the order first read."""

    used: list[Path] = field(default_factory=list)

    def record(self, path: Path) -> Path:
        if path not in self.used:
            self.used.append(path)
        return path

    def report(self, kind: str, name: str) -> Report:
        return load_report(self.record(REPORTS[kind] / f"{name}.json"))

    def claim(self, name: str) -> Report | None:
        """The newest report of a claim's kind (`claims.KINDS`), or None where none is kept."""
        from docsgen.claims import newest

        path = newest(name)
        return load_report(self.record(path)) if path else None

    def session(self, name: str) -> list[Report]:
        from docsgen.claims import session

        return [load_report(self.record(p)) for p in session(name)]

    def pytest_counts(self, name: str) -> str:
        return pytest_summary(self.record(REPORTS["gpu"] / f"{name}.log"))


def load_report(path: Path) -> Report:
    report = Report(json.loads(path.read_text(encoding="utf-8")))
    report.source = path
    return report


def pytest_summary(path: Path) -> str:
    """A pytest log's last summary line (\"202 passed, 5 skipped in 250.24s\"), as pytest printed it."""
    # (between rows of '=' in a verbose run's log, bare in a quiet one's)
    lines = [m.group(1) for m in re.finditer(r"^=* ?(\d+ (?:passed|failed)[^=\n]*?) ?=*$", path.read_text(), re.M)]
    if not lines:
        raise ValueError(f"{path}: no pytest summary line")
    return re.sub(r", \d+ warnings", "", lines[-1].split(" (")[0])


# what a bench run measured (beside its machine and precision): runs alike in these are of one kind, and the newer
# supersedes the older; flags that only add columns (--compare-hf, --also-untuned, --json, ...) are not among them.
# A flag an older report predates reads as its default.
KIND_ARGS = {"prompts": None, "limit": None, "k": None, "confidence": None, "adaptive": None, "drafter": None,
             "draft": None, "target": None, "draft_quant": "int4", "target_quant": "none", "draft_vocab": 0,
             "kernels": "tuned", "invariant": True, "temperature": 0.0, "max_new_tokens": None, "tree_budget": None,
             "exit_layer": None, "also_tree": "", "also_adaptive": "", "save_predictor": None}


def kind(report: dict) -> tuple | None:
    """A bench report's kind (None for other reports: only benches supersede each other here)."""
    if "summary" not in report or "args" not in report.get("meta", {}):
        return None
    args = report["meta"]["args"]
    return (report["meta"].get("machine", {}).get("described"), report["summary"].get("dtype"),
            *(str(args.get(name, default)) for name, default in KIND_ARGS.items()))


def superseded(path: Path, folder: Path = REPORTS["bench"]) -> Path | None:
    """A newer report of the same kind as the one at `path` (by its date, then its time where both have one), or
    None."""
    mine = load_report(path)
    k = kind(mine)
    if k is None:
        return None
    when = lambda r: (r["meta"].get("date", ""), r["meta"].get("time", ""))  # noqa: E731
    newer = [p for p in sorted(folder.glob("*.json")) if p != path and kind(other := load_report(p)) == k
             and when(other) > when(mine) and (when(other)[0] > when(mine)[0] or (when(other)[1] and when(mine)[1]))]
    return newer[0] if newer else None


def stale_citations(used: list[Path], folder: Path = REPORTS["bench"]) -> list[str]:
    """The reports in `used` that a newer one of their kind supersedes, unless the page reads that newer one too (an
    older run beside the newer: a before and after), each as "NAME (superseded by NEWER)"."""
    out = []
    for path in used:
        if path.parent == folder and (newer := superseded(path, folder)) is not None and newer not in used:
            out.append(f"{path.name} (superseded by {newer.name})")
    return out


EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.S)
RATE = re.compile(r"speedup|tokens_per_s|tok_s")  # a rate or a speedup a page quotes


def blocks(template: str) -> list[str]:
    """A page's paragraphs and tables: what a reader takes in as one comparison (split at blank lines)."""
    return [b for b in re.split(r"\n\s*\n", template) if b.strip()]


def unlike_measures(template: str) -> list[str]:
    """The paragraphs and tables of `template` that quote a decode-only rate or speedup (a report field named
    decode…) without saying so in their own words: beside end-to-end figures they would read as one measure. A
    decode-only figure is shown labelled, as its own column or clause ("decode")."""
    problems = []
    for block in blocks(template):
        quoted = [e.strip() for e in EXPRESSION.findall(block) if RATE.search(e)]
        words = EXPRESSION.sub("", block).lower()
        if any("decode" in e for e in quoted) and "decod" not in words:
            problems.append(next(e for e in quoted if "decode" in e))
    return problems
