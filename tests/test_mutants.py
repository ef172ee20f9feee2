"""Mutation tests: plausible bugs in the rule and the round loop, each one caught by the statistical tests.

Two harnesses, the same statistics as `test_statistical.py` (per-position chi-square and TV against the exact
target distribution, and a chi-square on the whole 3-token joint):
- the rule's pieces swapped inside `simulate` (the engine's `rules.verify` over the exact tables) at 2,000 samples;
- bugs of the round loops themselves, patched into `speculative_generate` and the tree's round loop (a q row one
  position behind, the target's p without its warp, the draft's q reported unwarped, the bonus read from the wrong
  row, a tree read with a chain's attention mask), caught by the end-to-end statistics at no more runs than the
  end-to-end tests take (fewer runs, less power: a mutant caught here is caught there).
A mutant counts as caught when its samples are rejected as draws from the target's distribution with p < 1e-6;
each prints its p-values. If one of these ever passes, the statistical tests have lost the power to see that bug.
Each runs the fewest runs (in round numbers) at which it is missed at most once in 10,000 tries, from the mutant's
output distribution (estimated from 5,000-20,000 runs on other seeds; counting only the per-position chi-squares,
so the joint's can only add): the numbers beside each size. Three keep the 1,000 the round loop's mutants all had
(the q reported without its warp needs them all: missed 9e-4 of the time by the per-position chi-squares alone).
"""

from __future__ import annotations

import pytest
import torch
from test_statistical import (  # noqa: F401 (pair, self_pair: the same fixtures, the same models)
    PROMPT, TEMPERATURE_1, WARPED, end_to_end, exact_joint, pair, self_pair, simulate, statistics, tables,
    tree_samples,
)

from specviz.engine import SamplingParams, rules, speculative, tree_round
from specviz.engine.drafters import Draft, ModelDrafter
from specviz.engine.plumbing import at, pad_vocab
from specviz.engine.sampling import draw, logits_to_probs

N = 2_000  # the rule's mutants: P(missed) 2e-5 for the correction from p (0.03 at 1,000), 0 in 200,000 tries for the
# other two (already at 400)
E2E = 1_000  # runs of the round loop per mutant at most: the end-to-end tests take 1,000 (self) to 8,000


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
        return rules.Verdict(n, token, at(next_dist, token), accept_prob, u, next_dist)
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


def drafts_with_q(change):
    """A mutant of the draft model's `propose`: the tokens it sampled, with `change(draft)` as the q it reports."""
    real = ModelDrafter.propose

    def propose(self, ids, history, k):
        d = real(self, ids, history, k)
        return Draft(d.tokens, change(d), d.logits)
    return propose


def q_one_row_behind(d: Draft):
    return torch.cat([d.q[:1], d.q[:-1]])  # token i judged by the q of the position before it


def warped_p_without_warp(logits, sampling):
    return logits_to_probs(logits, SamplingParams(sampling.temperature))  # top-k and top-p forgotten


def bonus_from_the_last_draft_row(logits, vocab):
    x = pad_vocab(logits, vocab)
    return torch.cat([x[:-1], x[-2:-1]]) if len(x) > 1 else x  # the bonus drawn from the row before its own


@pytest.mark.parametrize("where, name, mutant, sampling, runs", [
    # P(missed) 5e-6 at 1,000 (7e-4 at 800): position 2 sees it
    pytest.param(ModelDrafter, "propose", drafts_with_q(q_one_row_behind), TEMPERATURE_1, E2E, id="q one row behind"),
    # 9e-4 at 1,000 by the per-position chi-squares alone
    pytest.param(ModelDrafter, "propose", drafts_with_q(lambda d: torch.softmax(d.logits, -1)), WARPED, E2E,
                 id="q reported without its warp"),
    # 0 in 200,000 tries at 75 to 200 (2.5e-5 at 50)
    pytest.param(speculative, "logits_to_probs", warped_p_without_warp, WARPED, 200, id="p without its warp"),
    # position 3: 0 in 200,000 tries at 150 and 200 (4e-3 at 100)
    pytest.param(speculative, "pad_vocab", bonus_from_the_last_draft_row, TEMPERATURE_1, 200,
                 id="bonus from the wrong row"),
])
def test_a_mutated_round_loop_is_caught_end_to_end(pair, monkeypatch, where, name, mutant, sampling, runs):
    monkeypatch.setattr(where, name, mutant)
    stats = statistics(end_to_end(pair, sampling, runs)[0], exact_joint(tables(pair.target, sampling)))
    print(name, stats)
    assert caught(stats), stats


def test_a_tree_correction_that_forgets_the_siblings_tried_is_caught_end_to_end(pair, monkeypatch):
    """After the walk rejects every child it tried at a node, the correction must come from p without them (the
    point-mass residual); drawn from p itself, a rejected sibling can come back, and the draft's favourites are
    emitted too often."""
    monkeypatch.setattr(tree_round, "without", lambda dist, tokens: dist)
    # position 1: P(missed) 0 in 200,000 tries at 500 (5e-6 at 450, 0.015 at 300)
    stats = statistics(tree_samples(pair, 500)[0], exact_joint(tables(pair.target, TEMPERATURE_1)))
    print("tree, correction from p", stats)
    assert caught(stats), stats


def test_self_speculation_with_q_one_row_behind_is_caught(self_pair, monkeypatch):
    """The early exit's draft (a `ModelDrafter` over `EarlyExit`) with the same q bug: the self-speculation test's
    power against a subtle bug, not only the always-accept control's gross one."""
    monkeypatch.setattr(ModelDrafter, "propose", drafts_with_q(q_one_row_behind))
    # position 2: P(missed) 0 in 200,000 tries at 1,000 (1e-4 at 800)
    stats = statistics(end_to_end(self_pair, TEMPERATURE_1, E2E, "self")[0],
                       exact_joint(tables(self_pair.target, TEMPERATURE_1)))
    print("self drafter, q one row behind", stats)
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
