"""The app's handlers on the tiny pair: values in, views out, no browser."""

from __future__ import annotations

import time

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pytest

from specviz.api import endpoints as api
from specviz.engine import DecodeConfig, speculative_generate
from specviz.models import ModelLoadError, PairSpec, encode_prompt
from specviz.models.tiny import tiny_pair
from specviz.runs import trace as tracefile
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace
from specviz.runs.replay import shipped_dir, shipped_traces
from specviz.serving.session import Session
from specviz.runs.trace import Trace
from specviz.ui import decode, distribution, exports, figures, live, pair, replay
from specviz.ui.decode import main_view
from specviz.ui.handlers import Options

from helpers import NO_WAIT

PROMPT = "the man said that it was good and"
FAST = Options(Pace(0.0, 0.0, NO_WAIT))
SHIPPED = "trace_embedded_code.json"
CONFIG = DecodeConfig(k=4, max_new_tokens=24, adaptive="fixed")  # what `settings()` asks for


@pytest.fixture(scope="module")
def session(tiny):
    return Session(tiny, PairSpec("tiny", "tiny", draft_quant="none"))


def settings(**kw) -> dict:
    return {"k": 4, "max_new_tokens": 24, "adaptive": "fixed", **kw}


def test_run_streams_one_view_per_round_and_matches_the_engine(session, tiny):
    views = list(decode.run(session, Limits(), PROMPT, settings(), options=FAST))
    record = views[-1].record
    expected = list(speculative_generate(tiny, encode_prompt(tiny.tokenizer, PROMPT),
                                         CONFIG))
    assert len(views) == len(expected) + 1  # an empty view first, then one per round
    assert [r.new_token_ids for r in record.rounds] == [r.new_token_ids for r in expected]
    last = views[-1]
    assert last.tokens.count("sv-round") == len(expected)
    assert "sv-accepted" in last.tokens
    assert last.record.rounds[-1].finished == "length"
    assert "Round" in last.caption and "tokens in" in last.stats
    assert len(last.pq.data) >= 1 and last.rounds["maximum"] >= len(expected)
    assert [v.record is record for v in views] == [True] * len(views)


def test_stop_mid_run_releases_the_pair_and_the_next_run_is_correct(session, tiny):
    views = decode.run(session, Limits(), PROMPT, settings(max_new_tokens=40), options=FAST)
    for _ in range(3):
        next(views)
    assert session.lock.locked()  # the run holds the pair
    views.close()  # what Gradio does when Stop cancels the event
    assert not session.lock.locked()
    again = list(decode.run(session, Limits(), PROMPT, settings(), options=FAST))[-1].record
    expected = list(speculative_generate(tiny, encode_prompt(tiny.tokenizer, PROMPT),
                                         CONFIG))
    assert [r.new_token_ids for r in again.rounds] == [r.new_token_ids for r in expected]


def test_browsing_a_round_and_a_position(session):
    record = list(decode.run(session, Limits(), PROMPT, settings(), options=FAST))[-1].record
    view = decode.browse(record, 1)
    assert view.rounds["value"] == 1 and "Round 1" in view.caption
    fig = decode.pick_position(record, 1, 0)
    assert len(fig.data) == 3  # q, p and residual of the first drafted token


def test_step_mode_advances_one_round_per_call_in_three_stages(session, tiny):
    stepper = None
    for n in (1, 2, 3):
        stages = list(decode.step(session, Limits(), stepper, PROMPT, settings(), options=FAST))
        assert len(stages) == 3
        (first, _), (_, _), (done, stepper) = stages
        assert len(stepper.trace.rounds) == n
        assert "sv-drafted" in first.tokens and "next, the target checks" in first.caption
        assert "Net:" in done.caption and "sv-drafted" not in done.tokens
    expected = list(speculative_generate(tiny, encode_prompt(tiny.tokenizer, PROMPT),
                                         CONFIG))[:3]
    assert [r.new_token_ids for r in stepper.trace.rounds] == [r.new_token_ids for r in expected]
    restarted = list(decode.step(session, Limits(), stepper, PROMPT + " then", settings(), options=FAST))[-1][1]
    assert restarted is not stepper and len(restarted.trace.rounds) == 1


