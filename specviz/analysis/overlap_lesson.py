"""The lesson of β: two distributions' overlap is the acceptance they produce.

A fixed pair of next-token distributions (a target's logits and a draft's, the draft's a noisy copy) at one
temperature: β = Σ min(p, q) = 1 - TV(p, q), and a batch of one-token rounds through the rule itself (x drawn
from q, accepted iff u < min(1, p/q)). The temperature moves p and q apart or together; the measured acceptance
follows β. Pure and model-free: the How it works tab renders it live.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.analysis.atlas import beta_range
from specviz.engine.rules import acceptance_probs, overlap

VOCAB = 24
ROUNDS = 400


@dataclass(frozen=True)
class OverlapPoint:
    temperature: float
    p: tuple[float, ...]  # the target's distribution at this temperature
    q: tuple[float, ...]  # the draft's
    beta: float  # Σ min(p, q): the acceptance the rule must give on average
    drafted: int
    accepted: int  # of `drafted` one-token rounds through the rule
    expected_range: tuple[float, float]  # where the measured rate falls 99 times in 100 (`atlas.beta_range`)

    @property
    def measured(self) -> float:
        return self.accepted / self.drafted


def lesson_logits(seed: int = 0, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """A target's logits and a draft's: the draft's a noisy copy, as a small model of the same family is."""
    gen = torch.Generator().manual_seed(seed)
    target = 2.5 * torch.randn(vocab, generator=gen)
    return target, target + 0.8 * torch.randn(vocab, generator=gen)


def overlap_point(temperature: float, rounds: int = ROUNDS, seed: int = 0) -> OverlapPoint:
    """β at `temperature`, and `rounds` drafts through the rule: drawn from q, each accepted with min(1, p/q)."""
    target, draft = lesson_logits(seed)
    p, q = torch.softmax(target / temperature, -1), torch.softmax(draft / temperature, -1)
    gen = torch.Generator().manual_seed(seed + 1)
    drafts = torch.multinomial(q, rounds, replacement=True, generator=gen)
    accept = acceptance_probs(p.expand(rounds, -1), q.expand(rounds, -1), drafts)
    accepted = int((torch.rand(rounds, generator=gen) < accept).sum())
    beta = float(overlap(p, q))
    return OverlapPoint(temperature, tuple(p.tolist()), tuple(q.tolist()), beta, rounds, accepted,
                        beta_range([beta] * rounds))


def beta_curve(temperatures: list[float], seed: int = 0) -> list[float]:
    """β at each temperature, exactly (no draws)."""
    target, draft = lesson_logits(seed)
    return [float(overlap(torch.softmax(target / t, -1), torch.softmax(draft / t, -1))) for t in temperatures]
