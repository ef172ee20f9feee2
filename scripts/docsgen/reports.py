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
    "setup": ROOT / "assets" / "setup", "room": ROOT / "assets" / "room",
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
