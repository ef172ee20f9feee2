"""The accept/reject rule of speculative sampling (Leviathan et al. 2023, Algorithm 1) as pure functions.

For each drafted token x ~ q: accept with probability min(1, p(x)/q(x)). At the first rejection,
sample from the residual norm(max(0, p - q)); if all K pass, sample a bonus token from the
target's next distribution. Then for every x:
    q(x) * min(1, p(x)/q(x)) + P(reject) * residual(x) = min(q, p)(x) + max(0, p - q)(x) = p(x),
so the emitted token is distributed exactly as the target's p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.engine.plumbing import at
from specviz.engine.sampling import draw


def acceptance_probs(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) for each drafted token x; p, q: [K, V], tokens: [K]."""
    px = p.gather(-1, tokens[:, None]).squeeze(-1)
    qx = q.gather(-1, tokens[:, None]).squeeze(-1)
    # qx > 0 whenever x was sampled from q; a token q gives no mass to is a drafter's bug (the round loop
    # raises on it): never accept it
    return torch.where(qx > 0, px / qx.clamp_min(torch.finfo(qx.dtype).tiny), torch.zeros_like(px)).clamp(max=1.0)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) = 1 - TV(p, q) row-wise: the probability that a token drawn from q is accepted, before
    it is drawn (the mean of min(1, p/q) over x ~ q). Greedy (point masses): 1 where the argmaxes agree, else 0."""
    return torch.minimum(p, q).sum(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) row-wise. Where p == q a rejection has probability 0, so any row works: use p."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


def accepted_prefix(accept_prob: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Number of leading drafted tokens accepted (u < min(1, p/q)), as a 0-d tensor."""
    return (u < accept_prob).long().cumprod(0).sum()


@dataclass
class Verdict:
    n_accepted: torch.Tensor  # 0-d: leading drafted tokens kept
    next_token: torch.Tensor  # 0-d: the correction (n < K) or the bonus (n == K)
    next_prob: torch.Tensor  # 0-d: its probability under the distribution it was drawn from
    accept_prob: torch.Tensor  # [K]
    u: torch.Tensor  # [K]
    drawn_from: torch.Tensor  # [V]: what next_token was drawn from, row n's residual or the bonus row


def verify(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, generator, greedy: bool = False) -> Verdict:
    """Decide a whole round on the device. p: [K+1, V] (target, incl. the bonus row), q: [K, V].

    Greedy (p and q point masses): min(1, p/q) is 0 or 1, so nothing is random; u = 0 and the next token
    is the argmax of its point mass, and the generator is left untouched."""
    k = tokens.shape[0]
    accept_prob = acceptance_probs(p[:k], q, tokens)
    u = torch.zeros(k, device=p.device) if greedy else torch.rand(k, generator=generator, device=p.device)
    n = accepted_prefix(accept_prob, u)
    next_dist = next_distribution(p, q, n)
    next_token = draw(next_dist, next_dist, greedy, generator)
    return Verdict(n, next_token, at(next_dist, next_token), accept_prob, u, next_dist)


def next_distribution(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Row n of [residual rows..., bonus row]: the residual at the first rejection, or p's last row if every draft
    passed. Only row n's residual is made: all K of them cost 15.8 ms a round for 13 rows of a 152k vocabulary on a
    2-core Xeon with AMX (family 6 model 167; row n's alone 0.46 ms), and the round uses one."""
    k = q.shape[0]
    row = at(p, n)
    if k == 0:
        return row
    return torch.where(n < k, residual(row, at(q, n.clamp(max=k - 1))), row)
