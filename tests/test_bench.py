"""The benchmark's code, on the tiny pair and on synthetic events: the JSON shape the issue fixes,
speedups as ratios of totals, the prediction model's math, the reports, the cheaper draft, and
transformers' settings being reset between calls. Timings are never asserted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from unittest import mock

import pytest
import torch

from helpers import deprecations_said
from specviz.analysis import predict
from specviz.analysis.divergence import first_divergence
from specviz.analysis.stats import run_stats, spec_stats
from specviz.bench.hf import HF_DEFAULT, HFGenerate, HFSetting
from specviz.bench.html import write_html
from specviz.bench.pairs import cost_exit_layer
from specviz.bench.prompts import BenchPrompt, PromptFileError, parse_prompts
from specviz.bench.report import build_report
from specviz.bench.table import format_table
from specviz.bench.runner import (
    AR, AR_EAGER, AR_HF, Bench, Method, Plan, PromptResult, Timed, hf_assisted, measure, run_bench, setting_name, split, tuned_best,
)
from specviz.engine import DecodeConfig, SamplingParams, autoregressive_generate, speculative_generate
from specviz.engine.events import ACCEPTED, BONUS, CORRECTION, NOT_VERIFIED, REJECTED, DraftedToken, EmittedToken, Round, Step
from specviz.models import encode_prompt
from specviz.models.draft import with_cheaper_draft
from specviz.models.draft.lean import LeanDraft
from specviz.models.draft.quantized import DraftQuant, Int4Linear, Int8Linear, QuantLinear, quantize_linear
from specviz.models.tiny import tiny_pair

RUN_KEYS = {"id", "kind", "k", "new_tokens", "ar_tokens_per_s", "spec_tokens_per_s", "hf_tokens_per_s", "speedup",
            "acceptance_rate", "mean_accepted_tokens", "identical_to_ar", "first_divergence"}
SUMMARY_KEYS = {"speedup", "speedup_by_kind", "vs_hf", "acceptance_rate", "identical_fraction", "predicted_speedup",
                "efficiency", "event_overhead", "device", "dtype",
                "vs_hf_other_draft", "speedup_ci95", "vs_hf_ci95"}


# --- synthetic events -------------------------------------------------------------------------

def drafted(token: int, status: str, gap: float = 1.0) -> DraftedToken:
    return DraftedToken(id=token, text=str(token), q=1.0, p=1.0, accept_prob=1.0, u=0.5, status=status, q_soft=1.0,
                        p_soft=1.0, target_top2_gap=gap)


def emitted(token: int, kind: str, gap: float = 1.0) -> EmittedToken:
    return EmittedToken(id=token, text=str(token), kind=kind, p=1.0, p_soft=1.0, target_top2_gap=gap)


def make_round(index: int, position: int, draft_ids: list[int], n: int, next_id: int,
               times=(0.03, 0.1, 0.001), gaps: list[float] | None = None) -> Round:
    """A round that drafted `draft_ids`, accepted the first n and then emitted `next_id`."""
    k = len(draft_ids)
    gaps = gaps or [1.0] * (k + 1)
    statuses = [ACCEPTED] * n + ([REJECTED] if n < k else []) + [NOT_VERIFIED] * max(0, k - n - 1)
    return Round(index=index, drafter="model", k=k, drafted=[drafted(t, s, g) for t, s, g in zip(draft_ids, statuses, gaps)],
                 n_accepted=n, emitted=emitted(next_id, BONUS if n == k else CORRECTION, gaps[n]),
                 new_token_ids=draft_ids[:n] + [next_id], position=position, text="",
                 draft_time=times[0], verify_time=times[1], overhead_time=times[2])


def make_steps(ids: list[int], step_s: float = 0.1, gaps: list[float] | None = None) -> list[Step]:
    gaps = gaps or [1.0] * len(ids)
    return [Step(index=i, token=emitted(t, "target", g), text="", time=step_s) for i, (t, g) in enumerate(zip(ids, gaps))]


def rounds_emitting(ids: list[int], k: int, n: int) -> list[Round]:
    """Rounds that reproduce `ids` exactly, accepting n of k drafts each time (n < k: a correction)."""
    out, pos = [], 0
    while pos < len(ids):
        take = min(n, len(ids) - pos - 1)
        new = ids[pos:pos + take + 1]
        draft = new[:take] + [999] * (k - take)
        out.append(make_round(len(out), pos, draft, take, new[-1]))
        pos += len(new)
    return out


SPEC = "spec k=4"


def result(pid: str, kind: str, tokens: int, ar_s: float, spec_s: float, k: int = 4,
           hf: dict[str, tuple[int, float]] | None = None, ar_hf_s: float | None = None) -> PromptResult:
    """One prompt, one repetition: AR, speculative at K (2 of k drafts accepted per round), HF methods by name."""
    ids = list(range(10, 10 + tokens))
    runs = {AR: Timed(ids, ar_s, events=make_steps(ids)), SPEC: Timed(ids, spec_s, events=rounds_emitting(ids, k, 2))}
    if ar_hf_s is not None:
        runs[AR_HF] = Timed(ids, ar_hf_s)
    for name, (n, s) in (hf or {}).items():
        runs[name] = Timed(ids[:n], s)
    return PromptResult(BenchPrompt(pid, "p", kind), 5, [runs], [list(runs)], attempts=1)


CONFIG = DecodeConfig(k=4, max_new_tokens=64, adaptive="fixed")
PLAN = Plan(CONFIG, ks=(4,))
COST = predict.CostModel(0.2, 0.05, (0.2, 0.2, 0.21, 0.21, 0.22))


def bench_of(results, config=CONFIG) -> Bench:
    return Bench([config], config, [], results)


# --- prompts ----------------------------------------------------------------------------------

def test_default_prompt_set_covers_the_kinds():
    from specviz.bench.prompts import load_prompts

    prompts = load_prompts()
    assert len(prompts) >= 6
    assert {"code", "json", "prose", "rewrite", "creative"} <= {p.kind for p in prompts}


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a"}'], "needs string fields"),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "repeats the id"),
    (["not json"], "line 1 is not JSON"),
    (["", "  "], "no prompts"),
    (['{"id": "a", "prompt": "  "}'], "empty prompt"),
])
def test_bad_prompt_files_say_which_line(lines, message):
    with pytest.raises(PromptFileError, match=message):
        parse_prompts(lines)


def test_kind_is_optional():
    assert parse_prompts(['{"id": "a", "prompt": "x"}']) == [BenchPrompt("a", "x", "other")]


def plan_for(*flags) -> Plan:
    from specviz import cli
    from specviz.commands.bench import plan_of

    return plan_of(cli.build_parser().parse_args(["bench", *flags]))


def test_parse_ks_and_confidence_cuts():
    assert plan_for("--k", "8,2, 4,4").ks == (2, 4, 8)
    plan = plan_for("--k", "4,6", "--confidence", "0.4,0.2", "--adaptive", "confidence", "--reps", "3")
    assert [(c.k, c.confidence) for c in plan.settings()] == [(4, 0.2), (4, 0.4), (6, 0.2), (6, 0.4)]
    assert plan.reps == 3
    assert len(plan_for("--k", "4", "--confidence", "0.2,0.4", "--adaptive", "fixed").settings()) == 1  # no cut there
    with pytest.raises(Exception):
        plan_for("--confidence", "1.5")
    with pytest.raises(Exception):
        plan_for("--k", "0,2")
    with pytest.raises(Exception):
        plan_for("--k", "two")
    trees = plan_for("--k", "8,12", "--confidence", "0.3,0.4", "--adaptive", "confidence", "--also-tree", "15,8")
    assert trees.tree_budgets == (8, 15) and len(trees.tree_settings()) == 8  # each budget at each grid point
    with pytest.raises(Exception):
        plan_for("--k", "8,12", "--also-tree", "8,0")


def test_parse_exit_layers_for_the_self_drafter():
    plan = plan_for("--drafter", "self", "--exit-layer", "12, 4,8", "--k", "4,6", "--adaptive", "fixed")
    assert [(c.k, c.exit_layer) for c in plan.settings()] == [(4, 4), (4, 8), (4, 12), (6, 4), (6, 8), (6, 12)]
    assert [setting_name(c) for c in plan.settings()][:2] == ["k=4 L=4", "k=4 L=8"]
    assert cost_exit_layer(plan) is None  # one draft cost would mispredict the other depths
    assert cost_exit_layer(plan_for("--drafter", "self", "--exit-layer", "8")) == 8
    model = plan_for("--drafter", "model", "--exit-layer", "4,8", "--adaptive", "fixed")
    assert len(model.settings()) == 1 and "L=" not in setting_name(model.settings()[0])  # depth concerns 'self'
    with pytest.raises(Exception):
        plan_for("--drafter", "self", "--exit-layer", "4,0")


# --- prediction model -------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, k", [(0.0, 4), (0.5, 1), (0.8, 4), (0.9, 8), (0.99, 16)])
def test_expected_tokens_matches_the_geometric_formula(alpha, k):
    assert predict.expected_tokens([alpha] * k, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_expected_tokens_uses_each_position():
    assert predict.expected_tokens([1.0, 0.5, 0.5], 3) == pytest.approx(1 + 1 + 0.5 + 0.25)
    assert predict.expected_tokens([1.0] * 4, 4) == 5
    # positions past the measured ones take the last measured value
    assert predict.expected_tokens([0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_predicted_speedup_formula():
    cost = predict.CostModel(target_step_s=0.2, draft_step_s=0.05, verify_s=(0.2, 0.2, 0.22, 0.24, 0.26))
    assert cost.c == pytest.approx(0.25)
    assert cost.verify_ratio == pytest.approx((1.0, 1.0, 1.1, 1.2, 1.3))
    alpha = [0.9, 0.8, 0.7, 0.6]
    e = 1 + 0.9 + 0.72 + 0.504 + 0.3024
    assert predict.predicted_speedup(alpha, cost, 4) == pytest.approx(e * 0.2 / (4 * 0.05 + 0.26))
    # free drafting and free verification: the speedup is exactly the tokens per round
    free = predict.CostModel(1.0, 0.0, (1.0,) * 9)
    assert predict.predicted_speedup([0.7] * 8, free, 8) == pytest.approx(predict.expected_tokens([0.7] * 8, 8))


def test_verify_time_extends_the_last_slope():
    cost = predict.CostModel(1.0, 0.1, (1.0, 1.1, 1.3))
    assert cost.verify_time(3) == 1.3
    assert cost.verify_time(5) == pytest.approx(1.3 + 2 * 0.2)


def test_best_k_trades_acceptance_against_draft_cost():
    flat = predict.CostModel(1.0, 0.1, (1.0,) * 20)
    assert predict.best_k([1.0] * 16, flat, range(1, 17)) == 16  # everything accepted: draft as much as allowed
    assert predict.best_k([0.0] * 16, flat, range(1, 17)) == 1  # nothing accepted: draft as little as allowed
    k = predict.best_k([0.8] * 16, flat, range(1, 17))
    values = {j: predict.predicted_speedup([0.8] * 16, flat, j) for j in range(1, 17)}
    assert values[k] == max(values.values()) and 1 < k < 16


def test_for_a_fixed_k_alpha_products_telescope_to_the_measured_tokens_per_round():
    rounds = [make_round(i, 0, [1, 2, 3, 4], n, 9) for i, n in enumerate([4, 0, 2, 2, 1, 4, 3, 0])]
    stats = spec_stats(rounds)
    assert predict.expected_tokens(stats.per_position, 4) == pytest.approx(stats.tokens / stats.rounds)
    assert predict.predicted_speedup(stats.per_position, COST, 4) == pytest.approx(
        predict.predicted_speedup_for_rounds([4] * len(rounds), stats.tokens, COST))
    # shorter rounds cost less: the per-round version follows them
    assert predict.predicted_speedup_for_rounds([4, 1], 6, COST) == pytest.approx(
        6 * 0.2 / (4 * 0.05 + 0.22 + 1 * 0.05 + 0.2))


# --- aggregation ------------------------------------------------------------------------------

def test_spec_stats_counts_positions_and_lengths():
    rounds = [make_round(0, 0, [1, 2, 3, 4], 4, 5), make_round(1, 5, [6, 7, 8, 9], 1, 10),
              make_round(2, 7, [11, 12, 13, 14], 0, 15)]
    s = spec_stats(rounds)
    assert (s.rounds, s.tokens, s.drafted, s.accepted) == (3, 8, 12, 5)
    assert s.tested == [3, 2, 1, 1] and s.passed == [2, 1, 1, 1]
    assert s.per_position == pytest.approx([2 / 3, 0.5, 1.0, 1.0])
    assert s.accepted_lengths == [1, 1, 0, 0, 1]
    assert s.acceptance_rate == pytest.approx(5 / 12)
    assert s.mean_accepted_tokens == pytest.approx(8 / 3)
    assert s.seconds == pytest.approx(3 * 0.131)
    assert s.event_overhead == pytest.approx(0.001 / 0.131)
    assert s.draft_step_s == pytest.approx(3 * 0.03 / 12)


def test_summary_predicts_from_events_alone():
    ids = list(range(20, 41))  # 7 rounds of 2 accepted + 1 correction
    rounds, steps = rounds_emitting(ids, 4, 2), make_steps(ids, step_s=0.1)
    out = run_stats(rounds, steps, spec_seconds=1.0, ar_seconds=2.0)
    assert out.speedup == pytest.approx(2.0)
    assert out.spec.tokens == out.ar.tokens == 21
    # α̂ = [1, 1, 0]: E(4) = 3 tokens/round; costs from events: T1 0.1, draft 0.03/4 per token, verify 0.1
    assert out.expected_tokens == pytest.approx(3.0)
    assert out.predicted_speedup == pytest.approx(3 * 0.1 / (4 * 0.0075 + 0.1))
    given = run_stats(rounds, steps, cost=COST, k=4)
    assert given.predicted_speedup == pytest.approx(predict.predicted_speedup(given.spec.per_position, COST, 4))


def test_first_divergence():
    ids = [5, 6, 7, 8, 9, 10, 11]
    rounds = rounds_emitting(ids, 4, 2)
    assert first_divergence(rounds, make_steps(ids)) is None
    other = ids[:4] + [42, 43, 44]
    gaps = [1.0, 1.0, 1.0, 1.0, 0.0625, 1.0, 1.0]
    div = first_divergence(rounds, make_steps(other, gaps=gaps))
    assert div.position == 4 and div.target_top2_gap == 0.0625
    assert div.spec_top2_gap == 1.0
    shorter = first_divergence(rounds, make_steps(ids[:5]))
    assert shorter.position == 5 and shorter.target_top2_gap is None  # the AR run ended there


# --- the report -------------------------------------------------------------------------------

def synthetic_results() -> list[PromptResult]:
    # per-prompt speedups 4.0 and 1.0 (mean 2.5); totals: 60 tokens in 3.0 s (AR) vs 60 in 1.5 s (spec);
    # transformers' plain generate() is slower (60 in 4.0 s), so specviz's AR lane is the baseline
    return [
        result("a", "code", 40, ar_s=2.0, spec_s=0.5, ar_hf_s=2.5,
               hf={"hf same k=4": (40, 1.0), "hf same default": (40, 0.8), "hf loaded k=4": (40, 2.0)}),
        result("b", "prose", 20, ar_s=1.0, spec_s=1.0, ar_hf_s=1.5,
               hf={"hf same k=4": (20, 1.0), "hf same default": (20, 1.2), "hf loaded k=4": (20, 2.0)}),
    ]


def test_report_has_the_issue_keys():
    report = build_report(bench_of(synthetic_results()), COST, device="cpu", dtype="bfloat16")
    assert all(RUN_KEYS <= set(run) for run in report["runs"])
    assert SUMMARY_KEYS <= set(report["summary"])
    json.dumps(report)  # plain JSON all the way down


def test_speedups_are_ratios_of_totals():
    report = build_report(bench_of(synthetic_results()), COST, device="cpu", dtype="bfloat16")
    s = report["summary"]
    assert [r["speedup"] for r in report["runs"]] == [4.0, 1.0]  # each within its own repetition
    assert s["speedup"] == pytest.approx((60 / 1.5) / (60 / 3.0))  # 2.0, not the mean of ratios 2.5
    assert s["speedup_by_kind"] == {"code": 4.0, "prose": 1.0}
    assert s["baseline"] == "specviz's AR lane" and s["ar_hf_tokens_per_s"] == pytest.approx(15.0)
    # same draft: k=4 60 tokens / 2.0 s, default 60 / 2.0 s too; the best by total; vs_hf = 40 / 30
    assert s["vs_hf"] == pytest.approx(40 / 30, abs=1e-4)
    assert s["vs_hf_other_draft"] == pytest.approx(40 / 15, abs=1e-4) and s["hf_other_draft_setting"] == "hf loaded k=4"
    assert s["acceptance_rate"] == pytest.approx(pooled_acceptance(synthetic_results()), abs=1e-4)
    assert s["identical_fraction"] == 1.0 and all(r["identical_to_ar"] for r in report["runs"])
    assert s["efficiency"] == pytest.approx(s["speedup"] / s["predicted_speedup"], abs=1e-3)
    # like for like: the decoding speedup over the AR lane (no prompt in it, as in the prediction) against it
    assert s["decode_efficiency"] == pytest.approx(s["decode_speedup"] / s["predicted_speedup"], abs=1e-3)
    assert s["speedup_ci95"] is None  # two prompts: no interval claimed


def test_the_faster_target_alone_is_the_baseline():
    """Instrumentation in specviz's AR lane must not inflate a speedup: transformers' generate() is faster here."""
    results = synthetic_results()
    for r, seconds in zip(results, (1.0, 0.5)):
        r.reps[0][AR_HF].seconds = seconds
    s = build_report(bench_of(results), COST, device="cpu", dtype="float32")["summary"]
    assert s["baseline"] == "transformers generate()"
    assert s["speedup"] == pytest.approx((60 / 1.5) / (60 / 1.5))
    assert s["ar_tokens_per_s"] == pytest.approx(20.0)  # both rates reported


def test_generate_on_its_static_cache_gives_the_target_alone_s_tokens(tiny):
    """The GPU baseline candidate (transformers compiles a static-cache generate() there): the same greedy tokens as
    generate() on its dynamic cache, here on the CPU where it is not compiled (and not raced)."""
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    ids = encode_prompt(tiny.tokenizer, "the a of")
    assert hf.generate(ids, 12, static=True) == hf.generate(ids, 12)


def test_the_ar_lane_on_its_eager_step_is_a_baseline_where_the_target_step_runs_compiled():
    """A compiled target step that loses in use must not become the baseline: the eager lane is timed beside it."""
    results = synthetic_results()
    for r, seconds in zip(results, (1.5, 0.6)):
        r.reps[0][AR_EAGER] = Timed(r.reps[0][AR].tokens, seconds)
    s = build_report(bench_of(results), COST, device="cpu", dtype="bfloat16")["summary"]
    assert s["baseline"] == "specviz's AR lane on the eager one-token step"
    assert s["speedup"] == pytest.approx((60 / 1.5) / (60 / 2.1), abs=1e-4)


def test_a_failed_baseline_check_scales_the_summary_speedup_instead_of_reporting_it_inflated():
    """T(2)/T1 0.85 on the AR lane's own target: that lane was not on its fastest one-token path, so the summary's
    speedup over it (and its interval) is scaled by 0.85, the number as measured kept beside it and said so."""
    results = [result(p, "code", 20, ar_s=2.0, spec_s=t, ar_hf_s=9.0) for p, t in zip("abcd", (0.5, 1.0, 1.5, 0.8))]
    bent = predict.CostModel(0.2, 0.05, (0.2, 0.17, 0.18, 0.21, 0.22))
    report = build_report(bench_of(results), bent, device="cpu", dtype="bfloat16")
    s = report["summary"]
    assert s["baseline_check_ok"] is False and s["baseline"] == "specviz's AR lane"
    assert s["speedup"] == pytest.approx(0.85 * s["speedup_as_measured"], abs=1e-3)
    measured = report["methods"][SPEC]["speedup_ci95"]
    assert s["speedup_ci95"] == pytest.approx([0.85 * x for x in measured], abs=1e-3)
    assert "the baseline check failed (a forward over 2, 3 tokens cost less" in format_table(report)
    fine = build_report(bench_of(results), COST, device="cpu", dtype="bfloat16")["summary"]
    assert fine["baseline_check_ok"] and fine["speedup"] == fine["speedup_as_measured"] == s["speedup_as_measured"]
    assert "the baseline check failed" not in format_table(build_report(bench_of(results), COST, device="cpu",
                                                                        dtype="bfloat16"))


def test_bootstrap_interval_brackets_the_speedup_and_collapses_when_every_prompt_agrees():
    same = [result(p, "code", 20, ar_s=2.0 * (i + 1), spec_s=i + 1.0, ar_hf_s=9.0) for i, p in enumerate("abcd")]
    s = build_report(bench_of(same), COST, device="cpu", dtype="float32")["summary"]
    assert s["speedup"] == pytest.approx(2.0) and s["speedup_ci95"] == [2.0, 2.0]  # any resample: 2.0
    spread = [result(p, "code", 20, ar_s=2.0, spec_s=t, ar_hf_s=9.0) for p, t in zip("abcde", (0.5, 1.0, 1.5, 2.0, 0.8))]
    s = build_report(bench_of(spread), COST, device="cpu", dtype="float32")["summary"]
    low, high = s["speedup_ci95"]
    assert low < s["speedup"] < high and high - low > 0.3


def with_prefill(run, seconds: float):
    run.events[0] = replace(run.events[0], prefill_time=seconds)
    return run


def test_prefill_is_reported_apart_and_decode_speedups_leave_it_out():
    results = synthetic_results()  # 40 tokens: AR 2.0 s, spec 0.5 s; 20 tokens: AR 1.0 s, spec 1.0 s
    for res, (ar_pre, spec_pre) in zip(results, [(0.5, 0.2), (0.5, 0.5)]):
        with_prefill(res.reps[0][AR], ar_pre), with_prefill(res.reps[0][SPEC], spec_pre)
    report = build_report(bench_of(results), COST, device="cpu", dtype="float32")
    first = report["runs"][0]
    assert first["prefill_s"] == {"ar": 0.5, "spec": 0.2}
    assert first["decode_speedup"] == pytest.approx((40 / 0.3) / (40 / 1.5))  # 5x where end to end is 4x
    s = report["summary"]
    assert s["decode_speedup"] == pytest.approx((60 / 0.8) / (60 / 2.0))  # ratio of totals, as the speedup
    assert s["speedup"] == pytest.approx(2.0) and "decode x" in format_table(report)
    # each lane's share of its seconds spent reading the prompt, a ratio of totals: AR 1.0 of 3.0 s, spec 0.7 of 1.5
    assert s["prompt_share"] == pytest.approx({"ar": 1.0 / 3.0, "spec": 0.7 / 1.5}, abs=1e-4)
    assert "reading the prompt: 47% of the speculative lane's time (both models), 33% of the AR lane's" \
        in format_table(report)


def pooled_acceptance(results) -> float:
    rounds = [r for res in results for r in res.reps[0][SPEC].events]
    return sum(r.n_accepted for r in rounds) / sum(r.k for r in rounds)


def test_divergence_is_reported_not_hidden():
    results = synthetic_results()
    ids = results[1].reps[0][AR].tokens
    changed = ids[:3] + [7] + ids[4:]
    results[1].reps[0][AR] = Timed(changed, 1.0, events=make_steps(changed, gaps=[1.0, 1.0, 1.0, 0.01] + [1.0] * 16))
    report = build_report(bench_of(results), COST, device="cpu", dtype="float32")
    run = report["runs"][1]
    assert run["identical_to_ar"] is False and run["first_divergence"]["position"] == 3
    assert run["first_divergence"]["target_top2_gap"] == 0.01
    assert report["summary"]["identical_fraction"] == 0.5
    assert "NO@3" in format_table(report)


def test_an_ar_run_that_ended_early_is_a_divergence_without_a_gap():
    results = synthetic_results()
    short = results[1].reps[0][AR].tokens[:12]
    results[1].reps[0][AR] = Timed(short, 1.0, events=make_steps(short))
    report = build_report(bench_of(results), COST, device="cpu", dtype="float32")
    run = report["runs"][1]
    assert run["identical_to_ar"] is False and run["first_divergence"]["position"] == 12
    assert run["first_divergence"]["target_top2_gap"] is None
    json.dumps(report)
    assert "NO@12 gap -" in format_table(report)


def test_sampling_runs_have_no_identity_claims():
    sampled = replace(CONFIG, sampling=SamplingParams(0.7))
    report = build_report(bench_of(synthetic_results(), sampled), COST, device="cpu", dtype="float32")
    assert report["summary"]["identical_fraction"] is None
    assert all(r["identical_to_ar"] is None and r["first_divergence"] is None for r in report["runs"])


def test_html_report_is_self_contained(tmp_path):
    report = build_report(bench_of(synthetic_results()), COST, device="cpu", dtype="bfloat16")
    path = write_html(report, tmp_path / "r.html")
    text = path.read_text()
    assert "Speedup over the target alone" in text and "Acceptance by position" in text
    assert "Settings tried" in text and "Predicted speedup vs K" in text and "Time per round" in text
    assert "<script src=\"http" not in text and len(text) > 1_000_000  # plotly.js inline: opens offline


# --- fairness: split, order, tuning -------------------------------------------------------------

def test_the_tuning_split_spans_the_kinds_and_never_overlaps_the_report():
    prompts = [BenchPrompt(f"{kind}{i}", "p", kind) for kind in ("code", "json", "prose") for i in range(2)]
    tune, report = split(prompts)
    assert {p.kind for p in tune} == {p.kind for p in report} == {"code", "json", "prose"}
    assert not {p.id for p in tune} & {p.id for p in report} and len(tune) + len(report) == 6
    singles = [BenchPrompt(str(i), "p", kind) for i, kind in enumerate(("a", "b", "c", "d"))]
    assert [[p.id for p in half] for half in split(singles)] == [["1", "3"], ["0", "2"]]


def test_the_setting_is_chosen_on_the_tuning_prompts_alone(tiny):
    """K=2 is faster on the tuning prompts, K=6 on the reported ones: K=2 is chosen, and only it is reported."""
    from specviz.bench import runner

    def fake_spec(pair, config):
        def run(ids):
            on_tuning_prompt = ids == encode_prompt(tiny.tokenizer, "she said that")
            fast = (config.k == 2) == on_tuning_prompt
            rounds = rounds_emitting(list(range(10, 18)), config.k, 1)
            return Timed(list(range(8)), 1.0 if fast else 3.0, events=rounds)
        return Method(f"spec {runner.setting_name(config)}", run)

    prompts = [BenchPrompt("report", "the a of", "code"), BenchPrompt("tune", "she said that", "code")]
    plan = Plan(replace(CONFIG, max_new_tokens=8), ks=(2, 6))
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    with mock.patch.object(runner, "spec_method", fake_spec):
        bench = run_bench(tiny, prompts, plan, hf, progress=False)
    assert bench.chosen.k == 2 and [r.prompt.id for r in bench.tuning] == ["tune"]
    assert set(bench.reported[0].reps[0]) == {AR, AR_HF, "spec k=2"}
    tuning = [PromptResult(BenchPrompt("t", "p"), 3, [{"spec k=2": Timed([1] * 10, 2.0), "spec k=6": Timed([1] * 10, 1.0)}])]
    assert tuned_best(tuning, [replace(CONFIG, k=2), replace(CONFIG, k=6)]).k == 6


def test_repetitions_are_summed_and_each_gets_its_own_record():
    one, two = synthetic_results()[0], synthetic_results()[0]
    one.reps.append(two.reps[0])
    one.reps[1][SPEC].seconds = 1.0  # the second repetition: 40 tokens in 1.0 s (the first: 0.5 s)
    one.reps[1][AR] = Timed(list(range(10, 49)) + [7], 2.0, events=make_steps(list(range(10, 49)) + [7]))
    one.orders.append(one.orders[0])
    report = build_report(bench_of([one]), COST, device="cpu", dtype="float32")
    assert [(r["rep"], r["speedup"]) for r in report["runs"]] == [(0, 4.0), (1, 2.0)]
    assert report["summary"]["speedup"] == pytest.approx((80 / 1.5) / (80 / 4.0), abs=1e-4)  # rounded to 4 digits
    assert report["summary"]["identical_fraction"] == 0.5 and report["summary"]["reps"] == 2


def test_methods_run_in_a_fresh_seeded_order_each_repetition():
    ran = []
    methods = [Method(name, lambda ids, name=name: ran.append(name) or Timed([1], 0.1)) for name in "abcd"]
    plan = replace(PLAN, reps=12)
    res = measure(BenchPrompt("x", "p"), [1, 2], methods, plan)
    assert all(sorted(order) == list("abcd") for order in res.orders)
    assert ran == [name for order in res.orders for name in order]  # what was recorded is what ran
    assert len({order[0] for order in res.orders}) > 1 and len({tuple(o) for o in res.orders}) > 1
    assert all(list(rep) == list("abcd") for rep in res.reps)  # stored in a fixed order for the report
    assert measure(BenchPrompt("x", "p"), [1, 2], methods, plan).orders == res.orders  # seeded


# --- on the tiny pair -------------------------------------------------------------------------

def test_bench_on_the_tiny_pair(tiny):
    prompts = [BenchPrompt("one", "the a of", "code"), BenchPrompt("two", "she said that", "code"),
               BenchPrompt("three", "of the she", "prose"), BenchPrompt("four", "a she said", "prose")]
    plan = Plan(DecodeConfig(k=2, max_new_tokens=10, adaptive="fixed"), ks=(2, 3))
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    bench = run_bench(tiny, prompts, plan, hf, {"same": tiny.draft}, progress=False)
    assert [r.prompt.id for r in bench.tuning] == ["two", "four"]
    assert [r.prompt.id for r in bench.reported] == ["one", "three"]
    assert all(set(rep) == {"spec k=2", "spec k=3"} for r in bench.tuning for rep in r.reps)
    want = {AR, AR_HF, f"spec k={bench.chosen.k}", f"hf same k={bench.chosen.k}", "hf same default"}
    assert all(set(rep) == want for r in bench.reported for rep in r.reps)
    report = build_report(bench, COST, device="cpu", dtype="float32")
    assert len(report["runs"]) == 2 and report["summary"]["k"] == bench.chosen.k
    assert report["summary"]["tuned_on"] == ["two", "four"] and set(report["settings"]) == {"k=2", "k=3"}
    # float32 tiny pair: greedy speculative decoding, HF's plain and assisted generation all equal the target alone
    assert report["summary"]["identical_fraction"] == 1.0
    assert all(m["identical_fraction"] == 1.0 for m in report["methods"].values())


def test_the_bench_tunes_the_tree_like_the_chain_and_reports_it_beside_it(tiny):
    prompts = [BenchPrompt("one", "the a of", "code"), BenchPrompt("two", "she said that", "code"),
               BenchPrompt("three", "of the she", "prose"), BenchPrompt("four", "a she said", "prose")]
    plan = Plan(DecodeConfig(k=3, max_new_tokens=12), ks=(3,), tree_budgets=(4, 8))
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    bench = run_bench(tiny, prompts, plan, hf, {}, progress=False)
    assert [c.tree_budget for c in bench.trees] == [4, 8] and bench.chosen_tree in bench.trees
    assert all(set(rep) == {"spec k=3 c=0.4", "spec tree n=4 k=3 c=0.4", "spec tree n=8 k=3 c=0.4"}
               for r in bench.tuning for rep in r.reps)
    tree = f"spec tree n={bench.chosen_tree.tree_budget} k=3 c=0.4"
    assert all(set(rep) == {AR, AR_HF, "spec k=3 c=0.4", tree} for r in bench.reported for rep in r.reps)
    report = build_report(bench, COST, device="cpu", dtype="float32")
    t = report["tree"]
    assert t["setting"] == tree.removeprefix("spec ") and set(t["vs_chain_by_kind"]) == {"code", "prose"}
    assert report["methods"][tree]["identical_fraction"] == 1.0  # greedy: the tree's output is the target's
    rounds = [x for r in bench.reported for rep in r.reps for x in rep[tree].events]
    tried_first = sum(1 for x in rounds if any(n.depth == 1 and n.accept_prob is not None for n in x.tree))
    assert t["by_depth"][0]["tried"] == tried_first and t["by_rank"][0]["tried"] >= tried_first
    assert all(0 <= row["rate"] <= 1 for row in t["by_depth"] + t["by_rank"])
    assert "accepted by sibling rank" in format_table(report)


def test_hf_drafts_as_specviz_does_and_uses_prompt_lookup_for_the_lookup_drafter(tiny):
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    config = DecodeConfig(k=6, adaptive="confidence", confidence=0.4)
    names = [m.name for m in hf_assisted(hf, config, {"same": tiny.draft, "loaded": tiny.draft})]
    assert names == ["hf same k=6 c=0.4", "hf same default", "hf loaded k=6 c=0.4", "hf loaded default"]
    growing = hf_assisted(hf, replace(config, adaptive="acceptance"), {"same": tiny.draft})
    assert [m.name for m in growing] == ["hf same k=6 heuristic", "hf same default"]  # HF's own grow/shrink rule
    assert [m.name for m in hf_assisted(hf, replace(config, drafter="lookup"), {"same": tiny.draft})] == ["hf lookup k=6"]
    seen = []

    def spy(*args, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("assistant_model", "prompt_lookup_num_tokens", "max_matching_ngram_size")})
        return torch.tensor([[3, 4, 5, 6]])

    with mock.patch.object(tiny.target, "generate", spy):
        hf.generate([3, 4, 5], 1)
        hf.generate([3, 4, 5], 1, HFSetting.fixed(6), lookup=True)
        hf.generate([3, 4, 5], 1, HFSetting.fixed(6, 0.4), tiny.draft)
    assert seen == [{"assistant_model": None, "prompt_lookup_num_tokens": None, "max_matching_ngram_size": None},
                    {"assistant_model": None, "prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 3},
                    {"assistant_model": tiny.draft, "prompt_lookup_num_tokens": None, "max_matching_ngram_size": None}]


def test_hf_settings_are_restored_after_each_call(tiny):
    config = tiny.draft.generation_config
    before = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    seen = []
    real_generate = tiny.target.generate

    def spy(*args, **kwargs):
        c = kwargs["assistant_model"].generation_config
        seen.append((c.num_assistant_tokens, c.num_assistant_tokens_schedule, c.assistant_confidence_threshold))
        c.num_assistant_tokens = 17  # as HF's heuristic schedule does, persisting into the next call
        return real_generate(*args, **kwargs)

    with mock.patch.object(tiny.target, "generate", spy):
        hf.generate([3, 4, 5], 4, HFSetting.fixed(3), tiny.draft)
        hf.generate([3, 4, 5], 4, HF_DEFAULT, tiny.draft)
    assert seen[0] == (3, "constant", 0.0)
    assert seen[1] == before
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule,
            config.assistant_confidence_threshold) == before


def test_transformers_lanes_say_nothing_deprecated(tiny):
    """A bench run's log carries no deprecation (issue 48). transformers' assisted generation calls the assistant's
    generate() with a generation_config and arguments beside it, which generate() warns is deprecated, once a process
    (its record of warnings said is cleared first: the test then holds whatever ran before it); the lane drops that
    one message for its call alone (a filter, gone after); the logger's level and its other records stay."""
    from transformers.utils.logging import warning_once

    from specviz.bench.hf import GENERATE_LOGGER

    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device)
    logger = logging.getLogger(GENERATE_LOGGER)
    level, filters = logger.level, list(logger.filters)
    warning_once.cache_clear()
    with deprecations_said() as said:
        hf.generate([3, 4, 5], 6, HFSetting.fixed(3), tiny.draft)
        hf.generate([3, 4, 5], 6, HF_DEFAULT, tiny.draft)
        hf.generate([3, 4, 5, 3, 4], 6, HFSetting.fixed(3), lookup=True)
        hf.generate([3, 4, 5], 6)
    assert said == []
    assert logger.level == level and logger.filters == filters