def test_live_yields_both_lanes_with_growing_clocks_and_a_final_speedup(session):
    updates = list(live.live(session, Limits(), PROMPT, settings(), options=FAST))
    assert all(u.race is None for u in updates[:-1])  # the detail tabs are filled once, at the end
    final = updates[-1].race
    assert "× faster" in updates[-1].live.speed or "× slower" in updates[-1].live.speed
    assert 'id="sv-lane-ar"' in final.ar and 'id="sv-lane-spec"' in final.spec
    assert "sv-elapsed" in final.ar and "sv-elapsed" in final.spec
    assert "finished" in final.ar and "finished" in final.spec
    assert "Speculative decoding:" in final.result and "identical" in final.result  # fp32 greedy: same text
    assert final.record.ar_steps and final.record.rounds
    counts = [int(u.live.ar.split(" tokens · ")[0].rsplit(">", 1)[1]) for u in updates]
    assert counts == sorted(counts) and counts[-1] == 24
    assert updates[-1].main.record == final.record  # the Decode tab shows the race's rounds


def test_api_race_reports_speedup_from_lane_clocks(session):
    final = list(api.race_stream(session, Limits(), {"prompt": PROMPT, **settings()}, FAST.pace))[-1]
    assert final["event"] == "done" and final["identical"] is True
    ar, spec = final["ar"], final["spec"]
    assert final["speedup"] == pytest.approx(spec["tokens_per_s"] / ar["tokens_per_s"])
    assert final["stats"]["measured"] == pytest.approx(final["speedup"])


def test_successive_races_alternate_which_lane_takes_the_first_step(tiny):
    from specviz.runs.race import race

    fresh = Session(tiny, PairSpec("tiny", "tiny", draft_quant="none"))
    firsts = []
    for _ in range(4):
        states = race(fresh, Limits(), PROMPT, settings(max_new_tokens=4))
        first = next(states)
        firsts.append("ar" if first.ar.tokens else "spec")
        states.close()
    assert firsts == ["spec", "ar", "spec", "ar"]


@pytest.fixture(scope="module")
def compared(session):
    """One same-distribution request (40 paths a side): its views, the typed result behind each view, and every
    path each sampler drew (a spy on the two samplers' path functions)."""
    from specviz.runs import proof

    drawn, results = {"spec": [], "ar": []}, []

    def spy(side, path):
        def recorded(*args, **kwargs):
            tokens, swept = path(*args, **kwargs)
            drawn[side].append(list(tokens))
            return tokens, swept
        return recorded

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(proof, "speculative_path", spy("spec", proof.speculative_path))
        mp.setattr(proof, "target_path", spy("ar", proof.target_path))
        mp.setattr(distribution, "distribution_view",
                   lambda r, view=distribution.distribution_view: results.append(r) or view(r))
        views = list(distribution.same_distribution(session, Limits(), PROMPT, settings(),
                                                    {"samples": 40, "temperature": 1.0}))
    return views, results, drawn


def recomputed(tiny, drawn: dict, t: int) -> dict:
    """Position t (0-based) from the drawn paths alone. The exact conditional before each token is the target's
    softmax (temperature 1, no warps) after the prompt and the path so far, from one plain forward. Per side:
    the paths that reached t, their token counts, their exact conditionals summed, the total variation."""
    import torch

    ids = encode_prompt(tiny.tokenizer, PROMPT)
    out = {}
    for side, paths in drawn.items():
        reached = [x for x in paths if len(x) > t]  # a path that ended at <eos> has no token t
        counts = Counter(x[t] for x in reached)
        with torch.inference_mode():
            expected = sum(torch.softmax(tiny.target(torch.tensor([ids + x[:t]])).logits[0, -1].double(), -1)
                           for x in reached)
        observed = torch.zeros_like(expected)
        for token, n in counts.items():
            observed[token] = n
        out[side] = (len(reached), counts, expected, 0.5 * (expected - observed).abs().sum().item() / len(reached))
    return out


