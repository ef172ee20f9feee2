"""Every flag of `specviz bench`, `specviz trace` and `specviz whatif` answers a hostile value with one sentence on
stderr naming it, exit code 2, and nothing written: a seeded, property-based fuzz (hypothesis) of each flag in turn,
the others valid; then the files a flag names that are not what they say (a prompts file that is not JSON Lines, a
GGUF that is not one).

The commands run in this process through `cli.main`; where a command's flags were all accepted it would load models
next, and there it is stopped (`Accepted`): what runs after its flags is not what this is about.
"""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from specviz import cli
from specviz.analysis.whatif import WhatIfInputs
from specviz.bench.loadtest import one_sentence
from specviz.commands.bench import BenchFlags
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.runs.outputs import OUTPUT_FLAGS
from specviz.settings.options import options_of

SEED = 77
DRAWN = 4  # values drawn per flag, after the curated ones every flag gets
EVERY_FLAG = ["x", "", "-1", "1e9999", "nan", "99999999999999999999999"]
CURATED = [" ", "0", "1.5", "inf", "-inf", "0x10", "2**70", "none", "true", "4,,8", ",", "a,b", "😀" * 500,
           "x" * 10_000, "../../etc/passwd", "/etc/passwd", "\u202eevil", "'; DROP TABLE x; --", "--k", "-x"]
# what each command is given besides the flag tried (`{out}`: a folder that must stay unmade)
VALID = {"bench": ["--json", "{out}/bench.json"],
         "trace": ["--prompt", "the man", "--draft", "tiny", "--target", "tiny", "--out", "{out}/t.json"],
         "whatif": ["--acceptance", "0.7", "--k", "4", "--draft-cost", "0.1"]}
SKIP = {"--compare-llamacpp"}  # a folder whose programs run after the bench (bench/llamacpp.py refuses its own)
LABELS = {dest: s.label for spec in (DecodeConfig, PairSpec, BenchFlags, WhatIfInputs)
          for s, _, dest in options_of(spec)}
NOT_OURS = re.compile(r"Traceback|Errno|codec can't|Expecting value|invalid int value|invalid float value|"
                      r"invalid choice|object has no attribute|NoneType|validation error|usage:", re.I)


class Accepted(BaseException):
    """Every flag was accepted: the command would load models now."""


@pytest.fixture
def stopped(monkeypatch):
    def accepted(*args, **kwargs):
        raise Accepted

    monkeypatch.setattr("specviz.bench.meta.machine", accepted)  # the bench's first act after its flags
    monkeypatch.setattr("specviz.commands.trace.load_spec", accepted)