@pytest.mark.parametrize("sampling, expected", [
    (SamplingParams(0.0), dict(do_sample=False, temperature=None, top_k=None, top_p=None)),
    (SamplingParams(0.7, top_k=0, top_p=0.9), dict(do_sample=True, temperature=0.7, top_k=None, top_p=0.9)),
    (SamplingParams(1.0, top_k=20), dict(do_sample=True, temperature=1.0, top_k=20, top_p=None)),
])
def test_hf_samples_with_the_same_warps_as_specviz(tiny, sampling, expected):
    seen, given = [], []

    def spy(ids, **kwargs):
        seen.append({k: kwargs[k] for k in expected})
        given.append((ids.tolist(), kwargs["attention_mask"].tolist(), kwargs["max_new_tokens"]))
        return torch.cat([ids, torch.tensor([[6]])], 1)  # generate()'s output: the prompt, then what it made

    hf = HFGenerate(tiny.target, tiny.eos_token_ids, None, tiny.device, sampling, seed=1)
    with mock.patch.object(tiny.target, "generate", spy):
        assert hf.generate([3, 4, 5], 1, HFSetting.fixed(2), tiny.draft) == [6]  # the new tokens alone
        assert hf.generate([7, 8], 2) == [6]  # the target alone: the same warps
    assert seen == [expected, expected]
    assert given == [([[3, 4, 5]], [[1, 1, 1]], 1), ([[7, 8]], [[1, 1]], 2)]  # the prompt and length asked for


