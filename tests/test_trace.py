"""Traces: record -> save -> load gives back the same events; anything else is a clear TraceError;
`specviz trace` works end to end on the tiny pair."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from specviz import cli
from specviz.analysis.stats import spec_stats
from specviz.engine import DecodeConfig, SamplingParams
from specviz.runs import trace
from specviz.settings.errors import TraceError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import values_of
from specviz.settings.spec import validate


@pytest.fixture(scope="module")
def recorded(tiny):
    config = DecodeConfig(k=3, max_new_tokens=20, sampling=SamplingParams(0.8, 20, 0.95), seed=4, adaptive="fixed")
    return trace.record(tiny, "she said that", config, with_ar=True)


def test_record_save_load_roundtrip(recorded, tmp_path):
    path = trace.save(recorded, tmp_path / "t.json")
    loaded = trace.load(path)
    assert loaded == recorded
    meta = asdict(loaded.meta)  # the meta as the trace file holds it
    assert meta["config"]["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 0.95}
    assert loaded.meta.prompt == "she said that" and loaded.meta.prompt_tokens == 3
    assert len(loaded.ar_steps) == 20 or loaded.ar_steps[-1].finished == "eos"
    assert sum(r.tokens_emitted for r in loaded.rounds) <= 20


def test_a_trace_without_the_target_alone(tiny, tmp_path):
    t = trace.record(tiny, "one", DecodeConfig(k=2, max_new_tokens=8, adaptive="fixed"))
    assert t.ar_steps == [] and trace.load(trace.save(t, tmp_path / "t.json")) == t


def test_the_file_is_plain_json_with_a_format_tag(recorded, tmp_path):
    data = json.loads(trace.save(recorded, tmp_path / "t.json").read_text())
    assert data["format"] == "specviz-trace" and data["version"] == 1
    assert set(data) == {"format", "version", "meta", "rounds", "ar_steps"}
    assert set(data["rounds"][0]) >= {"drafted", "n_accepted", "emitted", "new_token_ids", "draft_time", "verify_time"}


def write(tmp_path, text: str | bytes):
    path = tmp_path / "x.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


@pytest.mark.parametrize("content,message", [
    ('{"rounds": []}', "not a specviz trace"),
    ("[1, 2, 3]", "not a specviz trace"),
    ('"specviz-trace"', "not a specviz trace"),
    ('{"format": "specviz-trace", "version": 99, "meta": {}, "rounds": []}', "version 99 is not supported"),
    ("{not json", "could not read a trace from x.json"),
    ("", "could not read a trace"),
    (b"\xff\xfe\x00garbage", "could not read a trace"),
])
def test_files_that_are_not_traces(tmp_path, content, message):
    with pytest.raises(TraceError, match=message):
        trace.load(write(tmp_path, content))


def damaged(data: dict, how: str) -> dict:
    data = json.loads(json.dumps(data))
    if how == "no rounds":
        del data["rounds"]
    elif how == "round lacks a field":
        del data["rounds"][0]["n_accepted"]
    elif how == "unknown field":
        data["rounds"][0]["drafted"][0]["colour"] = "red"
    elif how == "wrong type":
        data["rounds"][0]["drafted"] = 7
    elif how == "step lacks its token":
        del data["ar_steps"][0]["token"]
    elif how == "meta is not an object":
        data["meta"] = 5
    return data


@pytest.mark.parametrize("how", ["no rounds", "round lacks a field", "unknown field", "wrong type",
                                 "step lacks its token", "meta is not an object"])
def test_damaged_traces(recorded, tmp_path, how):
    path = write(tmp_path, json.dumps(damaged(recorded.to_dict(), how)))
    with pytest.raises(TraceError, match="damaged or incomplete"):
        trace.load(path)


def test_a_missing_file(tmp_path):
    with pytest.raises(TraceError, match="could not read a trace from nope.json"):
        trace.load(tmp_path / "nope.json")


def test_cli_trace_on_the_tiny_pair(tmp_path, capsys):
    out, page = tmp_path / "trace.json", tmp_path / "run.html"
    rc = cli.main(["trace", "--draft", "tiny", "--target", "tiny", "--device", "cpu", "--draft-quant", "none",
                   "--prompt", "the a of", "--out", str(out), "--max-new-tokens", "16", "--k", "3", "--adaptive", "fixed",
                   "--with-ar", "--html", str(page)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    t = trace.load(out)
    s = spec_stats(t.rounds)
    assert f"{len(t.rounds)} rounds, 16 tokens, acceptance {s.acceptance_rate:.2f}" in printed
    spec = [x for r in t.rounds for x in r.new_token_ids]
    assert len(spec) == 16 and spec == [s.token.id for s in t.ar_steps]  # greedy by default: identical
    html = page.read_text()  # the shareable page of the same run (its contents: test_share.py)
    assert f"wrote {page}" in printed and html.count('class="sv-round') == len(t.rounds) and "×" in html
    assert t.meta.draft.startswith("tiny-draft") and t.meta.config.k == 3  # (its step as measured here)


def test_cli_rejects_half_a_tiny_pair(tmp_path, capsys):
    rc = cli.main(["trace", "--draft", "tiny", "--target", "embedded", "--prompt", "x", "--out", str(tmp_path / "t.json")])
    assert rc == 2 and "both --draft and --target" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "1e-5"], "temperature"),
    (["--k", "0"], "K must be"),
    (["--max-new-tokens", "0"], "max new tokens"),
    (["--top-p", "0"], "top-p"),
])
def test_cli_rejects_bad_decoding_flags_before_loading(tmp_path, capsys, flags, message):
    out = tmp_path / "t.json"
    rc = cli.main(["trace", "--draft", "tiny", "--target", "tiny", "--prompt", "x", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and "specviz: bad flag:" in err and message in err and not out.exists()


def test_cli_bench_checks_every_k_and_the_cli_is_not_held_to_the_web_limits(capsys):
    rc = cli.main(["bench", "--draft", "tiny", "--target", "tiny", "--k", "2,4", "--temperature", "1e-5"])
    assert rc == 2 and "temperature" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["trace", "--prompt", "x", "--max-new-tokens", "2000", "--k", "32"])
    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    assert (config.max_new_tokens, config.k) == (2000, 32)
