"""The Live view's sentence: why a run was faster or slower, from its own numbers; and prefill apart."""

from __future__ import annotations

import pytest

from specviz.analysis.explain import (
    Explanation, break_even_acceptance, economics, economics_headline, max_paying_c, precisions, sentence,
    tokens_per_round,
)
from specviz.engine import DecodeConfig
from specviz.models import encode_prompt
from specviz.runs.race import race_decoders
from specviz.runs.trace import RunMeta


def explanation(measured: float, acceptance: float, c: float, k: float = 4, verify: float = 1.0) -> Explanation:
    e = tokens_per_round(acceptance, k)
    return Explanation(measured=measured, predicted=e / (k * c + verify), acceptance=acceptance, tokens_per_round=e,
                       k=k, c=c, verify=verify, break_even=break_even_acceptance(c, verify, k))


@pytest.mark.parametrize("c,verify,k", [(0.15, 1.1, 8), (0.5, 1.0, 4), (0.05, 1.0, 2), (0.3, 1.4, 6)])
def test_at_the_break_even_acceptance_the_model_predicts_exactly_one(c, verify, k):
    alpha = break_even_acceptance(c, verify, k)
    assert 0 < alpha < 1
    assert tokens_per_round(alpha, k) / (k * c + verify) == pytest.approx(1.0, abs=1e-9)
    assert tokens_per_round(alpha + 0.01, k) > k * c + verify > tokens_per_round(alpha - 0.01, k)


def test_break_even_edges():
    assert break_even_acceptance(0.0, 1.0, 4) == 0.0  # a free draft never loses
    assert break_even_acceptance(1.0, 1.0, 4) is None  # K + v target steps for at most K + 1 tokens
    assert tokens_per_round(1.0, 4) == 5 and tokens_per_round(0.0, 4) == 1


def test_a_fast_run_says_what_made_it_fast():
    text = sentence(explanation(measured=2.4, acceptance=0.8, c=0.15))
    assert text.startswith("Faster because") and "acceptance 80%" in text and "0.15" in text
    assert f"predicts {explanation(2.4, 0.8, 0.15).predicted:.2f}×" in text


def test_a_slow_run_with_low_acceptance_names_the_break_even():
    e = explanation(measured=0.7, acceptance=0.3, c=0.3)
    text = sentence(e)
    assert text.startswith("Slower because acceptance is too low")
    assert f"breaks even at {e.break_even:.0%} acceptance" in text and e.break_even > 0.3


def test_a_slow_run_with_an_expensive_draft_says_no_acceptance_pays():
    text = sentence(explanation(measured=0.6, acceptance=0.9, c=1.1))
    assert text.startswith("Slower because the draft is too expensive") and "lower K" in text


def test_a_run_at_break_even_says_so():
    be = break_even_acceptance(0.5, 1.0, 4)
    text = sentence(explanation(measured=1.01, acceptance=be, c=0.5))
    assert text.startswith("About even") and f"{be:.0%} acceptance" in text


def test_a_slow_run_the_model_expected_to_win_blames_time_outside_the_model():
    text = sentence(explanation(measured=0.9, acceptance=0.9, c=0.1))
    assert text.startswith("Slower than the model's prediction") and "prompt's forward" in text


def test_prefill_and_decode_add_up_to_each_lanes_clock(tiny):
    ids = encode_prompt(tiny.tokenizer, "the man said that it was good and")
    config = DecodeConfig(k=4, max_new_tokens=16, adaptive="fixed")
    *_, state = race_decoders(tiny, ids, config, RunMeta.of(tiny, "", ids, config))
    for lane in state.lanes:
        first = lane.events[0]
        assert lane.prefill == first.prefill_time > 0  # the engine's own timing of the prompt's forward
        assert lane.prefill + lane.decode_seconds == pytest.approx(lane.clock)
        assert lane.decode_tokens_per_s == pytest.approx(lane.tokens / (lane.clock - lane.prefill))
        assert lane.decode_tokens_per_s > lane.tokens_per_s
    assert state.decode_speedup == pytest.approx(state.spec.decode_tokens_per_s / state.ar.decode_tokens_per_s)