def test_cli_writes_json_and_html(tiny, tmp_path, capsys):
    """The bench writes its report as JSON and HTML; with --no-progress it loads its pair without transformers'
    progress bars, and it says nothing deprecated meanwhile (issue 48)."""
    from specviz import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "the a of", "kind": "code"}\n'
                       '{"id": "y", "prompt": "she said that", "kind": "code"}\n')
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    loads = []
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: loads.append(kw) or tiny), \
            deprecations_said() as said:
        rc = cli.main(["bench", "--prompts", str(prompts), "--k", "2,3", "--adaptive", "fixed", "--max-new-tokens", "6",
                       "--compare-hf", "--json", str(out), "--html", str(page), "--no-progress"])
    assert rc == 0
    assert loads == [{"progress": False}] and said == []
    report = json.loads(out.read_text())
    assert SUMMARY_KEYS <= set(report["summary"]) and len(report["runs"]) == 1
    assert report["summary"]["tuned_on"] == ["y"] and report["summary"]["reported_on"] == ["x"]
    assert report["config"]["settings"] == ["k=2", "k=3"] and report["costs"]["verify_ratio"][0] == 1.0
    assert {"hf same k=2", "hf same k=3"} & set(report["methods"]) and "hf loaded default" in report["methods"]
    assert page.stat().st_size > 1_000_000
    assert "speedup over the target alone" in capsys.readouterr().out


