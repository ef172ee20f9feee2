"""The Atlas on the real embedded pair: `specviz atlas` over the shipped prompts, one of each kind, a few tokens
each, the shortest of each kind (the whole set at the default length is a bench-style command: see the README). A file of its own so that `make test`
schedules it with the other tests that share the loaded pair (conftest.SHARED), never loading it twice."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from specviz import cli
from specviz.commands import atlas

pytestmark = pytest.mark.embedded
KINDS = ("code", "json", "prose")


def test_cli_atlas_on_shipped_prompts(served_pair, tmp_path, monkeypatch, capsys):
    shipped = (resources.files("specviz.data") / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    first = {}
    for line in sorted(shipped, key=len):  # the shortest prompt of each kind: prompt reading is most of the time
        first.setdefault(json.loads(line)["kind"], line)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(first[kind] for kind in KINDS) + "\n")
    monkeypatch.setattr(atlas, "load_spec", lambda spec: served_pair)  # the session's pair as served, loaded once
    code = cli.main(["atlas", "--prompts", str(prompts), "--max-new-tokens", "8", "--json", str(tmp_path / "a.json"),
                     "--html", str(tmp_path / "a.html"), "--export-rejections", str(tmp_path / "r.jsonl")])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["finished"] == "done" and report["input"] == {"valid": 3, "ran": 3, "problems": []}
    assert sorted(row["kind"] for row in report["prompts"]) == list(KINDS)
    assert all(row["tokens"] == 8 or row["finished"] == "eos" for row in report["prompts"])
    tested = sum(c["n"] for c in report["where"]["by_position"])  # drafts the target tested (totals: drafted)
    assert tested > 0 and sum(c["acceptance"]["n"] for c in report["classes"]) == tested
    assert sum(b["acceptance"]["n"] for b in report["where"]["by_entropy"]) == tested  # every token has one now
    assert [k["kind"] for k in report["advice"]["kinds"]] == sorted(KINDS)
    assert report["advice"]["ceiling"]["predicted_speedup"] >= report["totals"]["predicted_speedup"]
    rejections = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(rejections) == sum(c["rejections"] for c in report["classes"])
    html = (tmp_path / "a.html").read_text()
    assert all(f'id="sv-atlas-{s}"' in html for s in ("summary", "prompts", "where", "disagreements", "classes",
                                                      "advice", "settings"))
