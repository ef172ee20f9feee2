"""The rule over siblings (tree speculation), proven exactly: the emitted token's distribution, computed over every
branch (which candidate is accepted, if any) and, for sampled candidates, every order they can be drawn in, is p.

The branch probabilities come from the function itself (each try's min(1, p/q) and the p left after the
rejections), forced down each branch with u = 0 (accept) or u = 1 (reject); what is checked is that the
composition of tries gives back p. The known trap, deterministic top-k candidates treated as if drawn from q,
must fail the same check.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specviz.engine.siblings import try_siblings, without

V = 6


def dist(seed: int, zeros: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    d[torch.randperm(V, generator=g)[:zeros]] = 0.0
    return d / d.sum()


def emitted(p: torch.Tensor, q: torch.Tensor | None, candidates: list[int]) -> torch.Tensor:
    """P(emitted token) for one fixed list of candidates, over every branch."""
    out = torch.zeros(V, dtype=torch.float64)
    m = len(candidates)
    for j in range(m + 1):  # candidate j accepted after j rejections; j = m: all rejected
        tries, left = try_siblings(p, q, candidates, [1.0] * j + [0.0] * (m - j))
        reach = 1.0
        for t in tries[:j]:
            assert not t.accepted
            reach *= 1 - t.accept_prob
        if j < m:
            if tries[j].accepted:  # (u = 0 accepts whatever has a chance at all)
                out[candidates[j]] += reach * tries[j].accept_prob
        else:
            out += reach * left
    return out


def order_prob(q: torch.Tensor, order: tuple[int, ...]) -> float:
    """P(drawing these candidates in this order from q, without replacement)."""
    prob, left = 1.0, q
    for x in order:
        prob *= float(left[x])
        left = without(left, x)
    return prob


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [1, 2, 3])
def test_deterministic_candidates_as_point_masses_emit_exactly_p(seed, m):
    p = dist(seed, zeros=seed % 3)
    candidates = torch.randperm(V, generator=torch.Generator().manual_seed(seed + 100))[:m].tolist()
    torch.testing.assert_close(emitted(p, None, candidates), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [1, 2, 3])
def test_candidates_drawn_without_replacement_emit_exactly_p(seed, m):
    p, q = dist(seed, zeros=seed % 2), dist(seed + 50, zeros=(seed + 1) % 3)
    total = torch.zeros(V, dtype=torch.float64)
    orders = 0.0
    for order in itertools.permutations(range(V), m):
        if (w := order_prob(q, order)) > 0:
            total += w * emitted(p, q, list(order))
            orders += w
    assert orders == pytest.approx(1.0, abs=1e-12)  # every way the candidates can be drawn, counted once
    torch.testing.assert_close(total, p, rtol=0, atol=1e-12)


def test_a_rejected_candidate_never_comes_back_and_all_rejected_leaves_a_distribution():
    """A candidate that can be rejected at all (min(1, p/q) < 1) had p <= q, so what is left gives it no mass."""
    p, q = dist(1), dist(2)
    tries, left = try_siblings(p, q, [0, 1, 2, 3], [1.0] * 4)
    assert [t.accepted for t in tries] == [False] * 4 and float(left.sum()) == pytest.approx(1.0)
    rejectable = [t.token for t in tries if t.accept_prob < 1]
    assert rejectable and float(left[rejectable].sum()) == 0.0
    tries, left = try_siblings(p, None, [3], [1.0])
    assert float(left[3]) == 0.0 and float(left.sum()) == pytest.approx(1.0)


def test_greedy_point_masses_accept_exactly_the_argmax():
    p = torch.zeros(V, dtype=torch.float64)
    p[4] = 1.0
    tries, _ = try_siblings(p, None, [2, 4, 5], [0.0, 0.0, 0.0])
    assert [(t.token, t.accepted) for t in tries] == [(2, False), (4, True)]


def test_negative_control_top_k_treated_as_sampled_from_q_is_not_exact():
    """The trap: the draft's two most likely tokens, tried as if drawn from q. The same exact check rejects it."""
    p, q = dist(3), dist(4)
    top2 = q.topk(2).indices.tolist()
    wrong = emitted(p, q, top2)
    assert 0.5 * float((wrong - p).abs().sum()) > 0.02
    torch.testing.assert_close(emitted(p, None, top2), p, rtol=0, atol=1e-12)  # as point masses: exact


@pytest.mark.parametrize("seed", range(20))
def test_a_chain_walked_as_a_tree_is_todays_rule_exactly(seed):
    """A width-1 tree (each node one child) with the same uniforms decides exactly as `rules.verify`: the same
    accepted prefix, and the same distribution for the correction (or the bonus)."""
    from specviz.engine.rules import residual, verify
    from specviz.engine.sampling import sample
    from specviz.engine.siblings import walk_tree

    g = torch.Generator().manual_seed(seed)
    k = 1 + seed % 5
    p = torch.stack([dist(seed * 10 + i, zeros=i % 2) for i in range(k + 1)]).float()
    q = torch.stack([dist(seed * 10 + 50 + i, zeros=(i + 1) % 2) for i in range(k)]).float()
    if seed % 4 == 0:
        q[: k // 2] = p[: k // 2]  # some positions where the draft is right, so long prefixes are accepted too
    tokens = torch.stack([sample(q[i], g) for i in range(k)])
    chain = verify(p, q, tokens, g)
    walked = walk_tree(list(range(-1, k - 1)), tokens.tolist(), p, q, chain.u.tolist())
    n = int(chain.n_accepted)
    assert walked.path == list(range(n)) and walked.bonus == (n == k)
    expected = torch.cat([residual(p[:k], q), p[k:]])[n]
    torch.testing.assert_close(walked.next_dist, expected, atol=1e-6, rtol=0)


def test_a_tree_walk_goes_down_the_accepted_sibling():
    """Greedy point masses: the root's children 5 and 4 (4 is the argmax), then 4's children 1 and 2 (2 is)."""
    from specviz.engine.siblings import walk_tree

    p_rows = torch.zeros(6, V, dtype=torch.float64)
    p_rows[0, 4] = p_rows[2, 2] = p_rows[4, 3] = p_rows[1, 0] = p_rows[3, 0] = p_rows[5, 0] = 1.0
    walked = walk_tree([-1, -1, 1, 1, 3], [5, 4, 1, 2, 0], p_rows, None, [0.0] * 5)
    assert walked.path == [1, 3] and not walked.bonus  # node 4 (token 0) is rejected: p says 3
    assert [(t.token, t.accepted) for t in walked.tries] == [(5, False), (4, True), (1, False), (2, True), (0, False)]
    assert int(walked.next_dist.argmax()) == 3