@pytest.fixture(autouse=True)
def eager_steps(monkeypatch):
    """The bench's `--step auto` on the tiny pair: the eager steps, as if they could not be compiled here (a real
    probe would compile the tiny models, and its choice would depend on this machine's noise)."""
    monkeypatch.setattr("specviz.models.steps.measured_steps", lambda *args, **kwargs: None)


def test_cli_chooses_the_steps_on_the_tuned_pair_and_times_the_eager_target_beside_a_compiled_one(
        tiny, tmp_path, monkeypatch):
    """Where the target's compiled step won its probe and held in use (faked here), the bench runs it, with its
    verify on the tuned kernels, and times the AR lane on the eager step beside it as a baseline candidate."""
    from specviz import cli
    from specviz.models import steps
    from specviz.models.step_timing import StepTimes

    probed = []

    def faster(eager, compiled_model, *args, **kwargs):
        probed.append(eager)
        return StepTimes(eager_s=0.010, compiled_s=0.001, compile_s=1.0)

    monkeypatch.setattr(steps, "measured_steps", faster)
    monkeypatch.setattr(steps, "consecutive_step", lambda *a, **k: 0.001)
    monkeypatch.setattr(steps, "wide_forward", lambda *a, **k: 0.0015)
    monkeypatch.setattr(steps, "SIZES", (96,))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "the a of", "kind": "code"}\n{"id": "b", "prompt": "of the", "kind": "x"}\n')
    out = tmp_path / "r.json"
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: tiny):
        assert cli.main(["bench", "--prompts", str(prompts), "--k", "3", "--adaptive", "fixed", "--max-new-tokens",
                         "8", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["meta"]["target"].endswith("[tuned kernels] [compiled step]")
    assert len(probed) == 2 and probed[1] is not tiny.target  # probed against the tuned target, not as loaded
    eager = report["methods"][AR_EAGER]
    assert eager["identical_fraction"] == 1.0 and report["summary"]["compiles_in_timed_runs"] == 0
    assert report["summary"]["baseline"] in ("specviz's AR lane", "specviz's AR lane on the eager one-token step",
                                             "transformers generate()")


def test_cli_measures_tuned_kernels_against_the_kernels_as_loaded(tiny, tmp_path, capsys):
    from specviz import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "{i}", "prompt": "{text}", "kind": "{kind}"}}\n' for i, (text, kind) in
                               enumerate([("the a of", "code"), ("she said that", "code"), ("of the she", "prose")])))
    out = tmp_path / "r.json"
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: tiny):
        rc = cli.main(["bench", "--prompts", str(prompts), "--k", "6", "--adaptive", "fixed", "--max-new-tokens", "12",
                       "--also-tree", "8", "--also-untuned", "--json", str(out), "--no-progress"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["meta"]["target"] == "tiny-target [tuned kernels]" and report["meta"]["kernels"] == "tuned"
    for name in ("ar untuned", "spec k=6 untuned", "spec tree n=8 k=6 untuned"):  # both lanes, chain and tree
        assert report["methods"][name]["identical_fraction"] == 1.0  # greedy: the same tokens either way
    u = report["untuned"]
    rate = {name: m["tokens_per_s"] for name, m in report["methods"].items()}
    for lane, tuned in (("ar", "ar"), ("chain", "spec k=6"), ("tree", "spec tree n=8 k=6")):  # each lane's own pair
        assert u[lane]["tuned_over_untuned"] == pytest.approx(rate[tuned] / rate[f"{tuned} untuned"], abs=2e-4)
    assert len(u["chain"]["ci95"]) == 2 and set(u["chain"]["by_kind"]) == {"code", "prose"}
    assert u["ar"]["untuned_tokens_per_s"] == report["methods"]["ar untuned"]["tokens_per_s"]
    assert u["tree"]["untuned_tokens_per_s"] == report["methods"]["spec tree n=8 k=6 untuned"]["tokens_per_s"]
    assert len(u["costs"]["verify_ratio"]) == len(report["costs"]["verify_ratio"]) == 9  # both curves to the tree
    check = report["costs"]["baseline_check"]
    assert check["ok"] == (check["min_ratio"] >= 0.95) and (check["sentence"] is None) == check["ok"]
    a = report["anchors"]
    assert a["bandwidth_gb_s"] > 0 and a["target"]["weight_bytes"] > 0
    for role in ("target", "draft"):  # the bound (bytes / bandwidth) over the measured step, both as reported
        b = a[role]
        bound_s = b["weight_bytes"] / (a["bandwidth_gb_s"] * 1e9)
        assert b["fraction_of_bound"] == pytest.approx(bound_s / (b["step_ms"] / 1e3), rel=0.02, abs=6e-4)
        assert b["step_ms"] == report["costs"][f"{role}_step_ms"]  # the step the cost model measured
    assert a["kernel_table"]["one_row"]
    text = capsys.readouterr().out
    assert "tuned kernels over the kernels as loaded" in text and "memory bandwidth (triad)" in text
    assert "baseline check" in text
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: tiny):  # plain asked for: nothing to compare
        assert cli.main(["bench", "--prompts", str(prompts), "--k", "2", "--max-new-tokens", "4", "--also-untuned",
                         "--kernels", "plain", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["untuned"] is None and report["anchors"]["kernel_table"] is None


def test_llamacpp_runs_in_the_same_bench_on_the_reported_prompts_and_prints_beside_specviz(tiny, tmp_path, capsys):
    from specviz import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "the a of", "kind": "code"}\n{"id": "b", "prompt": "of the", "kind": "x"}\n')
    seen = {}

    def fake(folder, spec, reported, config, status):
        seen.update(folder=folder, ids=[p.id for p in reported], k=config.k, tokens=config.max_new_tokens)
        return {"build": folder, "threads": 2, "target_tokens_per_s": 28.3, "draft_tokens_per_s": 45.4, "c": 0.62,
                "k": config.k, "spec_tokens_per_s": 16.2, "spec_over_target": 0.57, "acceptance": 0.8, "prompts": 2}
    out = tmp_path / "r.json"
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: tiny), \
            mock.patch("specviz.bench.llamacpp.compare_llamacpp", fake):
        assert cli.main(["bench", "--prompts", str(prompts), "--k", "3", "--max-new-tokens", "6", "--compare-llamacpp",
                         "/some/build", "--json", str(out), "--no-progress"]) == 0
    assert seen == {"folder": "/some/build", "ids": ["a", "b"], "k": 3, "tokens": 6}  # the chosen setting, as run
    assert json.loads(out.read_text())["llamacpp"]["spec_over_target"] == 0.57
    assert "llama.cpp (/some/build, 2 threads, the same GGUF files): target alone 28.30 tok/s" in capsys.readouterr().out


def test_the_baseline_check_names_a_row_count_cheaper_than_a_step():
    from specviz.analysis.predict import CostModel
    from specviz.bench.report import baseline_check

    good = baseline_check(CostModel(0.1, 0.01, (0.1, 0.1, 0.099, 0.12)))
    assert good["ok"] and good["sentence"] is None and good["min_ratio"] == 0.99
    bad = baseline_check(CostModel(0.1, 0.01, (0.1, 0.09, 0.093, 0.12)))
    assert not bad["ok"] and bad["min_ratio"] == 0.9
    assert bad["sentence"].startswith("a forward over 2, 3 tokens cost less than one token's step")


def test_cli_benches_self_speculation_on_a_target_only_pair(tiny, tmp_path, capsys):
    from specviz import cli
    from specviz.models.tiny import tiny_model

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "the a of", "kind": "code"}\n'
                       '{"id": "y", "prompt": "she said that", "kind": "code"}\n')
    out = tmp_path / "r.json"
    deeper = replace(tiny, draft=None, target=tiny_model(0, tiny.vocab_size, layers=4))

    def bench(pair, *flags):
        with mock.patch("specviz.models.load_spec", lambda spec, **kw: pair):
            return cli.main(["bench", "--prompts", str(prompts), "--draft", "none", "--drafter", "self", "--k", "2",
                             "--adaptive", "fixed", "--max-new-tokens", "6", "--json", str(out), "--no-progress", *flags])

    assert bench(deeper, "--exit-layer", "2") == 0
    report = json.loads(out.read_text())
    assert report["config"]["settings"] == ["k=2 L=2"] and report["config"]["drafter"] == "self"
    assert report["summary"]["identical_fraction"] == 1.0  # greedy: the target's own tokens
    assert report["costs"]["draft_step_ms"] > 0  # the early exit's step, measured
    assert bench(deeper, "--exit-layer", "1,3") == 0
    report = json.loads(out.read_text())
    assert report["config"]["settings"] == ["k=2 L=1", "k=2 L=3"] and report["costs"] is None
    capsys.readouterr()
    assert bench(deeper, "--exit-layer", "2,4") == 2  # the target has 4 layers: 4 would be the target itself
    assert "exit layer must be between 1 and 3" in capsys.readouterr().err


