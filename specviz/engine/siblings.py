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


def without(dist: torch.Tensor, x: int | list[int]) -> torch.Tensor:
    """`dist` with token x (or tokens x) removed, renormalised (all zeros when x held all the mass)."""
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


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """Each node's children in node order (-1: the root's), from each node's parent."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    return children


@dataclass
class TreeVerdict:
    path: list[int]  # the accepted nodes, from a child of the root down
    tries: list[SiblingTry]  # every candidate tried, in order
    next_dist: torch.Tensor  # [V]: the correction's distribution (what is left of p) or the bonus's
    bonus: bool  # the walk ended on an accepted node with no children


def walk_tree(parents: list[int], tokens: list[int], p_rows: torch.Tensor, q_rows: torch.Tensor | None,
              u: list[float]) -> TreeVerdict:
    """Decide a round of tree speculation. Row 0 of `p_rows` is the target's distribution for the root's
    children, row 1 + i the one for node i's children; `q_rows` likewise the draft's, which each node's children
    were drawn from without replacement in node order (None: deterministic children, point masses); `u` one
    uniform per node. From the root, try the children with `try_siblings`; go down into the accepted one; stop
    when all are rejected (the correction) or at an accepted leaf (the bonus). A chain (each node one child) is
    today's rule exactly: the same acceptances and the same correction or bonus distribution."""
    children = children_of(parents)
    node, path, tries = -1, [], []
    while True:
        row = node + 1
        kids = children.get(node, [])
        if not kids:
            return TreeVerdict(path, tries, p_rows[row], bonus=True)
        tried, left = try_siblings(p_rows[row], None if q_rows is None else q_rows[row], [tokens[c] for c in kids],
                                   [u[c] for c in kids])
        tries += tried
        if not tried[-1].accepted:
            return TreeVerdict(path, tries, left, bonus=False)
        node = kids[len(tried) - 1]
        path.append(node)


def walk_point_masses(parents: list[int], p_at: list[float], u: list[float]) -> tuple[TreeVerdict, list[int]]:
    """`walk_tree` for deterministic children (point masses), from the target's probability of each node alone:
    `p_at[i]` is p(x_i) in its parent's row. The point-mass rule reads nothing else of p until the correction,
    so each row shrinks to [p at its children..., the rest of the mass] and a child's token to its rank there.
    Returns the verdict (its `next_dist` over that short row: the caller draws the correction from the full
    row without the children tried) and the nodes tried, in order."""
    children = children_of(parents)
    rows = []
    for node in range(-1, len(parents)):
        probs = [p_at[c] for c in children.get(node, [])]
        rows.append(torch.tensor([*probs, max(0.0, 1.0 - sum(probs))], dtype=torch.float64))
    ranks = [children[parent].index(i) for i, parent in enumerate(parents)]
    verdict = walk_tree(parents, ranks, rows, None, u)
    return verdict, tried_nodes(children, verdict)


def tried_nodes(children: dict[int, list[int]], verdict: TreeVerdict) -> list[int]:
    """The nodes a walk tried, in order: at each node of the path its children up to the accepted one, at its
    end every child (all rejected; none at a leaf)."""
    tried = []
    for node, chosen in zip([-1, *verdict.path], [*verdict.path, None]):
        kids = children.get(node, [])
        tried += kids if chosen is None else kids[:kids.index(chosen) + 1]
    return tried
