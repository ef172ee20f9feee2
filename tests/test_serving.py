"""Serving a room: the pair fixed unless the operator allows switching, loads that cannot take the server
down, a time budget on every request holding the model, bounded memory per visitor, replays that cost
O(rounds) and wait in a queue of their own, and races that say when another job shared the CPU.

On the tiny pair, in-process; the load test with many users is tests/test_loadtest.py.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import NO_WAIT, slow_target
from transformers import Qwen2Config

from specviz.api import messages
from specviz.cli import build_parser
from specviz.engine import DecodeConfig, speculative_generate
from specviz.models import ModelLoadError, PairSpec, encode_prompt
from specviz.models.memory import check_fits, parameter_count, weights_bytes
from specviz.models.tiny import tiny_model, tiny_pair
from specviz.runs import decode as decoding
from specviz.runs import race as racing
from specviz.runs import replay as replays
from specviz.runs.distribution import FULL_SAMPLES_UP_TO, sample_distribution, samples_for
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits, budget
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.server import build_server
from specviz.ui import handlers as h
from specviz.ui import decode as ui_decode
from specviz.ui import exports as ui_exports
from specviz.ui import replay as ui_replay
from specviz.ui import render
from specviz.ui.decode import main_view
from specviz.ui.race import race_view

PROMPT = "the man said that it was good and"
FAST = h.Options(Pace(0.0, 0.0, NO_WAIT))
SETTINGS = {"k": 4, "max_new_tokens": 40, "adaptive": "fixed"}
SHIPPED = "trace_embedded_code.json"


def tiny_session(**kw) -> Session:
    return Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), **kw)


# ------------------------------------------------------------------ the pair is the operator's choice


def test_by_default_the_pair_is_fixed_no_menu_no_endpoint_and_a_switch_is_refused():
    session = tiny_session()
    demo = build_server(session, Limits(), FAST)
    names = {fn.api_name for fn in demo.fns.values()}
    assert "load_pair" not in names and {"generate", "race", "replay"} <= names
    assert not [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-load"]
    with pytest.raises(InputError, match="fixed by its operator.*--allow-pair-switch"):
        session.switch("tiny", "tiny", "float32")
    assert build_parser().parse_args(["serve"]).allow_pair_switch is False
    assert build_parser().parse_args(["serve", "--allow-pair-switch"]).allow_pair_switch is True
    switching = build_server(tiny_session(allow_switch=True), Limits(), FAST)
    assert "load_pair" in {fn.api_name for fn in switching.fns.values()}
    assert [b for b in switching.blocks.values() if getattr(b, "elem_id", None) == "sv-load"]


def big_config_folder(tmp_path):
    """A 7B-class config and no weights: what a preset meant for a GPU looks like before it is loaded."""
    folder = tmp_path / "big"
    Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False).save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def test_the_weights_memory_is_estimated_from_the_config_alone(tmp_path):
    model = tiny_model(0, 64)
    model.save_pretrained(tmp_path / "small")
    assert parameter_count(str(tmp_path / "small"), "target") == sum(p.numel() for p in model.parameters())
    count = parameter_count(str(big_config_folder(tmp_path)), "target")
    assert 7.0e9 < count < 7.8e9  # Qwen2.5-7B has 7.6 billion parameters
    need, dtype = weights_bytes(PairSpec(None, str(tmp_path / "big"), device="cpu", dtype="float32",
                                         kernels="plain"))
    assert need == count * 4 and str(dtype) == "torch.float32"
    need16, _ = weights_bytes(PairSpec(None, str(tmp_path / "big"), device="cpu", dtype="bfloat16", kernels="plain"))
    assert need16 == count * 2
    assert parameter_count("tiny", "target") is None and parameter_count(str(tmp_path / "nothing"), "x") is None


def test_a_pair_too_big_for_memory_is_refused_before_loading_and_the_served_pair_stays(tmp_path):
    big = str(big_config_folder(tmp_path))
    loads = []
    session = tiny_session(allow_switch=True, loader=lambda *a, **k: loads.append(a) or tiny_pair(),
                           fits=lambda spec: check_fits(spec, available=lambda device: 24 * 10**9))
    served = session.pair
    with pytest.raises(ModelLoadError, match=r"needs about 60\.\d GB for its weights in float32 and cpu has 24\.0 GB "
                                             r"free: pick a smaller pair or a lower-precision dtype.*now serving: tiny"):
        session.switch(None, big, "float32")
    assert loads == [] and session.pair is served  # nothing was loaded, nothing released
    session.fits = lambda spec: check_fits(spec, available=lambda device: 64 * 10**9)
    session.switch(None, big, "float32")  # fits: the (fake) loader is called
    assert len(loads) == 1


def test_the_new_pair_loads_beside_the_served_one_which_goes_only_after_success():
    seen = []
    session = tiny_session(allow_switch=True)
    old = session.pair

    def loader(*args, **kwargs):
        seen.append(session.pair is not None and session.pair.target is not None)  # the served pair is still there
        if len(seen) == 2:
            raise ModelLoadError("could not load broken/model.")
        return tiny_pair()

    session.loader = loader
    session.switch("tiny", "tiny", "float32")
    assert seen == [True] and old.target is None and session.pair is not old  # released after the swap
    served = session.pair
    with pytest.raises(ModelLoadError, match="now serving: tiny"):
        session.switch("tiny", "tiny", "bfloat16")
    assert seen == [True, True] and session.pair is served and served.target is not None


# ------------------------------------------------------------------ budgets


def test_a_budget_counts_from_its_creation():
    now = [100.0]
    stop = budget(5, clock=lambda: now[0])
    assert stop() is None
    now[0] = 104.9
    assert stop() is None
    now[0] = 105.0
    assert stop() == "budget"


def test_a_run_past_its_budget_ends_as_budget_and_keeps_its_rounds(monkeypatch):
    session = tiny_session()
    config = DecodeConfig(**SETTINGS)
    ids = encode_prompt(session.pair.tokenizer, PROMPT)
    unbounded = list(speculative_generate(session.pair, ids, config))  # the same run with no budget
    now = slow_target(session, monkeypatch, decoding, 0.25)
    *_, trace = decoding.decode(session, Limits(max_seconds=1), PROMPT, SETTINGS)
    assert trace.finished == "budget" and len(trace.rounds) == 3
    # the prompt's forward (0.25 s), then one verify forward per round: the 3rd round's ends at 1.0 s, the budget
    assert now[0] == 1.0 and len(unbounded) > 3
    assert all(r.finished is None for r in trace.rounds[:-1])  # ended at the round that crossed the budget
    # those rounds kept, as the run without a budget made them
    assert [r.new_token_ids for r in trace.rounds] == [r.new_token_ids for r in unbounded[:3]]
    assert messages.run_summary(trace)["finished"] == "budget"
    assert not session.lock.locked()


def test_a_race_past_its_budget_ends_both_lanes_as_budget(monkeypatch):
    session = tiny_session()
    slow_target(session, monkeypatch, racing, 0.25)
    *_, state = racing.race(session, Limits(max_seconds=1), PROMPT, SETTINGS)
    assert state.done and (state.ar.finished, state.spec.finished) == ("budget", "budget")
    assert 0 < state.ar.tokens < 40 and 0 < state.spec.tokens < 40
    assert "time budget" in race_view(state).result


def test_same_distribution_past_its_budget_reports_what_it_drew(monkeypatch):
    from specviz.runs import distribution

    session = tiny_session()
    slow_target(session, monkeypatch, distribution, 0.05)
    results = list(sample_distribution(session, Limits(max_seconds=1), PROMPT, {"k": 2},
                                       {"samples": 400, "temperature": 1.0}))
    last = results[-1]
    assert last.done and last.finished == "budget"
    assert 0 < last.spec.samples < 400 and 0 < last.ar.samples < 400
    assert messages.distribution_dict(last)["finished"] == "budget"


def test_same_distribution_samples_shrink_with_the_prompt():
    limits = Limits(max_samples=2000)
    assert samples_for(500, 40, limits) == (500, "")
    assert samples_for(2000, FULL_SAMPLES_UP_TO, limits) == (2000, "")
    n, note = samples_for(2000, 2048, limits)
    assert n == 250 and "2048-token prompt allows at most 250" in note
    assert samples_for(2000, 10**6, limits)[0] == 16  # never fewer than the test needs


# ------------------------------------------------------------------ bounded memory per visitor


def test_paused_step_runs_are_capped_and_expire_and_their_owner_is_told(monkeypatch):
    session = tiny_session()
    limits = Limits(max_paused=2, paused_seconds=60)
    now = [0.0]
    session.clock = lambda: now[0]
    visitors = [decoding.step(session, limits, None, f"{PROMPT} {i}", SETTINGS)[0] for i in range(3)]
    assert len(session.paused) == 2 and visitors[0].evicted and not visitors[1].evicted
    again, r = decoding.step(session, limits, visitors[0], f"{PROMPT} 0", SETTINGS)
    assert "closed to free memory" in again.notice and r.index == 0  # started again, and told why
    assert visitors[1].evicted  # the oldest beyond the cap went in turn
    nxt, r = decoding.step(session, limits, again, f"{PROMPT} 0", SETTINGS)
    assert nxt is again and nxt.notice == "" and r.index == 1
    now[0] = 61.0  # a minute later, one visitor steps: every run idle longer is closed
    decoding.step(session, limits, None, "another visitor", SETTINGS)
    assert visitors[2].evicted and again.evicted and len(session.paused) == 1
    with pytest.warns(UserWarning, match="closed to free memory"):  # gr.Warning: a toast in the browser
        views = list(ui_decode.step(session, limits, again, f"{PROMPT} 0", SETTINGS, options=FAST))
    assert len(views[-1][1].trace.rounds) == 1


def test_a_visitors_exports_are_removed_when_their_session_ends(tmp_path):
    session = tiny_session()
    record = list(ui_decode.run(session, Limits(), PROMPT, SETTINGS, options=FAST))[-1].record
    paths = [ui_exports.export(record, replace(FAST, trace_dir=tmp_path), html=html) for html in (False, True)]
    assert all(Path(p).exists() for p in paths)
    ui_exports.remove_files(paths)
    assert not list(tmp_path.iterdir())
    ui_exports.remove_files(paths)  # already gone: nothing to do, no error


# ------------------------------------------------------------------ replays and the CPU


def test_a_replay_renders_each_round_once(monkeypatch):
    calls = []
    real = render.round_html
    monkeypatch.setattr(render, "round_html", lambda *a, **k: calls.append(1) or real(*a, **k))
    views = list(ui_replay.replay_rounds(None, SHIPPED, 0, options=FAST))
    n = len(views[-1].record.rounds)
    assert len(views) == n + 1 and len(calls) <= 2 * n  # O(rounds); re-rendering every update made n(n+1)/2
    monkeypatch.undo()
    assert views[-1].tokens == main_view(views[-1].record).tokens  # the same page as rendering it at once


def test_rounds_html_starts_over_for_another_run():
    t = replays.open_trace(None, SHIPPED)
    html = render.RoundsHtml()
    html(t.rounds[:5], t.meta.greedy)
    other = [replace(r) for r in t.rounds[:3]]
    assert html(other, t.meta.greedy) == render.rounds_html(other, t.meta.greedy)
    assert html([], True) == render.rounds_html([], True)


def test_replays_wait_in_a_queue_of_their_own():
    demo = build_server(tiny_session(), Limits(), FAST)
    replays_ = [fn for fn in demo.fns.values() if fn.name in ("on_replay", "on_replay_race", "replay_beside", "share")]
    assert len(replays_) == 4
    assert all(fn.concurrency_id == "replay" and fn.concurrency_limit == 1 for fn in replays_)


def test_a_race_notes_a_job_that_shared_the_cpu():
    session = tiny_session()
    settings = {**SETTINGS, "max_new_tokens": 12}
    *_, alone = racing.race(session, Limits(), PROMPT, settings)
    assert alone.shared_cpu is False and messages.race_dict(alone)["cpu_shared"] is False
    states = racing.race(session, Limits(), PROMPT, settings)
    next(states)
    done = threading.Event()

    def replay():
        with session.beside.job():
            list(replays.replay(replays.open_trace(None, SHIPPED), 0))
        done.set()

    threading.Thread(target=replay).start()
    assert done.wait(30)
    *_, shared = states
    assert shared.shared_cpu is True and messages.race_dict(shared)["cpu_shared"] is True
    assert "Another job" in race_view(shared).result and "Another job" not in race_view(alone).result


def test_scoring_with_the_prompt_cache_gives_the_cache_free_distributions(monkeypatch):
    from specviz.engine.exact import path_distributions
    from specviz.engine.plumbing import PromptCache
    from specviz.engine.sampling import SamplingParams
    from specviz.runs import proof

    pair, cache = tiny_pair(), PromptCache()
    prompt, paths = list(range(5, 45)), [[1, 2, 3], [4, 5], [7, 8, 9]]
    for sampling in (SamplingParams(1.0), SamplingParams(0.7, top_p=0.9)):
        plain = path_distributions(pair, prompt, paths, sampling)
        assert (path_distributions(pair, prompt, paths, sampling, cache) - plain).abs().max() < 1e-5
    sizes = []
    monkeypatch.setattr(proof, "path_distributions",
                        lambda p, i, chunk, *a: sizes.append(len(chunk)) or plain[:len(chunk)])
    monkeypatch.setattr(proof, "PROMPT_COPIES", 80)  # a 40-token prompt: two paths' cache copies per forward
    proof.score(pair, prompt, paths, DecodeConfig(sampling=SamplingParams(1.0)), [], None, cache)
    assert sizes == [2, 1]
