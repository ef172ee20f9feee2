"""`specviz costs` on a small synthetic pair, and the full-acceptance drafter behind its round-loop numbers.

The report's derived numbers are recomputed here from its own measured ones with independent arithmetic
(not by calling the cost model's functions), so a wrong formula in the report fails."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from helpers import deprecations_said
from specviz.bench.forced import ForcedDrafter
from specviz.cli import main
from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.engine.drafters import ModelDrafter
from specviz.engine.sampling import SamplingParams, make_generator
from specviz.models.tiny import tiny_pair

K, TOKENS, VERIFY = 3, 24, 6


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("costs") / "costs.json"
    torch._dynamo.reset()  # as in a fresh process: a test before this one may have compiled the same shapes
    code = main(["costs", "--draft", "synthetic:mini-draft", "--target", "synthetic:mini-target", "--device", "cpu",
                 "--dtype", "float32", "--step", "eager,compiled", "--max-verify", str(VERIFY), "--forced-k", str(K),
                 "--forced-tokens", str(TOKENS), "--prompt-tokens", "16", "--reps", "2", "--json", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_both_step_modes_are_measured_and_named(report):
    eager, compiled = report["steps"]["eager"], report["steps"]["compiled"]
    assert compiled["target"].endswith("[compiled step]") and compiled["draft"].endswith("[compiled step]")
    assert "[compiled step]" not in eager["target"]
    assert set(compiled["compile_s"]) == {"draft", "target"} and not eager["compile_s"]
    # the compilation itself, not a first step after it (seconds against a step of milliseconds)
    assert min(compiled["compile_s"].values()) > 10 * compiled["target_step_ms"] / 1e3
    assert report["meta"]["device"] == "cpu" and report["meta"]["dtype"] == "float32"
    assert report["meta"]["weights_estimate_bytes"] > 0 and report["bandwidth_gb_s"] > 0


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_the_derived_numbers_follow_from_the_measured_ones(report, mode):
    r = report["steps"][mode]
    t1, d, verify = r["target_step_ms"], r["draft_step_ms"], r["verify_ms"]
    assert len(verify) == VERIFY and verify[0] == pytest.approx(t1, abs=1e-3)
    assert r["c"] == pytest.approx(d / t1, rel=2e-3, abs=1e-4)  # (from ms rounded to 0.1 µs)
    assert r["verify_ratio"] == pytest.approx([t / t1 for t in verify], rel=1e-3, abs=1e-3)
    for p in r["predicted"]:
        a = p["acceptance"]
        speedup = {k: (sum(a ** i for i in range(k + 1))) * t1 / (k * d + verify[k]) for k in range(1, VERIFY)}
        best = max(speedup.values())
        # the best K, up to the rounding of the times it is recomputed from (two K may be that close)
        assert speedup[p["best_k"]] == pytest.approx(best, rel=2e-3) and p["speedup"] == pytest.approx(best, rel=2e-3)
    for side, step_ms in (("target", t1), ("draft", d)):  # bytes at the measured bandwidth, over the step
        b = r["bound"][side]
        bound_s = b["weight_bytes"] / (report["bandwidth_gb_s"] * 1e9)
        assert b["fraction_of_bound"] == pytest.approx(bound_s / (step_ms / 1e3), rel=0.02, abs=1e-3)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_the_loop_at_full_acceptance_against_its_ideal(report, mode):
    """Float32: every forced draft is accepted, each round emits K + 1 tokens, and the ideal is the issue's
    (K + 1) / (K·draft + T(K + 1)) for such rounds."""
    r = report["steps"][mode]
    (f,) = r["forced"]
    assert f["k"] == K and f["argmax_agreement"] == 1.0  # the recording is the verify's own argmax: the rule agrees
    assert f["tokens"] == f["rounds"] * (K + 1) == TOKENS - (K + 1)  # the first round (with the prompt) not timed
    ideal = (K + 1) / (1e-3 * (K * r["draft_step_ms"] + r["verify_ms"][K]))
    assert f["ideal_tokens_per_s"] == pytest.approx(ideal, rel=2e-3)
    assert f["tokens_per_s"] == pytest.approx(f["tokens"] / f["decode_s"], rel=2e-3)
    # (the report rounds these two to 3 decimals: half a unit of the last one, whatever their size)
    assert f["efficiency"] == pytest.approx(f["tokens_per_s"] / f["ideal_tokens_per_s"], rel=2e-3, abs=5e-4)
    assert f["speedup"] == pytest.approx(f["tokens_per_s"] / f["target_alone_tokens_per_s"], rel=2e-3, abs=5e-4)
    per_round = 1e3 * f["decode_s"] / f["rounds"]
    assert f["overhead_ms_per_round"] == pytest.approx(per_round - 1e3 * (f["draft_s"] + f["verify_s"]) / f["rounds"],
                                                       abs=0.01)
    assert f["event_ms_per_round"] <= f["overhead_ms_per_round"]  # the event is built within the rest


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_the_loop_s_host_reads_and_compiles_are_counted(report, mode):
    """Nothing compiles inside a timed loop (every size and buffer set was warmed first); the host reads the
    device once per token of the target alone and at most twice a round (the rounds here draft a fixed K)."""
    r = report["steps"][mode]
    assert r["compiles_in_timed_runs"] == 0 and r["cudagraph_skips"] == 0
    (f,) = r["forced"]
    assert (r["host_syncs_per_round"], r["host_syncs_per_ar_token"]) == (f["host_syncs_per_round"],
                                                                         f["host_syncs_per_ar_token"])
    # the aim: 1 a token, 2 a round; a compiled step's verify runs transformers' eager forward on the static cache,
    # whose mask code reads the cache's write position (a device tensor) twice: two more, counted
    assert r["host_syncs_per_ar_token"] == 1 and 1 <= r["host_syncs_per_round"] <= (2 if mode == "eager" else 4)


def test_host_reads_are_counted_on_the_device_only_inside_the_block():
    from specviz.bench.syncs import counting_host_reads

    x = torch.tensor([1.0, 2.0])
    item = torch.Tensor.item
    with counting_host_reads(torch.device("cpu")) as reads:
        x[0].item(), x.tolist()  # two reads
        if x[1] > 1:  # a tensor in an `if` is read too
            pass
        y = torch.cat([x, x]).cpu()  # one transfer: what is read of it afterwards is on the host already
        [part.view(2).tolist() for part in y.split([2, 2])]
    assert reads == [4] and torch.Tensor.item is item
    x.item() if x.numel() == 1 else x.tolist()
    assert reads == [4]  # nothing counted after the block


def test_the_table_puts_the_modes_side_by_side(report, capsys):
    from specviz.bench.shape_costs import format_costs

    text = format_costs(report)
    assert "eager" in text.splitlines()[1] and "compiled" in text.splitlines()[1]
    assert "c = draft / T1" in text and f"K={K} full acceptance tok/s" in text


class CountingDraft(torch.nn.Module):
    """The draft with its forwards counted (the draft's true cost is what the forced drafter must pay)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0
        self.config = model.config

    def forward(self, *args, **kw):
        self.calls += 1
        return self.model(*args, **kw)


def test_the_forced_drafter_pays_the_draft_s_steps_and_proposes_the_target_s_continuation():
    pair = tiny_pair(seed=2, noise=0.3)  # a draft that often disagrees: plain speculation rejects
    prompt, new = [5, 6, 7, 8], 30
    greedy = DecodeConfig(k=4, max_new_tokens=new, adaptive="fixed")
    plain = list(speculative_generate(pair, prompt, greedy))
    assert any(r.n_accepted < r.k for r in plain)
    continuation = [s.token.id for s in autoregressive_generate(pair, prompt, replace(greedy, max_new_tokens=new + 5))]
    draft = CountingDraft(pair.draft)
    inner = ModelDrafter(draft, SamplingParams(0.0), make_generator(pair.device, 0), pair.vocab_size)
    forced = ForcedDrafter(inner, continuation, len(prompt), pair.vocab_size, pair.device)
    rounds = list(speculative_generate(pair, prompt, greedy, drafter=forced))
    assert all(r.n_accepted == r.k for r in rounds)
    assert [t for r in rounds for t in r.new_token_ids] == continuation[:new]
    assert all(d.q == 1.0 for r in rounds for d in r.drafted)  # point masses: the q the rule is given is true
    assert draft.calls == 1 + sum(r.k for r in rounds)  # the prompt, then one step per drafted token


def test_keep_every_draft_keeps_what_the_rule_would_reject_and_the_report_says_how_many():
    """The timed run keeps every draft (bf16 near-ties may part the recording from the verify's argmax): here a
    recording that is wrong from its first token, all kept, and none the verify's argmax."""
    from specviz.bench.forced import KEEP_EVERY_DRAFT

    pair = tiny_pair()
    prompt, k = [5, 6, 7, 8], 4
    config = DecodeConfig(k=k, max_new_tokens=20, adaptive="fixed")
    alone = [s.token.id for s in autoregressive_generate(pair, prompt, replace(config, max_new_tokens=30))]
    wrong = [(t + 1) % pair.vocab_size for t in alone]
    inner = ModelDrafter(pair.draft, SamplingParams(0.0), make_generator(pair.device, 0), pair.vocab_size)
    forced = ForcedDrafter(inner, wrong, len(prompt), pair.vocab_size, pair.device)
    rounds = list(speculative_generate(pair, prompt, config, rule=KEEP_EVERY_DRAFT, drafter=forced))
    assert all(r.n_accepted == r.k and r.emitted.kind == "bonus" for r in rounds)
    assert [t for r in rounds for t in r.new_token_ids][:k] == wrong[:k]
    assert not any(d.p == 1.0 for r in rounds for d in r.drafted)  # greedy p: 1 only at the verify's argmax


def test_a_forced_run_goes_on_past_the_target_s_end_of_text():
    """A real model given the costs' arbitrary prompt may write its end-of-text at once: the forced run still times
    its rounds (they stopped after one, and the report divided by zero), while the pair itself still stops there."""
    from specviz.analysis.predict import CostModel
    from specviz.bench.forced import forced_run

    pair = tiny_pair()
    prompt, k, tokens = [5, 6, 7, 8], 3, 12
    first = next(iter(autoregressive_generate(pair, prompt, DecodeConfig(k=k, max_new_tokens=1)))).token.id
    ends = replace(pair, eos_token_ids=frozenset({first}))
    assert len(list(autoregressive_generate(ends, prompt, DecodeConfig(k=k, max_new_tokens=tokens)))) == 1
    run = forced_run(ends, prompt, k, tokens, CostModel(target_step_s=0.01, draft_step_s=0.001,
                                                        verify_s=(0.01,) * (k + 1)))
    assert run.rounds >= 2 and run.tokens >= tokens - k - 1


def test_measuring_costs_says_nothing_deprecated():
    """The cost model's forwards pass the KV cache by the name the model takes (transformers 5.24 renamed it and
    warns on every forward given the old one): a bench run's log carries no deprecation (issue 48)."""
    from specviz.bench.costs import measure_costs_once

    with deprecations_said() as said:
        cost = measure_costs_once(tiny_pair(), [5, 6, 7, 8], 3, reps=1)
    assert said == [] and len(cost.verify_s) == 3


def test_a_failing_step_mode_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch, capsys):
    """A lent GPU's call is short: a mode that fails (a compile error) is recorded in the JSON, written after each
    mode, and the next mode is measured all the same; the command then exits 1."""
    def broken(loaded, eager, spec, *args, **kwargs):
        if spec.step == "compiled":
            raise RuntimeError("Triton: no C compiler\n(pages of it)")
        return eager

    monkeypatch.setattr("specviz.models.steps.with_steps", broken)
    out = tmp_path / "costs.json"
    code = main(["costs", "--draft", "synthetic:mini-draft", "--target", "synthetic:mini-target", "--device", "cpu",
                 "--dtype", "float32", "--step", "compiled,eager", "--max-verify", "3", "--forced-k", "",
                 "--prompt-tokens", "8", "--reps", "1", "--json", str(out)])
    assert code == 1
    report = json.loads(out.read_text())
    assert report["steps"]["compiled"] == {"error": "RuntimeError: Triton: no C compiler"}
    assert report["steps"]["eager"]["target_step_ms"] > 0
    assert "compiled: failed (RuntimeError: Triton: no C compiler)" in capsys.readouterr().out