def test_a_replayed_race_keeps_prefill_apart_and_the_live_verdict_shows_decoding_alone(tiny):
    from dataclasses import replace

    from specviz.runs.race import replay_race
    from specviz.runs.trace import Trace
    from specviz.ui.live import speed_html

    ids = encode_prompt(tiny.tokenizer, "the man said that it was good and")
    config = DecodeConfig(k=4, max_new_tokens=16, adaptive="fixed")
    *_, live = race_decoders(tiny, ids, config, RunMeta.of(tiny, "", ids, config))
    # recorded times, set so that a round costs two target steps; the prompt costs both lanes 10 s
    rounds = [replace(r, draft_time=0.01, verify_time=0.01, overhead_time=0.0, prefill_time=10.0 * (r.index == 0))
              for r in live.spec.events]
    steps = [replace(s, time=0.01, prefill_time=10.0 * (s.index == 0)) for s in live.ar.events]
    *_, state = replay_race(Trace(live.meta, rounds, steps))
    long_prompt = 10.0
    for lane in state.lanes:
        assert lane.prefill == long_prompt and lane.decode_seconds > 0
        assert lane.prefill + lane.decode_seconds == pytest.approx(lane.clock)
    tokens_per_round = 16 / len(rounds)
    assert state.decode_speedup == pytest.approx(tokens_per_round / 2)  # decoding alone: what rounds bought...
    assert state.speedup == pytest.approx((10 + 0.16) / (10 + 0.02 * len(rounds)))  # ...diluted by the prompt
    assert f"prompt apart {state.decode_speedup:.2f}×" in speed_html(state)


def test_the_economics_name_c_its_source_and_the_regime():
    e = explanation(measured=2.0, acceptance=0.8, c=0.11)
    text = economics(e, "bfloat16", "int4")
    assert text.startswith("The draft costs 0.11 of a target step because the target runs in bfloat16 and the "
                           "draft in int4: the economics of a GPU")
    limit = (e.tokens_per_round - e.verify) / e.k
    assert f"pays while the draft costs under {limit:.2f}" in text
    # an int4 target reads 3.2x fewer bytes: c ~0.35, still under the limit here
    assert "c would be about 0.35, within it only if an int4 verify stays as cheap as this one" in text
    lose = explanation(measured=1.6, acceptance=0.55, c=0.2)
    assert max_paying_c(lose) < 0.2 * 6.4 and "beyond it: this pair would lose" in economics(lose, "float32", "int4")
    cpu = economics(explanation(measured=0.6, acceptance=0.8, c=0.63), "int4", "int4")
    assert "the economics of a CPU engine such as llama.cpp" in cpu and "with an int4 target" not in cpu


def test_no_draft_cost_pays_when_the_verify_costs_more_than_a_round_emits():
    e = Explanation(measured=0.5, predicted=0.5, acceptance=0.0, tokens_per_round=1.0, k=4, c=0.1, verify=1.2,
                    break_even=None)
    assert max_paying_c(e) is None and "no draft cost would pay" in economics(e, "float32", "int4")


def test_precisions_come_from_the_names_the_pair_was_loaded_with():
    assert precisions("T [int4 weights] [tuned kernels]", "D [int4 draft step]", "float32") == ("int4", "int4")
    assert precisions("T [tuned kernels]", "D", "bfloat16") == ("bfloat16", "bfloat16")


def test_the_economics_headline_fits_one_line_and_the_sentence_opens_below_it(tiny):
    from types import SimpleNamespace

    from specviz.ui.live import economics_html

    e = explanation(measured=2.0, acceptance=0.8, c=0.11)
    limit = max_paying_c(e)
    assert economics_headline(e, "bfloat16", "int4") == (f"c = 0.11 (bfloat16 target, int4 draft): a GPU's economics; "
                                                          f"pays while c < {limit:.2f}")
    html = economics_html(e, SimpleNamespace(target="T [tuned kernels]", draft="D [int4 draft step]", dtype="bfloat16"))
    assert html.startswith('<details class="sv-live-why sv-live-economics"><summary>c = 0.11 (bfloat16 target, int4 ')
    assert "The draft costs 0.11 of a target step because the target runs in bfloat16" in html