def test_cli_rejects_a_bad_prompt_file_and_a_grid_without_prompts_to_tune_on(tmp_path, capsys):
    from specviz import cli

    bad = tmp_path / "p.jsonl"
    bad.write_text("{oops\n")
    assert cli.main(["bench", "--prompts", str(bad)]) == 2
    assert "line 1 is not JSON" in capsys.readouterr().err
    one = tmp_path / "one.jsonl"
    one.write_text('{"id": "x", "prompt": "p"}\n')
    assert cli.main(["bench", "--prompts", str(one), "--k", "2,4"]) == 2
    assert "at least 2 prompts" in capsys.readouterr().err


# --- the cheaper draft ------------------------------------------------------------------------

@pytest.mark.parametrize("bits, cls", [(8, Int8Linear), (4, Int4Linear)])
def test_quantized_linear_is_close_and_many_tokens_use_the_dense_weights(bits, cls):
    torch.manual_seed(0)
    dense = torch.nn.Linear(64, 48, bias=True)
    q = quantize_linear(dense, bits)
    assert isinstance(q, cls)
    x = torch.randn(1, 1, 64)
    err = (q(x) - dense(x)).norm() / dense(x).norm()
    assert err < (0.02 if bits == 8 else 0.15)
    many = torch.randn(1, 9, 64)
    assert torch.equal(q(many), dense(many))


