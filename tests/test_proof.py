"""The proof (`specviz prove`): its statistics on exact identities, then on the real round loop.

The pair is `test_statistical`'s (a 16-token causal LM and a noisy copy as draft: TV about 0.29 apart),
so a few hundred paths separate a correct sampler from a wrong one. Speculative decoding must pass for every
drafter and adaptive mode, and the target alone (the same paths under each: run once); the negative controls
(the draft sampled alone, once, and the round loop with every draft accepted, for each) must be rejected by the
same statistics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_statistical import PROMPT, pair  # noqa: F401 (the fixture)

from specviz.analysis.proof import PositionTally, position_result
from specviz.bench.prove import format_table, report_html
from specviz.cli import main
from specviz.engine import DecodeConfig, SamplingParams
from specviz.engine.exact import path_distributions, randomized_pit
from specviz.runs.proof import ProofSettings, identity, matrix, prove, samplers


def test_pit_intervals_tile_the_unit_interval_in_probability_order():
    probs = torch.tensor([[0.1, 0.4, 0.0, 0.4, 0.1]]).expand(5, 5)
    tokens = torch.arange(5)
    low, high = randomized_pit(probs, tokens, torch.zeros(5)), randomized_pit(probs, tokens, torch.ones(5))
    assert torch.allclose(high - low, probs[0])  # each token's interval is as wide as its probability
    order = sorted(range(5), key=lambda t: (-probs[0, t].item(), t))  # likeliest first, ties by id
    assert order == [1, 3, 0, 4, 2]
    edges = [0.0] + [high[t].item() for t in order]
    assert [low[t].item() for t in order] == pytest.approx(edges[:-1]) and edges[-1] == pytest.approx(1.0)


def exact_tally(probs: torch.Tensor, tokens: torch.Tensor) -> PositionTally:
    t = PositionTally()
    t.add(probs, tokens, torch.Generator().manual_seed(0))
    return t


def test_position_statistics_on_known_counts():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    perfect = torch.tensor([0] * 500 + [1] * 300 + [2] * 200)
    r = position_result(1, exact_tally(p.expand(1000, 4), perfect))
    assert r.tv == pytest.approx(0.0, abs=1e-6) and r.chi2_p == pytest.approx(1.0) and r.dof == 2
    assert [t for t, _, _ in r.top] == [0, 1, 2] and r.top[0][1:] == pytest.approx((0.5, 0.5))
    skewed = torch.tensor([0] * 900 + [1] * 50 + [2] * 50)
    r = position_result(1, exact_tally(p.expand(1000, 4), skewed))
    assert r.tv == pytest.approx(0.4) and r.chi2_p < 1e-6 and r.ks_p < 1e-6
    assert 0 < r.tv_noise < 0.05  # 1000 exact draws: TV at chance is small but never 0


def test_conditional_expected_counts_sum_each_samples_own_distribution():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])  # two prefixes, each deterministic
    r = position_result(2, exact_tally(torch.stack([a, b] * 50), torch.tensor([0, 1] * 50)))
    assert r.tv == pytest.approx(0.0, abs=1e-6) and r.top == [(0, 0.5, 0.5), (1, 0.5, 0.5)]
    wrong = position_result(2, exact_tally(torch.stack([a, b] * 50), torch.tensor([1, 0] * 50)))
    # the right counts, each token after the wrong prefix: counts (TV, chi-square) cannot see it, the PIT can
    assert wrong.tv == pytest.approx(0.0, abs=1e-6) and wrong.chi2_p == pytest.approx(1.0) and wrong.ks_p < 1e-6


def test_path_distributions_equal_one_forward_per_prefix(pair):  # noqa: F811
    sampling = SamplingParams(0.8, top_k=6)
    paths = [[3, 7, 2], [5], [1, 1]]
    probs = path_distributions(pair, PROMPT, paths, sampling)
    for path, rows in zip(paths, probs):
        for t in range(len(path)):
            alone = path_distributions(pair, PROMPT + path[:t], [[0]], sampling)[0, 0]
            assert torch.allclose(rows[t], alone, atol=1e-6)


@pytest.mark.parametrize("drafter,adaptive", [("model", "fixed"), ("hybrid", "acceptance"), ("lookup", "confidence"),
                                              ("tree", "confidence")])
def test_speculative_and_target_pass_and_the_controls_fail(pair, drafter, adaptive):  # noqa: F811
    """The target alone and the draft alone do not depend on the drafter or the adaptive mode: with the same seeds
    they draw the very same paths in every configuration, so, as `specviz prove` does, only the first runs them
    (`calibrate`); each configuration runs its own speculative sampler and always-accept control."""
    calibrate = (drafter, adaptive) == ("model", "fixed")
    config = DecodeConfig(k=2, sampling=SamplingParams(1.0), drafter=drafter, adaptive=adaptive, seed=11)
    final = list(prove(pair, PROMPT, config, ProofSettings(samples=320, length=4, control_samples=320),
                       calibrate=calibrate))[-1]
    by_name = {v.name: v for v in final.verdicts}
    expected = [True, True, False, False] if calibrate else [True, False]
    assert final.done == final.total == len(expected) * 320
    assert [v.expect_pass for v in final.verdicts] == expected
    for v in final.verdicts:
        assert v.as_expected, (v.name, v.min_p, v.positions)
        assert len(v.positions) == 4 and v.samples == 320
    assert not by_name["speculative"].rejected and by_name["always accept (control)"].rejected
    assert by_name["draft alone (control)"].rejected if calibrate else "draft alone (control)" not in by_name
    if drafter not in ("lookup", "tree"):  # lookup rarely proposes anything on this prompt; a tree's rounds are
        # not chains
        assert by_name["speculative"].extra["drafts_after_clean_sweep"] > 0


def test_later_configurations_skip_the_samplers_no_drafter_changes(pair):  # noqa: F811
    settings = ProofSettings()
    assert [s.name for s in samplers(pair, settings)] == ["speculative", "target alone", "draft alone (control)",
                                                          "always accept (control)"]
    assert [s.name for s in samplers(pair, settings, calibrate=False)] == ["speculative", "always accept (control)"]
    config = DecodeConfig(k=2, sampling=SamplingParams(1.0), seed=3)
    final = list(prove(pair, PROMPT, config, ProofSettings(samples=16, control_samples=16), calibrate=False))[-1]
    assert [v.name for v in final.verdicts] == ["speculative", "always accept (control)"] and final.total == 32


def test_greedy_is_not_a_distribution_test(pair):  # noqa: F811
    with pytest.raises(ValueError, match="temperature > 0"):
        next(prove(pair, PROMPT, DecodeConfig(), ProofSettings()))


def test_greedy_identity_matrix_against_transformers_generate():
    from specviz.models.tiny import tiny_pair

    tiny = tiny_pair()
    configs = matrix(DecodeConfig(max_new_tokens=12, sampling=SamplingParams(0.0)), ["model", "hybrid"],
                     ["fixed", "acceptance"], [1, 4])
    rows = list(identity(tiny, [5, 6, 7], configs))
    assert len(rows) == 8 and {(r.drafter, r.adaptive, r.k) for r in rows} == {
        (d, a, k) for d in ("model", "hybrid") for a in ("fixed", "acceptance") for k in (1, 4)}
    assert all(r.identical and r.first_difference is None for r in rows), rows


@pytest.mark.parametrize("broken_control, code_expected", [(False, 0), (True, 1)], ids=["every control detected",
                                                                                      "a control not detected"])
def test_prove_command_writes_its_report_and_exits_by_the_verdicts(tmp_path, capsys, monkeypatch, broken_control,
                                                                   code_expected):
    """On the tiny pair with a draft far from its target (noise 0.5 on its weights, not 0.03), 16 paths see
    every control's error (each control's smallest p-value is below 1e-6, its threshold about 1e-4: alpha 1e-3
    over its 7 tests at most): exit 0. With the always-accept control's rule replaced by the exact one (its name
    kept), that control samples the target's own distribution and cannot be detected: the command says so and
    exits 1."""
    import functools
    import json

    import specviz.models.loading as loading
    import specviz.runs.proof as proof
    from specviz.engine.speculative import EXACT
    from specviz.models.tiny import tiny_pair

    monkeypatch.setattr(loading, "tiny_pair", functools.partial(tiny_pair, noise=0.5))
    if broken_control:
        monkeypatch.setattr(proof, "ALWAYS_ACCEPT", replace(EXACT, name=proof.ALWAYS_ACCEPT.name))
    out = tmp_path / "proof.json"
    code = main(["prove", "--draft", "tiny", "--target", "tiny", "--samples", "16", "--control-samples", "16",
                 "--drafter", "model,lookup", "--identity", "--identity-tokens", "6", "--json", str(out),
                 "--html", str(tmp_path / "proof.html"), "--no-progress"])
    report = json.loads(out.read_text())
    assert [(r["drafter"], r["adaptive"]) for r in report["runs"]] == [("model", "confidence"), ("lookup", "confidence")]
    assert len(report["identity"]) == 2 * 4 and report["identical"]
    detected = not broken_control  # the always-accept control: rejected, as a wrong sampler must be
    assert [(r["drafter"], v["name"], v["rejected"], v["as_expected"]) for r in report["runs"] for v in r["verdicts"]
            ] == [("model", "speculative", False, True), ("model", "target alone", False, True),
                  ("model", "draft alone (control)", True, True),
                  ("model", "always accept (control)", detected, detected),
                  ("lookup", "speculative", False, True),
                  ("lookup", "always accept (control)", detected, detected)]
    assert report["all_as_expected"] is (not broken_control)
    assert code == code_expected
    text = capsys.readouterr().out
    assert format_table(report) in text and "<table>" in report_html(report)
    if broken_control:
        assert text.count("NOT DETECTED") == 2 and "SOME SAMPLERS NOT AS EXPECTED" in text
    else:
        assert "NOT DETECTED" not in text and "all as expected" in text
        assert text.count("rejected (as it must be)") == 3  # the model drafter's two controls, the lookup's one


def test_prove_refuses_greedy_and_bad_lists(capsys):
    assert main(["prove", "--draft", "tiny", "--target", "tiny", "--temperature", "0"]) == 2
    assert main(["prove", "--draft", "tiny", "--target", "tiny", "--drafter", "model,nope"]) == 2
    err = capsys.readouterr().err
    assert "needs sampling" in err and "nope" in err


def test_prove_loads_without_progress_bars_when_asked(monkeypatch):
    """--no-progress reaches the load: transformers' "Loading weights" bars stay off too (issue 48)."""
    import specviz.models as models

    class Loaded(Exception):
        pass

    loads = []

    def load(spec, **kw):
        loads.append(kw)
        raise Loaded  # the load is all this test needs

    monkeypatch.setattr(models, "load_spec", load)
    for flags, shown in (([], True), (["--no-progress"], False)):
        with pytest.raises(Loaded):
            main(["prove", "--draft", "tiny", "--target", "tiny", *flags])
        assert loads.pop() == {"progress": shown}


@pytest.mark.parametrize("n", [40, 400])
def test_the_chance_level_of_tv_is_the_mean_tv_of_n_multinomial_draws(n):
    """The closed form against 20,000 multinomial draws of n (Monte Carlo: within 2 %), on a skewed p with a
    long tail, as a vocabulary's is."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(50, 0.3))
    mean_tv = np.mean([0.5 * np.abs(rng.multinomial(n, p) / n - p).sum() for _ in range(20_000)])
    t = exact_tally(torch.tensor(p, dtype=torch.float64).expand(n, 50), torch.tensor(rng.choice(50, n, p=p)))
    assert position_result(1, t).tv_noise == pytest.approx(mean_tv, rel=0.02)
    assert Counter(t.observed).total() == n
