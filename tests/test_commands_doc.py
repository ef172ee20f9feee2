"""Commands checked: every `specviz ...`, `make ...` and script line in the README and the docs parses with the real
parsers (subcommand, flags, choices, types), names a Makefile target or a script and flags that exist, and every
local port it names is one the engines or the app listen on by default; each check with a planted control."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from docsgen.cli_reference import build_parser, subcommands  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the rendered pages (templates render here)
PLACEHOLDER = re.compile(r"…|\.\.\.|<[^>]*>|^[A-Z][A-Z_]*$|\$")  # a value the reader fills in


def commands(text: str) -> list[tuple[str, bool]]:
    """Each command line a page shows, and whether it is to be run as written (a code block's line: parsed in full)
    or a mention or synopsis (inline code, `[optional]` parts, `<placeholders>`: its subcommand and flags checked).
    Lines start with a command (`specviz`, `.venv/bin/specviz`, `make`, a script), environment assignments allowed."""
    # (a report's command as it ran, its retired flags named beside it, is a record, not an instruction)
    text = re.sub(r"\*Command\*: `[^`]*` \(as run then: [^)]*\)", " ", text)
    blocks = [block.replace("\\\n", " ") for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)]
    lines = [(line, True) for block in blocks for line in block.splitlines()]
    lines += [(span, False) for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", " ", text, flags=re.S))]
    out = []
    for line, whole in lines:
        line = line.split("  #")[0].split(" # ")[0].strip().removeprefix("$ ")
        words = re.sub(r"^(\w+=\S+\s+)+", "", line)
        if re.match(r"(\.venv/bin/)?specviz( |$)|make \w|(\.venv/bin/)?python3? scripts/|bash scripts/", words):
            out.append((words, whole and not re.search(r"\[|<[^>]*>|…|\.\.\.", words)))
    return out


def parsers() -> dict[str, argparse.ArgumentParser]:
    """`specviz`'s parser and every subcommand's, by their words ("specviz", "specviz engines race")."""
    out = {}

    def walk(words, p):
        out[" ".join(words)] = p
        for name, _, sub in subcommands(p):
            walk([*words, name], sub)

    walk(["specviz"], build_parser())
    return out


def problem(command: str, table: dict[str, argparse.ArgumentParser], whole: bool = True) -> str | None:
    """Why a command line would fail as written (`whole`), or why its subcommand or a flag does not exist, or None."""
    if not whole:
        command = re.sub(r"<[^>]*>", "X", command).replace("[", " ").replace("]", " ")
    try:
        words = shlex.split(command.split(" | ")[0].split(" && ")[0].split(" > ")[0])
    except ValueError as e:
        return f"unquotable: {e}"
    words[0] = words[0].removeprefix(".venv/bin/")
    if words[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        return None if words[1] in targets else f"no Makefile target {words[1]!r}"
    if words[0] in ("python", "python3", "bash"):
        script = ROOT / words[1]
        if not script.exists():
            return f"no script {words[1]}"
        known = set(re.findall(r"""["'](--[\w-]+)["']""", script.read_text()))
        unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in known]
        return f"{words[1]} has no {unknown}" if unknown and script.suffix == ".py" else None
    # specviz: the longest subcommand path, then the rest parsed by it (placeholders filled with a plain value)
    n = max(i for i in range(1, len(words) + 1) if " ".join(words[:i]) in table)
    rest = words[n:]
    if not whole or any(PLACEHOLDER.search(w) for w in rest):
        parser = table[" ".join(words[:n])]
        flags = {o for a in parser._actions for o in a.option_strings}
        unknown = [w for w in rest if w.startswith("-") and w.split("=")[0] not in flags]
        return f"{' '.join(words[:n])} has no {unknown}" if unknown else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            table["specviz"].parse_args(words[1:] if n > 1 or rest else words[1:])
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1]
    return None


@pytest.fixture(scope="module")
def table():
    return parsers()