def test_same_distribution_compares_both_samplers_with_the_exact_distribution(session, tiny, compared):
    import torch

    views, results, drawn = compared
    last = views[-1]
    assert "40 speculative and 40 target-alone continuations" in last.summary and "sampling…" not in last.summary
    assert "sampling…" in views[0].summary and len(views) == 3  # a view per batch of 16 paths each
    assert [t.name for t in last.fig.data] == ["exact p (target)", "target alone (n=40)", "speculative (n=40)",
                                               "total variation", figures.CHANCE] * 3
    assert all(sum(t.y) <= 1.0 + 1e-6 for t in last.fig.data if t.name not in ("total variation", figures.CHANCE))
    assert [f"\n| {i} |" in last.summary for i in (1, 2, 3, 4)] == [True] * 3 + [False]  # a row per position
    assert "Whole path" in last.summary
    assert len(drawn["spec"]) == len(drawn["ar"]) == 40 and len(results) == len(views)
    assert len(results[-1].positions) == 3
    with torch.inference_mode():  # before token 1: the target's own distribution after the prompt
        first = torch.softmax(tiny.target(torch.tensor([encode_prompt(tiny.tokenizer, PROMPT)])).logits[0, -1], -1)
    for t, c in enumerate(results[-1].positions):
        mine = recomputed(tiny, drawn, t)
        (n_spec, spec_counts, spec_exp, tv_spec), (n_ar, ar_counts, ar_exp, tv_ar) = mine["spec"], mine["ar"]
        assert sum(spec_counts.values()) == n_spec and sum(ar_counts.values()) == n_ar
        pooled = (spec_exp + ar_exp) / (n_spec + n_ar)  # both samplers' samples, weighted by their counts
        if t == 0:
            assert n_spec == n_ar == 40 and c.exact == pytest.approx([first[x].item() for x in c.token_ids], abs=1e-6)
        assert (c.position, c.stats_spec.n, c.stats_ar.n) == (t + 1, n_spec, n_ar)
        assert len(c.token_ids) == 12 and c.exact == sorted(c.exact, reverse=True)  # the likeliest first
        assert c.exact == pytest.approx([pooled[x].item() for x in c.token_ids], abs=1e-6)
        assert c.spec == [spec_counts[x] / n_spec for x in c.token_ids]
        assert c.ar == [ar_counts[x] / n_ar for x in c.token_ids]
        assert (c.stats_spec.tv, c.stats_ar.tv) == pytest.approx((tv_spec, tv_ar), abs=1e-6)
        # what is shown: the bars are these shares, the table's row these distances
        exact_bars, ar_bars, spec_bars, tvs, _ = last.fig.data[5 * t:5 * t + 5]
        assert list(exact_bars.y) == c.exact and list(ar_bars.y) == c.ar and list(spec_bars.y) == c.spec
        assert list(tvs.y) == pytest.approx([tv_ar, tv_spec], abs=1e-6)
        assert f"\n| {t + 1} | {tv_ar:.3f} · {tv_spec:.3f} |" in last.summary
    with pytest.raises(gr.Error, match="temperature above 0"):
        list(distribution.same_distribution(session, Limits(), PROMPT, settings(), {"samples": 40, "temperature": 0.0}))
    with pytest.raises(gr.Error, match="samples"):
        list(distribution.same_distribution(session, Limits(max_samples=10), PROMPT, settings(),
                                 {"samples": 40, "temperature": 1.0}))


def test_same_distribution_shows_the_likeliest_tokens_pooled_over_both_samplers(tiny, compared):
    _, results, drawn = compared
    for t, c in enumerate(results[-1].positions):
        mine = recomputed(tiny, drawn, t)
        pooled = (mine["spec"][2] + mine["ar"][2]) / (mine["spec"][0] + mine["ar"][0])
        assert c.token_ids == pooled.argsort(descending=True)[:12].tolist(), t + 1