def flags(command: str) -> list[argparse.Action]:
    """The flags of `command` that take a value (its outputs are fixed: they are where nothing may appear)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return [a for a in sub._actions if a.option_strings and a.nargs is None and a.dest not in OUTPUT_FLAGS
            and a.option_strings[-1] not in SKIP]


def run(command: str, flag: str, value: str, out, capsys) -> tuple[str, int | None, str]:
    """(outcome, exit code, stderr): outcome "accepted" (it would load models, or it answered: whatif) or "exit"."""
    given = [a.format(out=out) for a in VALID[command]]
    if flag in given:  # the flag tried replaces its valid value
        i = given.index(flag)
        given = given[:i] + given[i + 2:]
    try:
        code = cli.main([command, *given, flag, value])
    except Accepted:
        return "accepted", None, capsys.readouterr().err
    except SystemExit as e:  # argparse: it prints its own line first
        code = e.code
    said = capsys.readouterr()
    return ("accepted" if code == 0 else "exit"), code, said.err


def problem(command: str, action: argparse.Action, value: str, outcome: str, code, err: str, out) -> str | None:
    flag = action.option_strings[-1]
    where = f"specviz {command} {flag} {value[:40]!r}"
    if out.exists():
        return f"{where}: wrote {sorted(p.name for p in out.rglob('*')) or 'a folder'} ({outcome})"
    if outcome == "accepted":
        return None
    line = err.strip()
    if code != 2:
        return f"{where}: exit code {code}: {line[-300:]!r}"
    if not one_sentence(line) or len(line) > 500:
        return f"{where}: not one sentence: {line[-300:]!r}"
    if NOT_OURS.search(line):
        return f"{where}: Python's own words: {line[-300:]!r}"
    names = (flag, flag.lstrip("-").replace("-", " "), LABELS.get(action.dest, flag), value.split("/")[-1])
    if not any(n.lower() in line.lower() for n in names if n):
        return f"{where}: does not name {flag}: {line[-300:]!r}"
    return None


def test_every_flag_answers_a_hostile_value_in_one_sentence_and_writes_nothing(tmp_path, capsys, stopped):
    out = tmp_path / "new"
    tried = [(command, action) for command in VALID for action in flags(command)]
    answers = []

    def one(command, action, value):
        outcome, code, err = run(command, action.option_strings[-1], value, out, capsys)
        answers.append((outcome, problem(command, action, value, outcome, code, err, out)))

    for command, action in tried:
        for value in EVERY_FLAG:
            one(command, action, value)

    @seed(SEED)
    @settings(max_examples=DRAWN, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def drawn(data):
        for command, action in tried:
            value = data.draw(st.sampled_from(CURATED) | st.text(st.characters(blacklist_categories=["Cs"],
                                                                              blacklist_characters="\x00")),
                              label=f"{command} {action.option_strings[-1]}")
            one(command, action, value)

    drawn()
    problems = [p for _, p in answers if p]
    print(f"{len(answers)} hostile flag values over {len(tried)} flags: "
          f"{sum(o == 'exit' for o, _ in answers)} refused, {sum(o == 'accepted' for o, _ in answers)} accepted")
    assert not problems, f"{len(problems)} of {len(answers)} flags broke the contract:\n" + "\n".join(problems[:40])
    assert len(tried) > 40 and sum(o == "exit" for o, _ in answers) > len(answers) / 2


PROMPT_FILES = {
    "prose.txt": ("the man said that it was good\n", r"prose.txt line 1 is not JSON \(at column 1\)"),
    "binary.jsonl": (b"\x89PNG\r\n\x1a\n\x00\xff", r"binary.jsonl is not text \(UTF-8\)"),
    "list.jsonl": ("[1, 2, 3]\n", r"list.jsonl line 1 needs string fields"),
    "empty.jsonl": ("\n\n", r"empty.jsonl has no prompts"),
    "deep.jsonl": ('{"a": ' * 100_000 + "\n", r"deep.jsonl line 1 is (not JSON|nested too deep)"),
    "missing.jsonl": (None, r"could not read .*missing.jsonl: no such file or directory\."),
    "a folder": ("folder", r"could not read .*a folder: is a directory\."),
}


@pytest.mark.parametrize("name", PROMPT_FILES)
def test_a_prompts_file_that_is_not_json_lines_is_one_sentence(tmp_path, capsys, stopped, name):
    content, said = PROMPT_FILES[name]
    path = tmp_path / name
    if content == "folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert cli.main(["bench", "--prompts", str(path), "--json", str(tmp_path / "new" / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specviz bench: --prompts: ") and re.search(said, err) and one_sentence(err), err
    assert not (tmp_path / "new").exists()


GGUF_FILES = {"text.gguf": b"not a model at all\n", "empty.gguf": b"",
              "garbage.gguf": b"GGUF" + bytes(range(256)) * 4}


@pytest.mark.parametrize("name", [*GGUF_FILES, "missing.gguf"])
def test_a_gguf_that_is_not_one_is_one_sentence(tmp_path, capsys, name):
    path = tmp_path / name
    if name in GGUF_FILES:
        path.write_bytes(GGUF_FILES[name])
    out = tmp_path / "new"
    code = cli.main(["trace", "--prompt", "the man", "--draft", str(path), "--target", str(path),
                     "--out", str(out / "t.json"), "--html", str(out / "t.html")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and one_sentence(err) and len(err) < 500, err
    assert err.startswith("specviz: ") and name in err and not NOT_OURS.search(err), err
    assert not out.exists()


def test_a_bad_flag_value_for_argparse_is_one_sentence_too(capsys):
    """The values argparse converts itself (a bench's --limit, whatif's numbers) and its choices."""
    for argv, said in ((["bench", "--limit", "x"], "--limit must be a whole number, got 'x'"),
                       (["whatif", "--acceptance", "x", "--k", "4", "--draft-cost", "0.1"],
                        "--acceptance must be a number, got 'x'"),
                       (["bench", "--dtype", "float8"], "--dtype must be one of "),
                       (["bench", "--k"], "--k needs a value")):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and err.startswith(f"specviz {argv[0]}: bad flag: {said}"), err
        assert "\n" not in err and err.endswith("(--help lists the flags).")
    assert cli.main(["bench", "--k", "x"]) == 2
    assert capsys.readouterr().err.strip() == "specviz: bad flag: K must be a number, got 'x'."
