"""β = Σ min(p, q): what acceptance should be at each drafted position, beside what happened.

β is 1 - TV(p, q), computed independently here; over many sampled rounds the realised acceptance at position 1
matches the mean β (a Poisson-binomial 99 % range), and a mutant that takes β from the unwarped distributions
while the rule uses the warped ones falls outside it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specviz.analysis.atlas import beta_range, findings
from specviz.analysis.rejections import PromptRun
from specviz.engine import DecodeConfig, SamplingParams, speculative_generate
from specviz.engine import speculative
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, round_from_dict
from specviz.engine.rules import overlap
from specviz.engine.sampling import logits_to_probs
from specviz.models.tiny import tiny_pair

WARPED = SamplingParams(0.7, top_k=6, top_p=0.9)


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), WARPED], ids=["unwarped", "warped"])
def test_beta_is_one_minus_the_total_variation_distance(sampling):
    gen = torch.Generator().manual_seed(3)
    p = logits_to_probs(3 * torch.randn(5, 40, generator=gen), sampling)
    q = logits_to_probs(3 * torch.randn(5, 40, generator=gen), sampling)
    tv = 0.5 * np.abs(p.numpy() - q.numpy()).sum(-1)
    np.testing.assert_allclose(overlap(p, q).numpy(), 1 - tv, atol=1e-6)
    np.testing.assert_allclose(overlap(p, p).numpy(), 1.0, atol=1e-6)


def test_greedy_beta_is_one_where_the_argmaxes_agree_else_zero():
    logits = torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.2, 0.1]])
    draft = torch.tensor([[0.0, 3.0, 1.0], [0.1, 0.9, 0.2]])
    greedy = SamplingParams(0.0)
    assert overlap(logits_to_probs(logits, greedy), logits_to_probs(draft, greedy)).tolist() == [1.0, 0.0]


def first_positions(pair, runs: int) -> tuple[int, list[float]]:
    """Position 1 of every round of `runs` seeded warped runs: how many were accepted, and their βs."""
    accepted, betas = 0, []
    for seed in range(runs):
        config = DecodeConfig(k=3, max_new_tokens=12, adaptive="fixed", sampling=WARPED, seed=seed)
        for r in speculative_generate(pair, [2, 5, 7], config):
            if r.drafted and r.drafted[0].status != NOT_VERIFIED:
                accepted += r.drafted[0].status == ACCEPTED
                betas.append(r.drafted[0].beta)
    return accepted, betas


def within(accepted: int, betas: list[float]) -> bool:
    low, high = beta_range(betas)
    return low <= accepted / len(betas) <= high


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.15)  # a draft that disagrees often enough for β to matter (mean β about 0.33)


RUNS = 150
# The mutant's mean β (~0.55) is far from the realised rate (~0.34): bootstrapped from 600 runs on other seeds, 30
# runs (~230 first positions) put the rate inside the mutant's range 0 times in 20,000 tries (4e-4 at 20 runs)
MUTANT_RUNS = 30


def test_realised_acceptance_at_position_one_follows_the_mean_beta(pair):
    accepted, betas = first_positions(pair, RUNS)
    print("position 1:", accepted, "of", len(betas), "accepted; mean β", sum(betas) / len(betas),
          "range", beta_range(betas))
    assert len(betas) > 500 and 0.2 < sum(betas) / len(betas) < 0.95  # not degenerate
    assert within(accepted, betas)


def test_a_beta_from_the_unwarped_distributions_is_caught(pair, monkeypatch):
    """The mutant: β from the temperature-1 softmaxes while the rule used the warped p and q."""
    def unwarped(draft, logits, p):
        return overlap(torch.softmax(logits[:draft.k], -1), torch.softmax(draft.logits.float(), -1))

    monkeypatch.setattr(speculative, "_beta", unwarped)
    accepted, betas = first_positions(pair, MUTANT_RUNS)  # the range narrows with more runs: caught there too
    print("mutant position 1:", accepted, "of", len(betas), "; mean β", sum(betas) / len(betas),
          "range", beta_range(betas))
    assert not within(accepted, betas)


def test_a_round_s_expected_accepted_length_and_older_traces():
    config = DecodeConfig(k=3, max_new_tokens=8, adaptive="fixed", sampling=WARPED, seed=1)
    r = next(speculative_generate(tiny_pair(noise=0.15), [2, 5, 7], config))
    b = [t.beta for t in r.drafted]
    assert r.expected_accepted == pytest.approx(b[0] + b[0] * b[1] + b[0] * b[1] * b[2])
    old = r.to_dict()
    for t in old["drafted"]:
        del t["beta"]  # a trace recorded before β was
    replayed = round_from_dict(old)
    assert replayed.drafted[0].beta is None and replayed.expected_accepted is None


def test_the_atlas_flags_a_prompt_whose_acceptance_falls_outside_what_beta_predicts(pair):
    config = DecodeConfig(k=3, max_new_tokens=40, adaptive="fixed", sampling=WARPED, seed=2)
    rounds = list(speculative_generate(pair, [2, 5, 7], config))
    honest = PromptRun("honest", "x", "p", (2, 5, 7), tuple(rounds), greedy=False)
    # the same rounds with every β claimed to be 1: a realised rate below 100 % is then far outside
    liar = PromptRun("liar", "x", "p", (2, 5, 7), tuple(round_from_dict({**r.to_dict(), "drafted": [
        {**t, "beta": 1.0 - 1e-9} for t in r.to_dict()["drafted"]]}) for r in rounds), greedy=False)
    rows = {row.id: row for row in findings([honest, liar], None).prompts}
    assert rows["honest"].outside_expected is False and rows["liar"].outside_expected is True
    tested = [t for r in rounds for t in r.drafted if t.status != NOT_VERIFIED]
    assert rows["honest"].tested.n == len(tested)
    assert rows["honest"].tested.expected == pytest.approx(sum(t.beta for t in tested) / len(tested))
    low, high = rows["honest"].expected_range
    assert low < rows["honest"].tested.expected < high and not math.isnan(low)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_the_lesson_s_measured_acceptance_follows_one_minus_tv(temperature):
    """The How it works lesson: at each temperature, β is 1 - TV of the two distributions shown, and the rounds
    through the rule land inside the range β predicts."""
    from specviz.analysis.overlap_lesson import beta_curve, overlap_point

    point = overlap_point(temperature)
    tv = 0.5 * np.abs(np.array(point.p) - np.array(point.q)).sum()
    assert point.beta == pytest.approx(1 - tv, abs=1e-6) == beta_curve([temperature])[0]
    low, high = point.expected_range
    assert low <= point.measured <= high


def test_the_lesson_is_in_the_how_it_works_tab_and_moves_with_its_slider(tiny):
    from specviz.models import PairSpec
    from specviz.settings.limits import Limits
    from specviz.serving.session import Session
    from specviz.server import build_server
    from specviz.ui.lesson import lesson_view

    demo = build_server(Session(tiny, PairSpec("tiny", "tiny")), Limits())
    ids = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    slider = ids["sv-lesson-t"]
    assert (slider._id, "change") in {(t[0], t[1]) for dep in demo.config["dependencies"] for t in dep["targets"]}
    cold, hot = lesson_view(0.3)[0], lesson_view(2.5)[0]
    assert "β = 1 − TV(p, q)" in cold and cold != hot
