"""docs/architecture.md's map (`_modules.md`): every module of the package by folder with its docstring's first
sentence, and the import-linter layers in pyproject.toml, so that the page describes the code as the code does."""

from __future__ import annotations

import ast
import re
import tomllib

from docsgen.paths import ROOT


def summary_line(doc: str) -> str:
    """A docstring's first sentence, on one line."""
    first = " ".join(doc.split("\n\n")[0].split())
    end = re.search(r"(?<=[.:;])\s(?=[A-Z`(])", first)
    return first[:end.start()] if end else first


def modules() -> list[tuple[str, list[tuple[str, str]]]]:
    """Every module of the package by folder, with its docstring's first sentence: the architecture page's map, so
    that it lists every module as the code describes it (a module without a docstring fails the docs' test)."""
    package = ROOT / "specviz"
    folders: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        folders.setdefault(rel.parent.as_posix(), []).append((rel.name, summary_line(doc)))
    return sorted(folders.items(), key=lambda item: (item[0] != ".", item[0]))


def layers() -> tuple[list[str], list[str]]:
    """The import contracts in pyproject.toml: the layers from top to bottom, and every contract's name."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    stack = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [layer.replace("specviz.", "") for layer in stack], [c["name"] for c in contracts]
