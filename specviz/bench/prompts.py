"""Benchmark prompt sets: JSON Lines, one {"id", "prompt", "kind"?} object per line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


class PromptFileError(ValueError):
    """The prompt file cannot be used; the message says which line and why."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    prompt: str
    kind: str = "other"


def parse_prompts(lines, source: str = "prompts") -> list[BenchPrompt]:
    prompts, seen = [], set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{source} line {number} is not JSON (at column {e.colno}): each line must be one "
                                  "JSON object.") from None
        except RecursionError:  # (its objects nested thousands deep)
            raise PromptFileError(f"{source} line {number} is nested too deep to be a prompt.") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(obj.get("prompt"), str):
            raise PromptFileError(f"{source} line {number} needs string fields \"id\" and \"prompt\".")
        if not obj["prompt"].strip():
            raise PromptFileError(f"{source} line {number} has an empty prompt.")
        if obj["id"] in seen:
            raise PromptFileError(f"{source} line {number} repeats the id {obj['id']!r}.")
        seen.add(obj["id"])
        prompts.append(BenchPrompt(obj["id"], obj["prompt"], str(obj.get("kind") or "other")))
    if not prompts:
        raise PromptFileError(f"{source} has no prompts.")
    return prompts


def load_prompts(path: str | Path | None = None) -> list[BenchPrompt]:
    """The prompts in a JSON Lines file; by default the shipped set (package data: installed or not)."""
    source = resources.files("specviz.data") / "prompts.jsonl" if path is None else Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PromptFileError(f"{source} is not text (UTF-8): give JSON Lines, one {{\"id\", \"prompt\"}} "
                              "a line.") from None
    except OSError as e:
        raise PromptFileError(f"could not read {source}: {(e.strerror or 'unreadable').lower()}.") from None
    return parse_prompts(text.splitlines(), source.name)