@pytest.mark.parametrize("bits, lean, step", [(8, False, QuantLinear), (4, False, QuantLinear), (8, True, LeanDraft),
                                            (4, True, LeanDraft)])
def test_fast_draft_keeps_greedy_output_and_the_original_draft(bits, lean, step):
    pair = tiny_pair()
    before = {n: p.clone() for n, p in pair.draft.named_parameters()}
    fast = with_cheaper_draft(pair, DraftQuant(bits=bits), lean=lean)
    assert fast.draft is not pair.draft and fast.target is pair.target
    assert isinstance(fast.draft if step is LeanDraft else fast.draft.lm_head, step)
    assert all(torch.equal(before[n], p) for n, p in pair.draft.named_parameters())
    config = DecodeConfig(k=3, max_new_tokens=24, adaptive="fixed")
    for prompt in ([3, 4, 5], [7, 1, 9, 2, 30, 31]):
        ar = [s.token.id for s in autoregressive_generate(pair, prompt, config)]
        rounds = list(speculative_generate(fast, prompt, config))
        assert [t for r in rounds for t in r.new_token_ids] == ar


def lean_and_hf_logits(bits: int, feeds: list[list[int]]):
    from transformers import DynamicCache

    from specviz.compat import forward

    model = tiny_pair().draft
    lean = LeanDraft(model, DraftQuant(bits=bits)).eval()
    out = []
    with torch.inference_mode():
        c1, c2 = DynamicCache(), DynamicCache()
        for feed in feeds:
            x = torch.tensor([feed])
            a = forward(model, x, c1, len(feed)).logits
            b = forward(lean, x, c2, len(feed)).logits
            out.append((a, b))
        assert c1.get_seq_length() == c2.get_seq_length() == sum(map(len, feeds))
    return out


