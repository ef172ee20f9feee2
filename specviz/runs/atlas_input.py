"""The Atlas's prompts: a .jsonl, .txt or .csv file (uploaded, pasted or on disk) read into prompts.

    .jsonl  one {"prompt": ..., "kind"?: ..., "id"?: ...} object per line
    .txt    prompts separated by blank lines
    .csv    a header row with a `prompt` column (and optionally `kind` and `id`)

A file that cannot be read at all (empty, binary, a CSV with no `prompt` column) raises `InputError` with
one sentence. A bad prompt inside a good file (not JSON, empty, too long) is one sentence in `problems`
and is skipped: the valid prompts still run. Past `max_atlas_prompts`, the rest are left out, also said
in one sentence. The checks that need the tokenizer (a prompt over the context) come when the run starts.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from specviz.settings.errors import InputError
from specviz.settings.limits import Limits, clean_prompt

FORMATS = (".jsonl", ".txt", ".csv")
MAX_FILE_BYTES = 20_000_000  # as much as the app's upload limit


@dataclass(frozen=True)
class AtlasPrompt:
    id: str
    prompt: str
    kind: str = "other"


@dataclass(frozen=True)
class PromptSet:
    prompts: tuple[AtlasPrompt, ...]
    problems: tuple[str, ...]  # one sentence per prompt skipped (and for those left out past the limit)


def decode_text(data: bytes, name: str) -> str:
    if not data.strip():
        raise InputError(f"{name} is empty: give one prompt per line (.jsonl), per paragraph (.txt) or per row (.csv).")
    if b"\0" in data:
        raise InputError(f"{name} is a binary file, not text: give a .jsonl, .txt or .csv file of prompts.")
    try:
        return data.decode("utf-8-sig")  # a BOM, as spreadsheet exports write it, is not part of the text
    except UnicodeDecodeError:
        raise InputError(f"{name} is not UTF-8 text: save it as UTF-8 and try again.") from None


def guess_format(name: str, text: str) -> str:
    """By the file's extension; pasted text (no extension): JSON Lines if it starts with '{', else .txt."""
    suffix = Path(name).suffix.lower()
    if suffix in FORMATS:
        return suffix
    if suffix:
        raise InputError(f"{name} is not a .jsonl, .txt or .csv file.")
    return ".jsonl" if text.lstrip().startswith("{") else ".txt"


def jsonl_rows(text: str) -> list[tuple[str, dict | str]]:
    """(where, row or the sentence saying why the line is no prompt) per non-blank line."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            rows.append((where, f"{where} skipped: it is not JSON ({e.msg})."))
            continue
        ok = isinstance(obj, dict) and isinstance(obj.get("prompt"), str)
        rows.append((where, obj if ok else f"{where} skipped: it needs a \"prompt\" field holding text."))
    return rows


def txt_rows(text: str) -> list[tuple[str, dict | str]]:
    blocks = [b.strip("\n") for b in re.split(r"\n(?:[ \t]*\n)+", text.replace("\r\n", "\n"))]
    return [(f"prompt {i}", {"prompt": b}) for i, b in enumerate((b for b in blocks if b.strip()), start=1)]


def csv_rows(text: str, name: str) -> list[tuple[str, dict | str]]:
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip().lower() for h in reader.fieldnames or []]
        if "prompt" not in header:
            raise InputError(f"{name} has no `prompt` column (its columns: {', '.join(header) or 'none'}).")
        reader.fieldnames = header
        return [(f"row {i}", {k: v for k, v in row.items() if k}) for i, row in enumerate(reader, start=2)]
    except csv.Error as e:
        raise InputError(f"{name} is not a readable CSV file ({e}).") from None


def read_prompts(data: bytes | str, name: str, limits: Limits) -> PromptSet:
    """Every prompt of a file's content; `name` gives its format (a pasted text has none)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"{name} is {len(raw):,} bytes; the limit is {MAX_FILE_BYTES:,}.")
    text = decode_text(raw, name)
    kind = guess_format(name, text)
    rows = jsonl_rows(text) if kind == ".jsonl" else csv_rows(text, name) if kind == ".csv" else txt_rows(text)
    prompts, problems, ids = [], [], set()
    for where, row in rows:
        if isinstance(row, str):
            problems.append(row)
            continue
        try:
            prompt = clean_prompt(row.get("prompt"), limits)
        except InputError as e:
            problems.append(f"{where} skipped: {e}")
            continue
        pid = str(row.get("id") or "").strip() or where.replace(" ", "-")
        if pid in ids:
            problems.append(f"{where} skipped: it repeats the id {pid!r}.")
            continue
        ids.add(pid)
        prompts.append(AtlasPrompt(pid, prompt, str(row.get("kind") or "").strip() or "other"))
    if len(prompts) > limits.max_atlas_prompts:
        problems.append(f"{len(prompts)} prompts given; the limit is {limits.max_atlas_prompts}: the first "
                        f"{limits.max_atlas_prompts} run.")
        prompts = prompts[:limits.max_atlas_prompts]
    if not prompts:
        raise InputError(f"{name} has no prompt to run" + (f": {problems[0]}" if problems else "."))
    return PromptSet(tuple(prompts), tuple(problems))


def read_file(path: str | Path, limits: Limits) -> PromptSet:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"could not read {path.name}: {e.strerror or e}.") from None
    return read_prompts(data, path.name, limits)
