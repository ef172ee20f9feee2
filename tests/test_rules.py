"""The accept/reject rule: the analytic identity that makes speculative sampling exact, hand-computed
cases of each pure function, `verify` under a fixed generator, and the greedy reduction."""

from __future__ import annotations

import pytest
import torch

from specviz.engine.rules import acceptance_probs, accepted_prefix, residual, verify
from specviz.engine.sampling import SamplingParams, logits_to_probs

VOCABS = [1, 2, 7, 100, 50_000]


def random_dist(v: int, gen: torch.Generator, zero_fraction: float = 0.0) -> torch.Tensor:
    """A random distribution with heavy-ish tails; `zero_fraction` of its entries forced to 0."""
    x = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    if zero_fraction:
        x[torch.rand(v, generator=gen) < zero_fraction] = 0
    if x.sum() == 0:
        x[torch.randint(v, (1,), generator=gen)] = 1
    return (x / x.sum()).float()


def one_hot(v: int, i: int) -> torch.Tensor:
    x = torch.zeros(v)
    x[i % v] = 1.0
    return x


def cases(v: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(v)
    p, q = random_dist(v, gen), random_dist(v, gen)
    sparse_q = random_dist(v, gen, zero_fraction=0.5)  # zeros where p > 0
    sparse_p = random_dist(v, gen, zero_fraction=0.5)  # zeros where q > 0
    return {
        "random": (p, q),
        "q zero where p > 0": (p, sparse_q),
        "p zero where q > 0": (sparse_p, q),
        "both sparse": (sparse_p, sparse_q),
        "p == q": (p, p.clone()),
        "one-hot p": (one_hot(v, 3), q),
        "one-hot q": (p, one_hot(v, 5)),
        "one-hot p == q": (one_hot(v, 2), one_hot(v, 2)),
        "one-hot p != q": (one_hot(v, 1), one_hot(v, 6)),
    }


def emitted_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(emit x) for one drafted position: x ~ q kept with min(1, p/q), else a draw from the residual.

    `acceptance_probs` is applied with K = V positions of a 1-token vocabulary, so it returns
    min(1, p(x)/q(x)) for every x at once without a [V, V] matrix.
    """
    v = p.shape[0]
    accept = acceptance_probs(p[:, None], q[:, None], torch.zeros(v, dtype=torch.long))
    kept = q * accept
    return kept + (1 - kept.sum()) * residual(p[None], q[None])[0]


@pytest.mark.parametrize("v", VOCABS)
def test_emitted_token_is_distributed_exactly_as_p(v):
    for name, (p, q) in cases(v).items():
        got = emitted_distribution(p, q)
        torch.testing.assert_close(got, p, atol=2e-6, rtol=1e-5, msg=lambda m: f"{name} (V={v}): {m}")


def test_acceptance_probs_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.0, 1.0, 0.0]])
    q = torch.tensor([[0.25, 0.6, 0.15], [0.25, 0.6, 0.15], [0.25, 0.6, 0.15], [0.5, 0.5, 0.0]])
    got = acceptance_probs(p, q, torch.tensor([0, 1, 2, 0]))
    torch.testing.assert_close(got, torch.tensor([1.0, 0.5, 1.0, 0.0]))
    # a token its own q gives no mass was not sampled from q: never accepted (the round loop raises on it)
    torch.testing.assert_close(acceptance_probs(p[3:], q[3:], torch.tensor([2])), torch.tensor([0.0]))


def test_residual_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.25, 0.6, 0.15], [0.2, 0.2, 0.6]])
    # row 0: max(0, p - q) = [0.25, 0, 0.05] -> [5/6, 0, 1/6]; row 1: p == q, no rejection possible -> p
    torch.testing.assert_close(residual(p, q), torch.tensor([[5 / 6, 0.0, 1 / 6], [0.2, 0.2, 0.6]]))


@pytest.mark.parametrize("accept,u,expected", [
    ([1.0, 0.5, 1.0], [0.3, 0.7, 0.1], 1),  # 0.7 >= 0.5: rejected at position 1
    ([1.0, 0.5, 1.0], [0.3, 0.4, 0.99], 3),
    ([1.0, 0.5, 1.0], [0.3, 0.5, 0.1], 1),  # u == min(1, p/q) rejects: accept iff u < it
    ([0.0, 1.0], [0.0, 0.0], 0),  # p(x) = 0 is never accepted, even with u = 0
    ([0.9, 0.0, 1.0], [0.1, 0.5, 0.2], 1),  # nothing after a rejection counts, even if it would pass
    ([], [], 0),
])
def test_accepted_prefix_by_hand(accept, u, expected):
    assert int(accepted_prefix(torch.tensor(accept), torch.tensor(u))) == expected


def test_verify_uses_the_bonus_row_when_all_pass():
    v = 10
    tokens = torch.tensor([2, 5, 7])
    q = torch.stack([one_hot(v, 2), one_hot(v, 5), one_hot(v, 7)])
    p = torch.stack([one_hot(v, 2), one_hot(v, 5), one_hot(v, 7), one_hot(v, 9)])  # bonus row: 9
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        verdict = verify(p, q, tokens, gen)
        assert int(verdict.n_accepted) == 3 and int(verdict.next_token) == 9
        assert float(verdict.next_prob) == 1.0
        torch.testing.assert_close(verdict.u, torch.rand(3, generator=torch.Generator().manual_seed(seed)))
        torch.testing.assert_close(verdict.accept_prob, torch.ones(3))


def test_verify_corrects_from_row_n_of_the_residual():
    v = 10
    tokens = torch.tensor([2, 5, 7])
    q = torch.stack([one_hot(v, 2), one_hot(v, 5), one_hot(v, 7)])
    # position 0 passes surely; position 1 has p(5) = 0, so it is rejected and the residual there
    # is p itself (q's token removed): half on 3, half on 4
    p = torch.stack([one_hot(v, 2), 0.5 * (one_hot(v, 3) + one_hot(v, 4)), one_hot(v, 7), one_hot(v, 9)])
    seen = set()
    for seed in range(40):
        verdict = verify(p, q, tokens, torch.Generator().manual_seed(seed))
        assert int(verdict.n_accepted) == 1
        assert float(verdict.next_prob) == 0.5
        seen.add(int(verdict.next_token))
    assert seen == {3, 4}  # both halves of the residual occur; the bonus (9) and the draft's 7 never do


def test_verify_with_no_drafted_tokens_samples_the_bonus():
    p = one_hot(6, 4)[None]
    verdict = verify(p, torch.empty(0, 6), torch.empty(0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert int(verdict.n_accepted) == 0 and int(verdict.next_token) == 4


def test_verify_is_reproducible_with_a_seeded_generator():
    gen = torch.Generator().manual_seed(11)
    p = torch.stack([random_dist(50, gen) for _ in range(5)])
    q = torch.stack([random_dist(50, gen) for _ in range(4)])
    tokens = torch.multinomial(q, 1, generator=gen).squeeze(-1)
    runs = [verify(p, q, tokens, torch.Generator().manual_seed(s)) for s in (3, 3)]
    for a, b in zip(vars(runs[0]).values(), vars(runs[1]).values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_reduces_to_argmax_matching(seed):
    """Point masses: accept iff the drafted token is the target's argmax; the correction is that argmax."""
    gen = torch.Generator().manual_seed(seed)
    v, k = 30, 6
    target_logits = torch.randn(k + 1, v, generator=gen)
    p = logits_to_probs(target_logits, SamplingParams(0.0))
    argmax = target_logits.argmax(-1)
    for mismatch in range(k + 1):  # draft agrees with the target up to `mismatch`
        tokens = argmax[:k].clone()
        if mismatch < k:
            tokens[mismatch] = (argmax[mismatch] + 1 + seed) % v
        q = logits_to_probs(torch.randn(k, v, generator=gen).scatter(-1, tokens[:, None], 99.0), SamplingParams(0.0))
        torch.testing.assert_close(acceptance_probs(p[:k], q, tokens), (tokens == argmax[:k]).float())
        state = gen.get_state()
        verdict = verify(p, q, tokens, gen, greedy=True)
        assert torch.equal(gen.get_state(), state)  # decided without a random number
        assert int(verdict.n_accepted) == mismatch and torch.equal(verdict.u, torch.zeros(k))
        assert int(verdict.next_token) == int(argmax[mismatch])  # the correction, or the bonus if mismatch == k
        assert int(verify(p, q, tokens, gen).n_accepted) == mismatch  # the sampled path agrees on point masses
        if mismatch < k:
            torch.testing.assert_close(verdict.drawn_from, one_hot(v, int(argmax[mismatch])))