def test_export_then_replay_gives_back_the_same_rounds(session, tmp_path):
    record = list(decode.run(session, Limits(), PROMPT, settings(), options=FAST))[-1].record
    path = exports.export(record, replace(FAST, trace_dir=tmp_path))
    assert Path(path).parent == tmp_path
    replayed = list(replay.replay_rounds(path, None, 0, options=FAST))
    assert [r.new_token_ids for r in replayed[-1].record.rounds] == [r.new_token_ids for r in record.rounds]
    assert replayed[-1].tokens == main_view(record).tokens


def test_replay_of_the_shipped_trace_needs_no_models():
    assert SHIPPED in shipped_traces()
    t = tracefile.load(shipped_dir() / SHIPPED)
    views = list(replay.replay_rounds(None, SHIPPED, 0, options=FAST))
    assert len(views) == len(t.rounds) + 1
    assert views[-1].record.rounds[-1].text == t.rounds[-1].text
    assert [v.tokens for v in views] == [main_view(replace(t, rounds=t.rounds[:n])).tokens for n in range(len(views))]
    # paced like a live run: an instant replay shows its start and its end, not every round in between. The
    # interval is one no replay reaches, so a loaded machine (CI's) cannot show a round between (it did at 0.15 s)
    paced = list(replay.replay_rounds(None, SHIPPED, 0, options=Options(Pace(min_interval=3600.0))))
    assert len(paced) == 2 and paced[-1].tokens == views[-1].tokens
    race = list(replay.replay_race(None, SHIPPED, 0))[-1]
    assert "finished" in race.ar and "finished" in race.spec and "×" in race.result
    messages = list(api.replay(SHIPPED))
    assert messages[-1]["event"] == "done" and messages[-1]["race"]["speedup"] > 0
    assert len(messages) == len(t.rounds) + 1


def test_replay_reads_only_uploads_and_shipped_traces(tmp_path):
    with pytest.raises(gr.Error, match="not one of the shipped traces"):
        list(replay.replay_rounds(None, "../pyproject.toml", 0))
    with pytest.raises(gr.Error, match="not one of the shipped traces"):
        list(api.replay("/etc/passwd"))
    bogus = tmp_path / "not_a_trace.json"
    bogus.write_text(json.dumps({"hello": 1}))
    with pytest.raises(gr.Error, match="not a specviz trace"):
        list(replay.replay_rounds(str(bogus), None, 0))
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\xff\x00not json")
    with pytest.raises(gr.Error, match="could not read a trace"):
        list(replay.replay_rounds(str(garbage), None, 0))
    with pytest.raises(gr.Error, match="choose a shipped trace"):
        list(replay.replay_rounds(None, None, 0))


@pytest.mark.parametrize("prompt, kw, message", [
    ("", {}, "prompt is empty"),
    ("   \n", {}, "prompt is empty"),
    ("x" * 9000, {}, "characters"),
    (PROMPT, {"k": 0}, "K must be"),
    (PROMPT, {"k": 99}, "K must be"),
    (PROMPT, {"max_new_tokens": 0}, "max new tokens"),
    (PROMPT, {"temperature": -1}, "temperature"),
    (PROMPT, {"temperature": float("nan")}, "finite"),
    (PROMPT, {"top_p": 0}, "top-p"),
    (PROMPT, {"top_k": -3}, "top-k"),
    (PROMPT, {"seed": 1.5}, "whole number"),
    (PROMPT, {"drafter": "oracle"}, "drafter"),
    (PROMPT, {"adaptive": "sometimes"}, "adaptive"),
])
def test_bad_input_is_one_clear_gr_error(session, prompt, kw, message):
    for handler in (decode.run, live.live):
        with pytest.raises(gr.Error, match=message):
            list(handler(session, Limits(), prompt, settings(**kw), options=FAST))
    with pytest.raises(gr.Error, match=message):
        list(api.generate(session, Limits(), {"prompt": prompt, **settings(**kw)}))


def test_prompt_over_the_token_limit(session):
    with pytest.raises(gr.Error, match="tokens long"):
        list(decode.run(session, Limits(max_prompt_tokens=3), PROMPT, settings(), options=FAST))


def test_a_session_without_a_pair_says_so():
    with pytest.raises(gr.Error, match="no model pair is loaded"):
        list(decode.run(Session(), Limits(), PROMPT, settings(), options=FAST))


