"""Where the generator reads and writes: the repository, its docs and the page templates."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TEMPLATES = DOCS / "templates"