FEEDS = [[3, 4, 5, 6, 7, 8, 9], [10], [11, 12], [13, 14, 15, 16], [17]]  # prompt, then 1- and multi-token steps


def test_lean_draft_computes_what_the_hugging_face_model_computes():
    for a, b in lean_and_hf_logits(16, FEEDS):  # unquantized: the same maths, float32
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_lean_int8_draft_stays_close_to_the_hugging_face_model():
    for a, b in lean_and_hf_logits(8, FEEDS)[1:]:
        assert (a - b).norm() / a.norm() < 0.1


def test_lean_draft_applies_only_where_it_knows_the_architecture():
    from types import SimpleNamespace

    from specviz.models.draft.lean import lean_draft, supported

    assert supported(tiny_pair().draft)
    other = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    assert not supported(other)
    windowed = SimpleNamespace(config=SimpleNamespace(model_type="qwen2", use_sliding_window=True))
    assert not supported(windowed)
    assert lean_draft(tiny_pair().draft, DraftQuant(bits=16)) is None  # nothing to quantize: keep HF's forward


@pytest.mark.parametrize("lean", [False, True])
def test_sampled_drafts_carry_the_fast_drafts_own_q(lean):
    """Exactness needs q to be what the draft sampled from: the fast draft's q, not the original's.

    Replays the drafter's feeding pattern (the prompt but its last token, then per round the missing tokens,
    then one drafted token at a time, cropped back after each round) on the fast draft and compares q(x)
    with the events.
    """
    from transformers import DynamicCache

    from specviz.compat import forward
    from specviz.engine.plumbing import rollback

    pair = tiny_pair()
    fast = with_cheaper_draft(pair, DraftQuant(bits=8), lean=lean)
    config = DecodeConfig(k=3, max_new_tokens=12, sampling=SamplingParams(1.0), seed=3, adaptive="fixed")
    history = [3, 4, 5, 6, 7, 8]
    rounds = list(speculative_generate(fast, history, config))
    cache = DynamicCache()
    with torch.inference_mode():
        forward(fast.draft, torch.tensor([history[:-1]]), cache, 1)
        for r in rounds:
            feed = torch.tensor([history[cache.get_seq_length():]])
            for d in r.drafted:
                logits = forward(fast.draft, feed, cache, 1).logits[0, -1]
                assert d.q == pytest.approx(torch.softmax(logits.float(), -1)[d.id].item(), rel=1e-4, abs=1e-7)
                feed = torch.tensor([[d.id]])
            rollback(cache, len(history) + r.n_accepted)
            history = history + r.new_token_ids


