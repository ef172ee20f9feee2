"""Mutation tests: plausible bugs in the rule and the round loop, each one caught by the statistical test.

Each test swaps one piece of the engine for a subtly wrong version and runs the same sampler and
statistics as `test_statistical.py` (the engine's rule over the exact tables, or `speculative_generate`
itself for the cache mutant) at a few thousand samples; a mutant counts as caught when its samples are
rejected as draws from the target's distribution with p < 1e-6. If one of these ever passes, the
statistical test has lost the power to see that bug.
"""

from __future__ import annotations

import pytest
import torch
from test_statistical import (  # noqa: F401 (pair: the same fixture, the same models)
    TEMPERATURE_1, end_to_end, exact_joint, pair, simulate, statistics, tables,
)

from specviz.engine import SamplingParams, rules, speculative
from specviz.engine.plumbing import at
from specviz.engine.sampling import draw

N = 5_000
SHARP = SamplingParams(0.7, top_k=6)  # a warp that moves q well away from the draft's plain softmax


def caught(stats: dict) -> bool:
    return stats["p_joint"] < 1e-6 or min(stats["p"]) < 1e-6


def verify_with(accept_rows=lambda p, k: p[:k], residual=rules.residual, bonus_row=lambda p, k: p[k:]):
    """The engine's `verify` with one of its pieces replaced (defaults: the real ones)."""
    def verify(p, q, tokens, generator, greedy=False):
        k = tokens.shape[0]
        accept_prob = rules.acceptance_probs(accept_rows(p, k), q, tokens)
        u = torch.rand(k, generator=generator)
        n = rules.accepted_prefix(accept_prob, u)
        res = residual(p[:k], q)
        next_dist = at(torch.cat([res, bonus_row(p, k)]), n)
        token = draw(next_dist, next_dist, greedy, generator)
        return rules.Verdict(n, token, at(next_dist, token), accept_prob, u, res)
    return verify


@pytest.fixture(scope="module")
def plain(pair):
    return tables(pair.target, TEMPERATURE_1), tables(pair.draft, TEMPERATURE_1)


def test_the_unmutated_rule_passes_at_this_sample_size(plain, monkeypatch):
    monkeypatch.setattr(rules, "verify", verify_with())  # the harness itself must not be what fails
    p, q = plain
    stats = statistics(simulate(p, q, N, seed=1), exact_joint(p))
    assert not caught(stats) and min(stats["p"]) > 1e-3, stats


@pytest.mark.parametrize("mutant", [
    pytest.param(verify_with(residual=lambda p, q: p), id="correction from p, not the residual"),
    pytest.param(verify_with(bonus_row=lambda p, k: p[k - 1:k] if k else p[k:]), id="bonus from the wrong row"),
    pytest.param(verify_with(accept_rows=lambda p, k: p[1:k + 1]), id="p rows off by one"),
])
def test_a_mutated_rule_is_caught(plain, monkeypatch, mutant):
    monkeypatch.setattr(rules, "verify", mutant)
    p, q = plain
    stats = statistics(simulate(p, q, N, seed=1), exact_joint(p))
    print(stats)
    assert caught(stats), stats


def test_always_accept_is_caught(plain, monkeypatch):
    monkeypatch.setattr(rules, "accepted_prefix", lambda accept_prob, u: torch.tensor(accept_prob.shape[0]))
    p, q = plain
    assert caught(statistics(simulate(p, q, N, seed=1), exact_joint(p)))


def test_q_from_the_unwarped_draft_is_caught(pair, monkeypatch):
    """The draft samples from its warped q, but the rule is handed its plain softmax."""
    p, q_warped = tables(pair.target, SHARP), tables(pair.draft, SHARP)
    q_plain = tables(pair.draft, SamplingParams(1.0))
    real = rules.verify

    def verify(p_rows, q_rows, tokens, generator, greedy=False):
        unwarped = torch.stack([q_plain[key] for key in keys_of(q_rows)]) if len(q_rows) else q_rows
        return real(p_rows, unwarped, tokens, generator, greedy)

    def keys_of(rows):  # which prefix each q row belongs to: look it up by value in the warped table
        return [next(key for key, row in q_warped.items() if torch.equal(row, r)) for r in rows]

    monkeypatch.setattr(rules, "verify", verify)
    stats = statistics(simulate(p, q_warped, N, seed=1), exact_joint(p))
    print(stats)
    assert caught(stats), stats


def test_a_target_cache_not_cropped_after_a_rejection_fails_loudly(pair, monkeypatch):
    """Keeping the rejected drafts in the target's KV cache puts the cache ahead of the committed tokens. The
    round loop feeds the target exactly what its cache lacks, so such a run cannot decode on quietly from a
    context that saw the rejected tokens: it fails at once (caught by every end-to-end test)."""
    monkeypatch.setattr(speculative, "rollback", lambda cache, keep: None)
    # the cache already holds every token the round would feed: the target's forward gets none (not any error)
    with pytest.raises(RuntimeError, match="tensor of 0 elements"):
        end_to_end(pair, TEMPERATURE_1, 50)


def unnormalised(p, q):
    return (p - q).clamp_min(0.0)


@pytest.mark.parametrize("residual, exact", [(rules.residual, True), (unnormalised, False)],
                         ids=["the real residual", "mutant: residual not renormalised"])
def test_a_residual_left_unnormalised_shows_in_the_reported_probability(plain, monkeypatch, residual, exact):
    """`sample` draws by inverse CDF scaled to the row's total, so an unnormalised residual still emits the
    right tokens (no statistical test can see it); what it breaks is the probability a round reports for its
    correction, which must be the residual's own. That is checked exactly."""
    p, q = plain
    p_rows, q_rows = torch.stack([p[()], p[(3,)]]), q[()][None]
    monkeypatch.setattr(rules, "verify", verify_with(residual=residual))
    corrections = 0
    for seed in range(200):
        tokens = torch.tensor([int(torch.multinomial(q_rows[0], 1, generator=torch.Generator().manual_seed(seed)))])
        verdict = rules.verify(p_rows, q_rows, tokens, torch.Generator().manual_seed(seed))
        if int(verdict.n_accepted) == 0:  # a correction was drawn from the residual
            corrections += 1
            truth = float(rules.residual(p_rows[:1], q_rows)[0, verdict.next_token])
            assert (abs(float(verdict.next_prob) - truth) < 1e-6) == exact
    assert corrections > 20