def test_every_command_on_a_page_parses(table):
    found = {(p.name, c, whole) for p in PAGES for c, whole in commands(p.read_text(encoding="utf-8"))}
    assert len(found) > 40  # the pages' commands were found
    failing = {f"{page}: {c}": why for page, c, whole in sorted(found) if (why := problem(c, table, whole))}
    assert not failing, f"commands that fail as written: {failing}"


def test_the_command_check_catches_what_would_fail(table):
    """The negative control: a retired flag, a bad choice, a wrong subcommand, a missing target or script flag."""
    assert problem("specviz bench --k 8 --json out.json", table) is None
    assert problem("specviz bench --also-plain-verify", table)
    assert problem("specviz bench --kernels fastest", table)
    assert problem("specviz benchmark", table)
    assert problem("make tests", table)
    assert problem(".venv/bin/python scripts/page_vs_bench.py --rounds 3", table) is None
    assert problem(".venv/bin/python scripts/page_vs_bench.py --laps 3", table)
    assert problem("specviz serve --allow-engine <URL> --nonsense", table, whole=False)
    assert problem("specviz engines llamacpp [--port 8081] [--p-min 0.4] [--p-max 3]", table, whole=False)
    assert problem("specviz atlas", table) and problem("specviz atlas", table, whole=False) is None  # a mention
    assert commands("Run `specviz prepare --status`, then:\n```bash\nFOO=1 specviz bench --k 8  # note\n```\n") == [
        ("specviz bench --k 8", True), ("specviz prepare --status", False)]


# ---- ports --------------------------------------------------------------------------------------------------------

def default_ports(table) -> set[int]:
    """The ports the app and the engines listen on by default: each `--port`'s default, and for an engine the two
    beside it (its target with the draft on --port + 1, the draft alone on --port + 2)."""
    ports = set()
    for words, p in table.items():
        for a in p._actions:
            if "--port" in a.option_strings and str(a.default).isdigit():
                port = int(a.default)
                ports |= {port, port + 1, port + 2} if words.startswith("specviz engines") else {port}
    return ports


def ports_named(text: str) -> list[tuple[int, str]]:
    """(port, its paragraph) for every local address a page names (127.0.0.1:N, localhost:N), but in the record of a
    run (a report's *Command*, which names the ports it ran against)."""
    return [(int(m.group(1)), para) for para in re.split(r"\n\s*\n", text) if "*Command*:" not in para
            for m in re.finditer(r"(?:127\.0\.0\.1|localhost|0\.0\.0\.0):(\d{2,5})", para)]


def test_every_local_port_on_a_page_is_a_default_one(table):
    ports = default_ports(table)
    assert {7860, 8081, 8091} <= ports
    wrong = [f"{p.name}: {port} in {line.strip()[:100]}" for p in PAGES
             for port, line in ports_named(p.read_text(encoding="utf-8"))
             if port not in ports and not re.search(rf"--port {port}\b|--port {port - 1}\b|--port {port - 2}\b", line)]
    assert not wrong, f"ports nothing listens on by default: {wrong}"


def test_the_port_check_catches_a_port_nothing_listens_on(table):
    """The negative control: `--allow-engine ... :8090` (llama.cpp listens on 8081/8082) is caught."""
    ports = default_ports(table)
    named = ports_named("specviz serve --allow-engine http://127.0.0.1:8091 http://127.0.0.1:8090")
    assert [port for port, _ in named if port not in ports] == [8090]


# ---- defaults quoted ----------------------------------------------------------------------------------------------

def test_the_cli_reference_quotes_each_flags_own_default(table):
    """The reference page's default column and the number its help quotes as "default: X" agree (prove's
    temperature said 0.0 where prove samples at 1.0)."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    wrong = [line for line in page.splitlines()
             if (m := re.match(r"\| `(--[\w-]+)` \| [^|]* \| `(-?[\d.]+)` \|.*default: (-?[\d.]+)\)", line))
             and float(m.group(2)) != float(m.group(3))]
    assert not wrong, f"a default quoted twice, differently: {wrong}"
