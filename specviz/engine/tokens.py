"""Per-token statistics and token events, shared by the speculative and the autoregressive loops.

Everything an event shows is computed on the device and crosses to the host in one transfer per
round or step (`plumbing.to_host`); the events are then built from plain Python values. Greedy
warps are point masses, which say little on a chart, so the *shown* distribution is the
temperature-1 softmax when greedy and the warped one when sampling.
"""

from __future__ import annotations

import torch

from specviz.engine.events import Candidate, EmittedToken


def top(dist: torch.Tensor, n: int, name: str) -> dict[str, torch.Tensor]:
    """The top-n ids and probabilities of each row of `dist`, as `{name}_top_ids` / `{name}_top_vals`."""
    t = dist.topk(min(n, dist.shape[-1]), dim=-1)
    return {f"{name}_top_ids": t.indices, f"{name}_top_vals": t.values}


def target_stats(logits: torch.Tensor, p: torch.Tensor, greedy: bool, top_n: int
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """For rows of target logits [n, V] and their warped p: the temperature-1 softmax (to gather from),
    and per row the top-2 logit gap (near 0: a near-tie) and the top-n of the shown distribution."""
    p_soft = torch.softmax(logits, -1)
    top2 = logits.topk(2, dim=-1).values
    return p_soft, {"gap": top2[..., 0] - top2[..., 1], **top(p_soft if greedy else p, top_n, "p")}


def candidates(h: dict, name: str, row: int, pieces) -> list[Candidate]:
    """Row `row` of a top-n list from host values (ids arrive as floats); zero-mass entries dropped."""
    ids, probs = h[f"{name}_top_ids"][row], h[f"{name}_top_vals"][row]
    return [Candidate(int(i), pieces(int(i)), p) for i, p in zip(ids, probs) if p > 0]


def emitted_token(h: dict, row: int, token_id: int, kind: str, p: float, p_soft: float, pieces) -> EmittedToken:
    """A token the target chose (correction, bonus or AR step) at row `row` of `target_stats`' output."""
    return EmittedToken(id=token_id, text=pieces(token_id), kind=kind, p=p, p_soft=p_soft,
                        target_top2_gap=h["gap"][row], p_top=candidates(h, "p", row, pieces))
