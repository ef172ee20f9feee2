"""The what-if calculator against hand-worked numbers: the seeds' 4 x 0.73 example, E(K), the speedup once the
draft is paid, capacity and cost; the CLI's table and JSON; the app's tab, its figure and its pre-fill from a run."""

from __future__ import annotations

import json
import statistics

import gradio as gr
import pytest

from specviz.analysis.whatif import WhatIfInputs, shortcut_note, what_if
from specviz.cli import main
from specviz.engine import DecodeConfig
from specviz.engine.events import ACCEPTED, NOT_VERIFIED
from specviz.models import PairSpec
from specviz.runs import trace as tracefile
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits
from specviz.settings.spec import validate
from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.ui import handlers as h
from specviz.ui import decode as ui_decode
from specviz.ui.whatif import fill, prefill, whatif_view

from helpers import NO_WAIT

# 0.73² = 0.5329, 0.73³ = 0.389017, 0.73⁴ = 0.28398241, 0.73⁵ = 0.2073071593
E_073_4 = 1 + 0.73 + 0.5329 + 0.389017 + 0.28398241  # = 2.93589941 = (1 - 0.2073071593) / 0.27
PROMPT = "the man said that it was good and"


def test_the_seeds_example_shortcut_and_expected_tokens():
    w = what_if(0.73, 4, draft_cost=0.0, target_tokens_per_s=30)
    assert w.shortcut_tokens == pytest.approx(2.92)  # 4 × 0.73
    assert w.shortcut.tokens_per_s == pytest.approx(87.6)  # 30 × 2.92
    assert w.expected_tokens == pytest.approx(2.93589941, abs=1e-9)
    assert w.expected_tokens == pytest.approx((1 - 0.2073071593) / 0.27, abs=1e-9)
    assert w.accepted_drafts == pytest.approx(1.93589941, abs=1e-9)  # not 2.92: a round stops at its first rejection
    assert w.speedup == pytest.approx(E_073_4)  # a free draft and a free verify: speedup = tokens per forward
    assert w.speculative.tokens_per_s == pytest.approx(30 * 2.93589941)


def test_paying_for_the_draft_and_for_verification():
    w = what_if(0.73, 4, draft_cost=0.1, target_tokens_per_s=30)
    assert w.speedup == pytest.approx(2.93589941 / 1.4)  # K·c + R = 0.4 + 1
    assert w.speculative.tokens_per_s == pytest.approx(30 * 2.93589941 / 1.4)  # 62.91, not 87.6
    assert what_if(0.73, 4, 0.1, verify_ratio=1.5).speedup == pytest.approx(2.93589941 / 1.9)