def test_loading_streams_status_and_a_failed_load_keeps_the_served_pair():
    calls = []

    def loader(draft, target, *, status, **kw):
        calls.append((draft, target))
        if target == "missing/model":
            raise ModelLoadError("could not load 'missing/model' from the model hub.")
        status(f"Loading {target}…")
        return tiny_pair()

    s = Session(tiny_pair(), PairSpec("tiny", "tiny", draft_quant="none"), loader=loader, allow_switch=True)
    before = s.generation
    lines = list(pair.load_models(s, "tiny", "tiny-2", "float32"))
    assert "Loading tiny-2…" in lines[0] and "Loaded" in lines[-1]
    assert s.spec.target == "tiny-2" and s.spec.dtype == "float32" and s.generation == before + 1
    with pytest.raises(gr.Error, match="model hub.*now serving: tiny-draft"):
        list(pair.load_models(s, "tiny", "missing/model", "auto"))
    assert calls[-1] == ("tiny", "missing/model") and s.spec.target == "tiny-2"  # the served pair stayed: no reload
    with pytest.raises(gr.Error, match="target model is empty"):
        list(pair.load_models(s, "tiny", "  ", "auto"))
    with pytest.raises(gr.Error, match="dtype"):
        list(pair.load_models(s, "tiny", "tiny", "float8"))


def test_a_locked_down_session_serves_only_presets():
    s = Session(tiny_pair(), PairSpec("tiny", "tiny"), loader=lambda *a, **k: tiny_pair(), allow_any_model=False,
                allow_switch=True)
    with pytest.raises(gr.Error, match="only serves its preset"):
        list(pair.load_models(s, "some/draft", "some/target", "auto"))
    assert s.allowed("tiny", "tiny") and s.allowed("embedded", "embedded")


def test_the_lookup_drafter_is_required_without_a_draft_model(tiny):
    target_only = replace(tiny, draft=None)
    s = Session(target_only, PairSpec(None, "tiny"))
    with pytest.raises(gr.Error, match="no draft model"):
        list(decode.run(s, Limits(), PROMPT, settings(drafter="model"), options=FAST))
    views = list(decode.run(s, Limits(), PROMPT + " the man said", settings(drafter="lookup"), options=FAST))
    assert views[-1].record.rounds[-1].drafter == "lookup"


def test_a_served_int4_draft_is_named_kept_across_loads_and_decodes_what_the_target_decodes():
    from specviz.cli import build_parser
    from specviz.engine import autoregressive_generate
    from specviz.models.draft.lean import LeanDraft

    assert build_parser().parse_args(["serve"]).draft_quant == "int4"  # the CPU demo's default
    # eager steps: a compiled step, where measured faster, would run the loaded draft instead of the int4 one
    s = Session(spec=PairSpec("tiny", "tiny", draft_quant="int4", step="eager"), loader=lambda *a, **k: tiny_pair(),
                allow_switch=True)
    lines = list(pair.load_models(s, "tiny", "tiny", "float32"))
    assert isinstance(s.pair.draft, LeanDraft) and "[int4 draft step]" in s.name and "int4" in lines[-1]
    views = list(decode.run(s, Limits(), PROMPT, settings(), options=FAST))
    prompt = encode_prompt(s.pair.tokenizer, PROMPT)
    ar = [step.token.id for step in autoregressive_generate(s.pair, prompt, CONFIG)]
    assert [t for r in views[-1].record.rounds for t in r.new_token_ids] == ar  # greedy: the target's tokens
    list(pair.load_models(s, "tiny", "tiny-2", "float32"))  # a pair picked in the UI keeps the server's setting
    assert isinstance(s.pair.draft, LeanDraft)
    plain = Session(spec=PairSpec("tiny", "tiny", draft_quant="none"), loader=lambda *a, **k: tiny_pair(),
                    allow_switch=True)
    list(pair.load_models(plain, "tiny", "tiny", "float32"))
    assert not isinstance(plain.pair.draft, LeanDraft) and "int4" not in plain.name


