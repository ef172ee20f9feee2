"""The accept/reject rule over siblings: several candidates for one position, tried in turn (tree speculation).

A draft tree offers, at a node, several children for the next token. Trying them one after another stays exact
when each try is the ordinary rule against what is left of p:

- candidates **drawn from q without replacement** (SpecTr, Sequoia): try x with min(1, p(x)/q(x)); on rejection
  p <- norm(max(0, p - q)) and q <- q without x, renormalised (the distribution the next candidate was drawn
  from). A rejected x has p(x) <= q(x), so the new p gives it no mass and it can never come back.
- **deterministic candidates** (the draft's top-k, say) are point masses, q = δ_x: accept x with p(x); on
  rejection p <- p without x, renormalised. Treating them as if they had been sampled from q is not exact.

When every candidate is rejected, the correction is drawn from the p that is left. Each try is the one-candidate
identity of `rules.py` (q(x)·min(1, p/q) + P(reject)·residual(x) = p(x)) applied to the p and q of that try, so
by induction the emitted token is distributed exactly as the target's p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.engine.rules import residual


def without(dist: torch.Tensor, x: int) -> torch.Tensor:
    """`dist` with token x removed, renormalised (all zeros when x held all the mass)."""
    out = dist.clone()
    out[x] = 0.0
    mass = out.sum()
    return out / mass if mass > 0 else out


@dataclass
class SiblingTry:
    token: int
    accept_prob: float  # min(1, p(x)/q(x)) against the p and q of this try
    u: float
    accepted: bool


def try_siblings(p: torch.Tensor, q: torch.Tensor | None, candidates: list[int], u: list[float]
                 ) -> tuple[list[SiblingTry], torch.Tensor]:
    """Try `candidates` (in the order they were drawn) for one position. p: [V] the target's distribution there;
    q: [V] the draft's, which the candidates were drawn from without replacement, or None for deterministic
    candidates (point masses); u: one uniform draw per candidate. Returns the tries up to the accepted one and
    the p left after the rejections (the correction's distribution when none was accepted)."""
    tries = []
    for x, ux in zip(candidates, u):
        px = float(p[x])
        qx = 1.0 if q is None else float(q[x])
        a = min(1.0, px / qx) if qx > 0 else 0.0
        tries.append(SiblingTry(x, a, ux, ux < a))
        if ux < a:
            return tries, p
        if q is None:
            p = without(p, x)
        else:
            p, q = residual(p, q), without(q, x)
    return tries, p