@pytest.mark.parametrize("a", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_expected_tokens_is_the_geometric_sum(a, k):
    assert what_if(a, k, 0.1).expected_tokens == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_the_best_k():
    # a = 0.5, c = 0.1: 1.5/1.1 = 1.364, 1.75/1.2 = 1.458, 1.875/1.3 = 1.442: K = 2
    w = what_if(0.5, 6, 0.1)
    assert w.curve[:3] == pytest.approx((1.5 / 1.1, 1.75 / 1.2, 1.875 / 1.3))
    assert w.best_k == 2
    # a = 0.73, c = 0.1: K = 3 gives 2.651917/1.3 = 2.040, K = 4 2.936/1.4 = 2.097, K = 5 3.143207/1.5 = 2.095
    w = what_if(0.73, 1, 0.1)
    assert w.curve[2:5] == pytest.approx((2.651917 / 1.3, 2.93589941 / 1.4, 3.1432065693 / 1.5))
    assert w.best_k == 4 and len(w.curve) == 16


def test_every_draft_accepted():
    w = what_if(1.0, 4, 0.1)
    assert w.expected_tokens == 5  # K + 1: all four drafts and the bonus
    assert w.speedup == pytest.approx(5 / 1.4)
    assert w.best_k == 16 and w.curve[-1] == pytest.approx(17 / 2.6)  # (K+1)/(Kc+1) grows while c < 1


def test_every_draft_rejected():
    w = what_if(0.0, 4, 0.1)
    assert w.expected_tokens == 1  # the correction alone
    assert w.speedup == pytest.approx(1 / 1.4)  # slower than the target alone
    assert w.best_k == 1


def test_capacity_and_cost_per_million_tokens():
    w = what_if(0.73, 4, 0.1, target_tokens_per_s=30, gpu_hour_price=2.0)
    assert w.target.tokens_per_hour == pytest.approx(108_000)  # 30 × 3600
    assert w.target.usd_per_million == pytest.approx(2 / 0.108)  # $18.52
    assert w.shortcut.usd_per_million == pytest.approx(2 / 0.31536)  # 87.6 × 3600 = 315,360 tokens: $6.34
    spec_per_hour = 30 * 2.93589941 / 1.4 * 3600  # 226,484 tokens
    assert w.speculative.tokens_per_hour == pytest.approx(spec_per_hour)
    assert w.speculative.usd_per_million == pytest.approx(2e6 / spec_per_hour)  # $8.83
    assert what_if(0.73, 4, 0.1, target_tokens_per_s=30).target.usd_per_million is None  # no price, no cost
    assert what_if(0.73, 4, 0.1).target is None  # no speed, no rates


def test_the_shortcut_note_has_this_cases_numbers():
    note = shortcut_note(what_if(0.73, 4, 0.1))
    for part in ("= 1.94 are accepted", "E = 2.94", "K·c + R = 1.40", "2.10×, not 2.92×"):
        assert part in note, part


@pytest.mark.parametrize("bad, word", [(dict(acceptance=1.3), "acceptance"), (dict(k=0), "K"),
                                       (dict(draft_cost=-1), "draft cost"), (dict(verify_ratio=0), "verify"),
                                       (dict(target_tokens_per_s=0), "tokens/s"), (dict(gpu_hour_price=-2), "price")])
def test_bad_inputs_are_named(bad, word):
    given = {"acceptance": 0.73, "k": 4, "draft_cost": 0.1, **bad}
    with pytest.raises(InputError, match=rf"^[^.]*{word}[^.]* must be .*, got -?[\d.]+\.$"):  # the spec's one sentence
        validate(WhatIfInputs, given)
    with pytest.raises(ValueError, match=list(bad)[0]):  # built directly, the calculator refuses it too
        what_if(**given)


ARGS = ["whatif", "--acceptance", "0.73", "--k", "4", "--draft-cost", "0.1"]


def test_cli_prints_the_table_and_the_arithmetic(capsys):
    assert main([*ARGS, "--target-tokens-per-s", "30", "--gpu-hour-price", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line.split()[-3:] for line in out.splitlines()}
    assert rows["tokens/s"] == ["30.0", "87.6", "62.9"]
    assert rows["$ per million tokens"] == ["18.52", "6.34", "8.83"]
    assert "4 × 0.73 = 2.92 tokens per target step → 30.0 × 2.92 = 87.6 tokens/s" in out
    assert "(1 − 0.73^5) / 0.27 = 2.94" in out and "Best K" in out


def test_cli_json_and_the_step_time(capsys):
    assert main([*ARGS, "--target-step-ms", "50", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["expected_tokens"] == pytest.approx(2.93589941) and d["best_k"] == 4
    assert d["target"]["tokens_per_s"] == pytest.approx(20)  # 1000 / 50 ms
    assert d["speculative"]["tokens_per_s"] == pytest.approx(20 * 2.93589941 / 1.4)
    assert d["target"]["usd_per_million"] is None and len(d["teaching"]) == 6
    assert d["teaching"][4].startswith("Draft cost c = 0.10 is a GPU's economics") and "c < (E − R) / K = " in d["teaching"][4]


def test_cli_bad_input_is_a_bad_flag(capsys):
    assert main(["whatif", "--acceptance", "1.3", "--k", "4", "--draft-cost", "0.1"]) == 2
    assert "bad flag: acceptance must be between 0 and 1, got 1.3." in capsys.readouterr().err


def test_the_view_marks_the_chosen_k():
    summary, fig = whatif_view(0.73, 4, 0.1, 1.0, 30, 2.0)
    assert "| tokens/s | 30.0 | 87.6 | 62.9 |" in summary and "Where the shortcut misleads" in summary
    chosen = [t for t in fig.data if t.name.startswith("K = 4")]
    assert len(chosen) == 1 and list(chosen[0].x) == [4] and chosen[0].y[0] == pytest.approx(2.93589941 / 1.4)
    curve = next(t for t in fig.data if t.name.startswith("predicted"))
    assert list(curve.x) == list(range(1, 17))
    assert "acceptance" in whatif_view(1.5, 4, 0.1, 1.0)[0]  # a bad value is named, not raised
    assert "needed" in whatif_view(0.73, None, 0.1, 1.0)[0]


@pytest.fixture(scope="module")
def session(tiny):
    return Session(tiny, PairSpec("tiny", "tiny", draft_quant="none"))


def test_the_tab_is_in_the_app_and_wired_to_the_last_run(tiny):

    from specviz.server import build_server

    demo = build_server(Session(tiny, PairSpec("tiny", "tiny")), Limits())
    tab = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-whatif")
    assert isinstance(tab, gr.Tab) and tab.label == "What if"
    button = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-whatif-run")
    triggers = {(t[0], t[1]) for dep in demo.config["dependencies"] for t in dep["targets"]}
    assert {(tab._id, "select"), (button._id, "click")} <= triggers


def drafting(rounds):
    """The rounds the costs are measured on: after the first (which also reads the prompt), and that drafted."""
    return [r for r in rounds[1:] if r.k > 0]


def acceptance_of(rounds) -> float:
    tested = [t for r in rounds for t in r.drafted if t.status != NOT_VERIFIED]
    return sum(t.status == ACCEPTED for t in tested) / len(tested)


def test_prefill_from_a_run_without_the_target_alone(session):
    record = list(ui_decode.run(session, Limits(), PROMPT, {"k": 4, "max_new_tokens": 24, "adaptive": "fixed"},
                        options=h.Options(Pace(0.0, 0.0, NO_WAIT))))[-1].record
    a, k, c, r, tps = prefill(record)
    later = drafting(record.rounds)
    verify = statistics.fmean(x.verify_time for x in later)
    assert a == round(acceptance_of(record.rounds), 2) and k == 4
    tested = [t for x in record.rounds for t in x.drafted if t.status != NOT_VERIFIED]
    expected = prefill(record, expected=True)  # the acceptance its βs predict, the rest as measured
    assert expected[0] == round(sum(t.beta for t in tested) / len(tested), 2) and expected[1:3] == (k, c)
    assert c == pytest.approx(sum(x.draft_time for x in later) / sum(x.k for x in later) / verify, abs=1e-3)
    assert r == 1.0  # the verify pass is the target step here
    assert tps == pytest.approx(1 / verify, abs=0.05)
    _, fig = whatif_view(a, k, c, r, tps, None)
    assert [list(t.x) for t in fig.data if t.name.startswith(f"K = {k}")] == [[k]]
    values = fill(record, None, always=False)
    assert values[:-1] == (a, k, c, r, tps)
    kept = fill(record, values[-1], always=False)  # reopening the tab on the same run keeps the visitor's edits:
    skip = gr.skip()
    assert all(type(v) is type(skip) and v == skip for v in kept[:-1]) and kept[-1] == values[-1]  # nothing sent
    assert fill(record, values[-1], always=True)[:-1] == (a, k, c, r, tps)  # the button refills
    assert prefill(None) is None


def test_prefill_with_the_target_alone_measures_the_verify_ratio(tiny):
    record = tracefile.record(tiny, PROMPT, DecodeConfig(k=3, max_new_tokens=16, adaptive="fixed"), with_ar=True)
    _, k, _, r, tps = prefill(record)
    step = statistics.median(s.time for s in record.ar_steps[1:])
    verify = statistics.fmean(x.verify_time for x in drafting(record.rounds))
    assert k == 3 and tps == pytest.approx(1 / step, abs=0.05)
    assert r == pytest.approx(verify / step, abs=1e-3)
