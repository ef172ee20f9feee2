"""`specviz bench --compare-llamacpp`: the parsers on real llama.cpp output, the commands built, the aggregates and
the one-sentence errors. No llama.cpp binary runs here: `run` is faked with output captured from the build of
llama.cpp vendored in llama-cpp-python 0.3.36 (tests/data/llamacpp/)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specviz.bench import llamacpp
from specviz.bench.llamacpp import (
    LlamaCppOutputError, binaries, chat_text, compare_llamacpp, parse_bench_json, parse_speculative, parse_version,
    sampling_args, speculative_flags,
)
from specviz.bench.prompts import BenchPrompt
from specviz.engine import DecodeConfig
from specviz.engine.sampling import SamplingParams
from specviz.models import PairSpec

DATA = Path(__file__).parent / "data" / "llamacpp"
BENCH_JSON = (DATA / "llama-bench-draft.json").read_text()
SPEC_STDERR = (DATA / "speculative-simple.stderr.txt").read_text()
SPEC_STDOUT = (DATA / "speculative-simple.stdout.txt").read_text()
SPEC_HELP = (DATA / "speculative-simple-help.txt").read_text()
VERSION = (DATA / "llama-bench-version.txt").read_text()


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and message.count(". ") <= 1


# ---------------------------------------------------------------------------------------------- parsers


def test_parse_bench_json_reads_avg_ts():
    assert parse_bench_json(BENCH_JSON) == pytest.approx(19.259207)
    record = llamacpp.bench_record("main: some log line\n" + BENCH_JSON)  # text around the array is ignored
    assert record["samples_ts"] == [1.92959, 36.5888] and record["n_gen"] == 16
    assert record["median_ts"] == pytest.approx((1.92959 + 36.5888) / 2)


def test_the_rate_used_is_the_median_of_the_repetitions():
    """A repetition disturbed by another process (the captured run's first one: 1.9 of ~37 tokens/s) moves the
    mean far; the median of three does not."""
    record = llamacpp.bench_record(json.dumps([{**json.loads(BENCH_JSON)[0], "samples_ts": [3.0, 40.0, 41.0]}]))
    assert record["median_ts"] == 40.0


def test_parse_bench_json_fails_in_one_sentence():
    with pytest.raises(LlamaCppOutputError, match="no JSON"):
        parse_bench_json("| model | size |\n| qwen2 | 1B |")  # markdown: -o json was not given
    prompt_only = json.dumps([{**json.loads(BENCH_JSON)[0], "n_prompt": 512, "n_gen": 0}])
    with pytest.raises(LlamaCppOutputError, match="no token-generation result"):
        parse_bench_json(prompt_only)


def test_parse_speculative_reads_the_decode_summary():
    out = parse_speculative(f"{SPEC_STDOUT}\n{SPEC_STDERR}")
    assert out["tokens"] == 36 and out["seconds"] == pytest.approx(100.129)
    assert out["tokens_per_s"] == pytest.approx(36 / 100.129)
    assert (out["drafted"], out["accepted"]) == (32, 28)
    assert (out["prompt_tokens"], out["prompt_seconds"]) == (38, pytest.approx(6.257))


def test_parse_speculative_takes_the_summary_not_the_generated_text():
    echoed = "the model wrote: decoded 999 tokens in 1.0 seconds, n_drafted = 1, n_accept = 1\n"
    assert parse_speculative(echoed + SPEC_STDERR)["tokens"] == 36


def test_parse_speculative_fails_in_one_sentence():
    with pytest.raises(LlamaCppOutputError) as e:
        parse_speculative(SPEC_STDOUT)  # the generated text alone: no summary
    assert "decoded N tokens" in str(e.value) and one_sentence(str(e.value))


def test_parse_version():
    assert parse_version(VERSION) == "0.5.0-dev, build 0, commit unknown"
    assert parse_version("nothing here") is None


def test_speculative_flags_of_this_build():
    flags = speculative_flags(SPEC_HELP)
    assert flags["n_max"] == "--spec-draft-n-max" and flags["n_min"] == "--spec-draft-n-min"
    assert flags["p_min"] == "--spec-draft-p-min"
    assert flags["type"] == ["--spec-type", "draft-simple"] and flags["no_escape"] == ["--no-escape"]


def test_speculative_flags_of_older_builds():
    # a hand-written excerpt in the older naming (before --spec-draft-*): no --spec-type to give
    old = ("--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding\n"
           "--draft-min, --draft-n-min N            minimum number of draft tokens\n"
           "--draft-p-min P                         minimum speculative decoding probability (greedy)\n")
    flags = speculative_flags(old)
    assert (flags["n_max"], flags["n_min"], flags["p_min"], flags["type"]) == \
           ("--draft-max", "--draft-min", "--draft-p-min", [])
    with pytest.raises(LlamaCppOutputError, match="cannot set K"):
        speculative_flags("-m, --model FNAME   model path")


def test_chat_text_matches_the_template_without_a_bos():
    class Tok:
        chat_template = "…"
        bos_token = "<s>"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<s><user>{messages[0]['content']}</user><assistant>"

    assert chat_text(Tok(), "hi") == "<user>hi</user><assistant>"
    assert chat_text(SimpleNamespace(chat_template=None), "hi") == "hi"  # no template: the raw prompt


def test_sampling_args():
    assert sampling_args(DecodeConfig(seed=3)) == ["--temp", "0", "--seed", "3"]
    warm = DecodeConfig(sampling=SamplingParams(temperature=0.7, top_k=20, top_p=0.9), seed=None)
    assert sampling_args(warm) == ["--temp", "0.7", "--top-k", "20", "--top-p", "0.9", "--min-p", "0"]


# ---------------------------------------------------------------------------------------------- the comparison


def build(folder: Path, inside_bin: bool = True) -> Path:
    where = folder / "bin" if inside_bin else folder
    where.mkdir(parents=True, exist_ok=True)
    for name in ("llama-bench", "llama-speculative-simple"):
        (where / name).write_text("")
    return folder


def ggufs(tmp_path: Path) -> PairSpec:
    for name in ("draft.gguf", "target.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    return PairSpec(draft=str(tmp_path / "draft.gguf"), target=str(tmp_path / "target.gguf"))


def bench_json(rate: float) -> str:
    return json.dumps([{**json.loads(BENCH_JSON)[0], "avg_ts": rate, "samples_ts": [rate, rate * 0.1, rate * 1.01]}])


def spec_stderr(tokens: int, seconds: float, drafted: int, accepted: int) -> str:
    """The captured summary with other numbers in it."""
    text = re.sub(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds",
                  f"decoded {tokens:4d} tokens in {seconds:8.3f} seconds", SPEC_STDERR)
    text = re.sub(r"n_drafted = \d+", f"n_drafted = {drafted}", text)
    return re.sub(r"n_accept  = \d+", f"n_accept  = {accepted}", text)


class FakeRun:
    """Answers each binary with captured output; records every call."""

    def __init__(self, spec_outputs):
        self.calls, self.spec_outputs = [], list(spec_outputs)

    def __call__(self, cmd, **kw):
        self.calls.append((cmd, kw))
        name, args = Path(cmd[0]).name, cmd[1:]
        if args == ["--version"]:
            return SimpleNamespace(stdout="", stderr=VERSION)
        if args == ["--help"]:
            return SimpleNamespace(stdout=SPEC_HELP, stderr="")
        if name == "llama-bench":
            model = args[args.index("-m") + 1]
            return SimpleNamespace(stdout=bench_json(20.0 if model.endswith("target.gguf") else 50.0), stderr="")
        return SimpleNamespace(stdout=SPEC_STDOUT, stderr=self.spec_outputs.pop(0))


def test_compare_builds_the_commands_and_aggregates_ratio_of_totals(tmp_path):
    folder, spec = build(tmp_path / "build"), ggufs(tmp_path)
    prompts = [BenchPrompt("a", "first prompt", "code"), BenchPrompt("b", "second prompt", "json")]
    config = DecodeConfig(k=5, max_new_tokens=24, seed=0)  # adaptive 'confidence' at 0.4 by default
    run = FakeRun([spec_stderr(36, 1.0, 32, 28), spec_stderr(20, 3.0, 40, 10)])
    statuses = []
    out = compare_llamacpp(folder, spec, prompts, config, status=statuses.append, run=run, threads=3,
                           chat=lambda p: f"<user>{p}<assistant>\n")
    target, draft = str(tmp_path / "target.gguf"), str(tmp_path / "draft.gguf")
    bench_cmds = [c for c, _ in run.calls if Path(c[0]).name == "llama-bench" and "-m" in c]
    assert [c[1:] for c in bench_cmds] == [
        ["-m", m, "-p", "0", "-n", "24", "-t", "3", "-r", "3", "-o", "json"] for m in (target, draft)]
    spec_cmds = [c for c, _ in run.calls if Path(c[0]).name == "llama-speculative-simple" and "-m" in c]
    assert len(spec_cmds) == 2
    first = spec_cmds[0]
    assert first[first.index("-m") + 1] == target and first[first.index("-md") + 1] == draft
    assert first[first.index("-p") + 1] == "<user>first prompt<assistant>\n"
    for flag, value in (("-n", "24"), ("--spec-draft-n-max", "5"), ("--spec-draft-n-min", "0"),
                        ("--spec-draft-p-min", "0.4"), ("--spec-type", "draft-simple"), ("--temp", "0"),
                        ("-t", "3"), ("--seed", "0")):
        assert first[first.index(flag) + 1] == value, flag
    assert "--no-escape" in first
    assert all(kw["timeout"] and kw["check"] for _, kw in run.calls)

    assert out["target_tokens_per_s"] == 20.0 and out["draft_tokens_per_s"] == 50.0
    assert out["c"] == pytest.approx(20 / 50)  # draft step / target step
    assert out["spec_tokens_per_s"] == pytest.approx(56 / 4.0)  # sum tokens / sum seconds, not the mean of rates
    assert out["spec_over_target"] == pytest.approx(56 / 4.0 / 20)
    assert out["acceptance"] == pytest.approx(38 / 72)
    assert out["k"] == 5 and out["threads"] == 3 and out["prompts"] == 2 and out["p_min"] == 0.4
    assert [(r["id"], r["kind"], r["tokens"], r["drafted"], r["accepted"]) for r in out["runs"]] == \
           [("a", "code", 36, 32, 28), ("b", "json", 20, 40, 10)]
    assert out["runs"][1]["tokens_per_s"] == pytest.approx(20 / 3.0)
    assert out["files"] == {"target": target, "draft": draft}
    assert len(out["commands"]) == 4 and out["commands"][0].startswith(str(folder / "bin" / "llama-bench"))
    assert out["build"] == f"{folder}, version 0.5.0-dev, build 0, commit unknown"
    assert len(statuses) == 4
    # the table prints it
    from specviz.bench.table import anchor_lines

    assert "speculative (K = 5) 14.00 tok/s = 0.70x" in anchor_lines(None, out)[0]


def test_fixed_k_drafts_every_token(tmp_path):
    run = FakeRun([SPEC_STDERR])
    compare_llamacpp(build(tmp_path / "b", inside_bin=False), ggufs(tmp_path), [BenchPrompt("a", "x")],
                     DecodeConfig(k=4, adaptive="fixed"), run=run, threads=2, chat=str)
    cmd = run.calls[-1][0]
    assert cmd[cmd.index("--spec-draft-p-min") + 1] == "0"


def test_binaries_in_the_folder_or_its_bin(tmp_path):
    assert binaries(build(tmp_path / "a")) == tmp_path / "a" / "bin"
    assert binaries(build(tmp_path / "b", inside_bin=False)) == tmp_path / "b"
    assert binaries(build(tmp_path / "c") / "bin") == tmp_path / "c" / "bin"


def test_a_missing_binary_is_one_sentence(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-bench").write_text("")
    with pytest.raises(SystemExit) as e:
        compare_llamacpp(tmp_path, ggufs(tmp_path), [], DecodeConfig(), run=FakeRun([]), threads=1, chat=str)
    message = str(e.value)
    assert "llama-speculative-simple" in message and "llama-bench or" not in message
    assert "scripts/build_llamacpp.sh" in message and one_sentence(message)
    with pytest.raises(SystemExit, match="has no llama-bench or llama-speculative-simple"):
        binaries(tmp_path / "nowhere")


@pytest.mark.parametrize("target,draft", [("Qwen/Qwen2.5-0.5B-Instruct", None), ("TARGET", "tiny"), ("TARGET", None)])
def test_a_model_without_a_gguf_file_is_one_sentence(tmp_path, target, draft):
    spec = ggufs(tmp_path)
    spec = PairSpec(target=spec.target if target == "TARGET" else target, draft=draft)
    run = FakeRun([])
    with pytest.raises(SystemExit) as e:
        compare_llamacpp(build(tmp_path / "build"), spec, [], DecodeConfig(), run=run, threads=1, chat=str)
    message = str(e.value)
    assert "llama.cpp needs GGUF files" in message and "--draft/--target FILE.gguf" in message
    assert one_sentence(message) and run.calls == []  # nothing ran


def test_a_missing_gguf_file(tmp_path):
    spec = PairSpec(target=str(tmp_path / "gone.gguf"), draft=str(tmp_path / "gone.gguf"))
    with pytest.raises(SystemExit, match="does not exist"):
        compare_llamacpp(build(tmp_path / "build"), spec, [], DecodeConfig(), run=FakeRun([]), threads=1, chat=str)


def test_unreadable_output_and_failures_end_in_one_sentence(tmp_path):
    folder, spec, prompts = build(tmp_path / "build"), ggufs(tmp_path), [BenchPrompt("a", "x")]
    with pytest.raises(SystemExit) as e:
        compare_llamacpp(folder, spec, prompts, DecodeConfig(), run=FakeRun(["no summary here"]), threads=1, chat=str)
    assert str(e.value).startswith("specviz bench: --compare-llamacpp: llama-speculative-simple's output has no")

    def failing(cmd, **kw):
        if cmd[1:] in (["--version"], ["--help"]):
            return FakeRun([])(cmd, **kw)
        raise subprocess.CalledProcessError(1, cmd, output="", stderr="loading...\nerror: failed to load model\n")

    with pytest.raises(SystemExit) as e:
        compare_llamacpp(folder, spec, prompts, DecodeConfig(), run=failing, threads=1, chat=str)
    assert str(e.value) == ("specviz bench: --compare-llamacpp: llama-bench failed (exit status 1): "
                            "error: failed to load model.")