def test_a_teacher_switches_the_targets_precision_and_both_lanes_run_that_target():
    """'GPU-like: a float target' against 'CPU-engine-like: an int4 target', from the pair panel."""
    from specviz.engine import autoregressive_generate

    s = Session(spec=PairSpec("tiny", "tiny", draft_quant="none"), loader=lambda *a, **k: tiny_pair(),
                allow_switch=True)
    lines = list(pair.load_models(s, "tiny", "tiny", "float32", "int4"))
    assert "[int4 weights]" in s.name and "int4" in lines[-1] and s.spec.target_quant == "int4"
    views = list(decode.run(s, Limits(), PROMPT, settings(), options=FAST))
    ar = [step.token.id for step in autoregressive_generate(s.pair, encode_prompt(s.pair.tokenizer, PROMPT), CONFIG)]
    assert [t for r in views[-1].record.rounds for t in r.new_token_ids] == ar
    list(pair.load_models(s, "tiny", "tiny", "float32", "none"))
    assert "weights]" not in s.name
    with pytest.raises(gr.Error, match="target precision"):
        list(pair.load_models(s, "tiny", "tiny", "float32", "int3"))


def test_a_race_replaces_the_decode_record_only_when_it_is_done(session):
    updates = list(live.live(session, Limits(), PROMPT, settings(), options=FAST))
    assert [u.race is not None and isinstance(u.race.record, Trace) for u in updates] == \
        [False] * (len(updates) - 1) + [True]
    stopped = live.live(session, Limits(), PROMPT, settings(max_new_tokens=40), options=FAST)
    early = [next(stopped) for _ in range(3)]
    stopped.close()  # Stop: the Decode tab keeps its last run's record
    assert not any(u.race is not None for u in early)


def test_share_writes_the_last_run_as_one_html_page(session, tmp_path):
    record = list(live.live(session, Limits(), PROMPT, settings(), options=FAST))[-1].race.record
    path = Path(exports.export(record, replace(FAST, trace_dir=tmp_path), html=True))
    assert path.suffix == ".html" and path.parent == tmp_path
    assert path.read_text().count('class="sv-round') == len(record.rounds)


def test_two_exports_in_the_same_second_get_their_own_files(session, tmp_path, monkeypatch):
    record = list(decode.run(session, Limits(), PROMPT, settings(max_new_tokens=8), options=FAST))[-1].record
    monkeypatch.setattr(exports.time, "strftime", lambda *a: "20250101-000000")
    first, second = (exports.export(record, replace(FAST, trace_dir=tmp_path)) for _ in range(2))
    assert first != second and Path(first).exists() and Path(second).exists()


def test_exports_older_than_an_hour_are_swept_from_the_shared_folder(session, tmp_path):
    import os

    record = list(decode.run(session, Limits(), PROMPT, settings(max_new_tokens=8), options=FAST))[-1].record
    old, recent, other = tmp_path / "specviz-run-old.json", tmp_path / "specviz-run-recent.html", tmp_path / "notes.txt"
    for f in (old, recent, other):
        f.write_text("x")
    two_hours_ago = time.time() - 2 * exports.EXPORT_MAX_AGE
    os.utime(old, (two_hours_ago, two_hours_ago))
    os.utime(other, (two_hours_ago, two_hours_ago))
    path = exports.export(record, replace(FAST, trace_dir=tmp_path), html=True)
    assert not old.exists() and recent.exists() and Path(path).exists()
    assert other.exists()  # only specviz's own exports are touched


def test_the_app_is_offline_and_every_decode_resets_step_mode(monkeypatch):
    from specviz.ui.app import build_app

    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)  # conftest's switch; the app must not need it
    demo = build_app(Session(), Limits(), FAST)
    assert demo.analytics_enabled is False  # no telemetry, no version check calling home
    assert demo.delete_cache == (3600, 3600)  # Gradio's copies of exports go after an hour, like ours
    prompt = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-prompt")
    run_btn = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-run")
    for trigger in ((run_btn._id, "click"), (prompt._id, "submit")):
        fns = [f.fn for f in demo.fns.values() if trigger in f.targets]
        assert decode.reset_step in fns, trigger