# --- CPU contention ---------------------------------------------------------------------------

def test_stall_seconds_reads_pressure_stall_information(tmp_path):
    from specviz.bench.noise import stall_between, stall_seconds

    psi = tmp_path / "cpu"
    psi.write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert stall_seconds(psi) == 2.5
    assert stall_seconds(tmp_path / "missing") is None
    assert stall_between(1.0, 1.5, 10.0) == pytest.approx(0.05)
    assert stall_between(None, 1.5, 10.0) is None


@pytest.mark.parametrize("stalls, attempts, kept", [([0.01], 1, 0.01), ([0.3, 0.1, 0.2], 3, 0.1), ([0.3, 0.02], 2, 0.02)])
def test_a_disturbed_repetition_is_measured_again(stalls, attempts, kept):
    made = iter(stalls)
    method = Method("ar", lambda ids: Timed([1], 1.0, next(made)))
    retried = []
    out = measure(BenchPrompt("a", "p"), [1], [method], replace(PLAN, max_stall=0.05, retries=2),
                  on_retry=lambda: retried.append(1))
    assert out.attempts == attempts and out.max_stall == kept and len(retried) == attempts - 1


def test_the_acceptance_predictor_is_judged_on_prompts_it_was_not_fitted_on():
    from specviz.analysis.acceptance import examples

    results = synthetic_results()
    report = build_report(bench_of(results), COST, device="cpu", dtype="float32")
    a = report["acceptance_model"]
    spec = f"spec {setting_name(CONFIG)}"
    fitted, tested = (len(examples([e for rep in r.reps for e in rep[spec].events])[1]) for r in results)
    assert (a["fitted_on_tokens"], a["tested_on_tokens"]) == (fitted, tested)  # no grid: every other prompt
    assert sum(b["n"] for b in a["reliability"]) == tested and 0 <= a["brier"] <= 1
    assert "acceptance predictor: Brier" in format_table(report)


def test_cli_benches_prompt_lookup_on_a_target_only_pair(tiny, tmp_path):
    """No draft model: no draft step to time, so no cost model (it used to time the missing draft and crash)."""
    from specviz import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "the a of the a of", "kind": "code"}\n')
    out = tmp_path / "r.json"
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: replace(tiny, draft=None)):
        assert cli.main(["bench", "--prompts", str(prompts), "--draft", "none", "--drafter", "lookup", "--k", "2",
                         "--adaptive", "fixed", "--max-new-tokens", "6", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["costs"] is None and report["summary"]["identical_fraction"] == 1.0


def test_cli_compares_the_predicted_cut_with_the_confidence_cut_and_saves_the_predictor(tiny, tmp_path, capsys):
    """`--also-adaptive predicted` measures the predicted-acceptance cut beside the chosen confidence cut, at the
    same K and cut, on the same prompts; `--save-predictor` writes a model the engine loads."""
    from specviz import cli
    from specviz.engine.acceptance import AcceptanceModel

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "the a of", "kind": "code"}\n'
                       '{"id": "y", "prompt": "she said that", "kind": "code"}\n')
    out, saved = tmp_path / "r.json", tmp_path / "model.json"
    with mock.patch("specviz.models.load_spec", lambda spec, **kw: tiny):
        rc = cli.main(["bench", "--prompts", str(prompts), "--k", "4", "--adaptive", "confidence", "--confidence",
                       "0.3", "--max-new-tokens", "12", "--also-adaptive", "predicted,fixed,predicted:0.3", "--save-predictor",
                       str(saved),
                       "--json", str(out), "--no-progress"])
    assert rc == 0
    methods = json.loads(out.read_text())["methods"]
    assert {"spec k=4 c=0.3", "spec k=4 a=0.3", "spec k=4"} == {m for m in methods if m.startswith("spec ")}
    assert all(0 <= methods[m]["acceptance_rate"] <= 1 for m in ("spec k=4 c=0.3", "spec k=4 a=0.3"))
    assert methods["ar"]["acceptance_rate"] is None
    fitted = json.loads(saved.read_text())
    assert fitted["tokens"] > 10 and "tiny-draft" in fitted["fitted_on"]
    assert len(AcceptanceModel.from_dict(fitted).weights) == 6
    assert "spec k=4 a=0.3" in capsys.readouterr().out
    for mode, said in (("psychic", "unknown mode 'psychic'; choose from fixed, confidence"),
                       ("confidence:high", "the cut in 'confidence:high' must be a number between 0 and 1"),
                       ("fixed:0.5", "'fixed' has no cut")):  # a bad flag: one sentence, exit 2
        assert cli.main(["bench", "--prompts", str(prompts), "--also-adaptive", mode]) == 2
        assert f"specviz: bad flag: --also-adaptive: {said}" in capsys.readouterr().err


def test_setting_names_say_which_cut():
    assert setting_name(DecodeConfig(k=8, adaptive="confidence", confidence=0.4)) == "k=8 c=0.4"
    assert setting_name(DecodeConfig(k=8, adaptive="predicted", confidence=0.5)) == "k=8 a=0.5"
    assert setting_name(DecodeConfig(k=8, adaptive="fixed")) == "k=8"
    assert setting_name(DecodeConfig(k=8, adaptive="acceptance")) == "k=8 grow"


def test_the_filter_drops_that_one_message_and_no_other(caplog):
    """`without_message` drops transformers' generation_config deprecation while a lane runs, and nothing else the
    same logger says (a warning of another kind still shows); gone after the block."""
    from specviz.bench.hf import GENERATE_DEPRECATION, GENERATE_LOGGER, without_message

    logger = logging.getLogger(GENERATE_LOGGER)
    with caplog.at_level(logging.WARNING, logger=GENERATE_LOGGER):
        with without_message(GENERATE_LOGGER, GENERATE_DEPRECATION):
            logger.warning(GENERATE_DEPRECATION + "=({'x'}) is deprecated")
            logger.warning("another warning")
        logger.warning(GENERATE_DEPRECATION + " after the block")
    assert [r.getMessage() for r in caplog.records] == ["another warning", GENERATE_DEPRECATION + " after the block"]
