"""Is a sampler's output distributed as the target's? Statistics over whole sampled paths.

Each sampled path x_1..x_L is scored against the target's exact conditionals p_t(. | prompt, x_<t)
(one plain forward over the path, `engine.exact.path_distributions`). Per position t:
- chi-square: observed counts of each token against the expected counts sum_i p_t,i(v), each sample
  under its own prefix (tokens with expected count < 5 pooled). With different prefixes the counts
  vary less than a multinomial's, so the test is conservative there, and exact at position 1.
- total variation between the same two, beside the TV that n draws from the exact distribution
  reach by chance alone (`expected_tv`, in closed form).
- the randomised PIT u of each sampled token (`engine.exact.randomized_pit`): Uniform(0, 1) for a
  correct sampler; a Kolmogorov-Smirnov test per position, and one over every u of every path
  (under the null they are all independent uniforms), the sequential test of the whole path.
Nothing V-wide is kept per sample: a position keeps one V-vector of expected counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats

from specviz.engine.exact import randomized_pit

SHOWN = 16  # tokens per position kept for display: the most likely under the exact conditionals


@dataclass
class PositionTally:
    observed: Counter = field(default_factory=Counter)
    expected: torch.Tensor | None = None  # [V] float64 on the device
    pits: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.pits)

    def add(self, probs: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator) -> None:
        """probs [B, V]: each sample's exact conditional at this position; tokens [B]: what it sampled."""
        total = probs.double().sum(0)
        self.expected = total if self.expected is None else self.expected + total
        self.observed.update(tokens.tolist())
        u = torch.rand(tokens.shape, generator=generator, device=probs.device)
        self.pits += randomized_pit(probs, tokens, u).tolist()


@dataclass(frozen=True)
class PositionResult:
    position: int  # 1-based
    n: int  # samples that reached this position (paths end at <eos>)
    chi2_p: float | None  # None: a single cell, nothing to test
    dof: int
    tv: float
    tv_noise: float  # the TV expected by chance alone: n draws from the exact distribution (`expected_tv`)
    tv_noise_high: float  # the TV that 95 % of such n draws stay below (`chance_tv_high`)
    ks_p: float
    top: list[tuple[int, float, float]]  # (token, exact share, observed share), most likely first


def _tv(counts: Counter, expected: np.ndarray, n: int) -> float:
    diff = expected.copy()
    for t, c in counts.items():
        diff[t] -= c
    return 0.5 * float(np.abs(diff).sum()) / n


def expected_tv(p: np.ndarray, n: int) -> float:
    """The mean TV between the shares of n draws from p and p itself: half the sum of each token's binomial mean
    absolute deviation over n, each in closed form (De Moivre: E|X - np| = 2ν(1 - p)·P(X = ν), ν = ⌊np⌋ + 1).
    At tokens 2 and 3 each sample has its own conditional and p is their mean: draws from the mean vary at least
    as much, so there it is a level chance reaches, or a little above."""
    p = p[p > 0]
    nu = np.floor(n * p) + 1
    return float(np.sum(nu * (1 - p) * stats.binom.pmf(nu, n, p)) / n)


CHANCE_DRAWS = 400  # simulated draws of n for the upper end of chance's TV
TAIL_MASS = 1e-3  # the least likely tokens holding this much mass are pooled into one (the draws' cost)


def chance_tv_high(p: np.ndarray, n: int, q: float = 0.95, seed: int = 0) -> float:
    """The TV between n draws from p and p that a fraction q of such draws stay below: simulated (`CHANCE_DRAWS`
    draws, seeded: the same answer every time), the tail of p pooled (`TAIL_MASS`, which can only lower TV a little).
    Beside the mean (`expected_tv`) it shows how far above the mean chance alone goes."""
    order = np.argsort(-p)
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), 1 - TAIL_MASS)) + 1]
    pooled = np.append(p[keep], max(0.0, 1 - p[keep].sum()))
    pooled = pooled / pooled.sum()
    draws = np.random.default_rng(seed).multinomial(n, pooled, size=CHANCE_DRAWS) / n
    return float(np.quantile(0.5 * np.abs(draws - pooled).sum(axis=1), q))


def _chi2(counts: Counter, expected: np.ndarray, n: int, min_expected: float = 5.0) -> tuple[float | None, int]:
    big = np.flatnonzero(expected >= min_expected)
    observed = [counts.get(int(t), 0) for t in big]
    cells = list(expected[big])
    if n - sum(cells) > 1e-9 * n:
        observed.append(n - sum(observed))
        cells.append(n - sum(cells))
    if len(cells) < 2:
        return None, 0
    return float(stats.chisquare(observed, np.asarray(cells) * (n / sum(cells))).pvalue), len(cells) - 1


def position_result(position: int, t: PositionTally) -> PositionResult:
    expected = t.expected.cpu().numpy()
    chi2_p, dof = _chi2(t.observed, expected, t.n)
    return PositionResult(position, t.n, chi2_p, dof, _tv(t.observed, expected, t.n),
                          expected_tv(expected / t.n, t.n), chance_tv_high(expected / t.n, t.n),
                          float(stats.kstest(t.pits, "uniform").pvalue),
                          [(int(x), float(expected[x]) / t.n, t.observed.get(int(x), 0) / t.n)
                           for x in np.argsort(-expected)[:SHOWN] if expected[x] > 0])


@dataclass(frozen=True)
class Verdict:
    """One sampler's result. `expect_pass`: a sampler of the target's distribution (the method, or the
    target alone) must pass; a negative control must fail, else the test could not have seen a bug."""

    name: str
    expect_pass: bool
    samples: int
    positions: list[PositionResult]
    ks_p: float  # every u of every path against Uniform(0, 1)
    alpha: float
    extra: dict = field(default_factory=dict)  # e.g. how often the clean-sweep path was exercised

    @property
    def p_values(self) -> list[float]:
        return [self.ks_p] + [p.ks_p for p in self.positions] + [p.chi2_p for p in self.positions
                                                                 if p.chi2_p is not None]

    @property
    def min_p(self) -> float:
        return min(self.p_values)

    @property
    def rejected(self) -> bool:
        """Bonferroni over this sampler's tests: rejected when any p-value < alpha / (number of tests)."""
        return self.min_p < self.alpha / len(self.p_values)

    @property
    def as_expected(self) -> bool:
        return self.rejected != self.expect_pass


@dataclass(frozen=True)
class PooledPosition:
    """One position seen by several samplers of the target's distribution: the likeliest tokens by the exact
    conditional pooled over all their samples (each sample under its own prefix), and each sampler's observed
    share of them."""

    token_ids: list[int]
    exact: list[float]
    observed: list[list[float]]  # per sampler, in the order given


def pooled(tallies: list[PositionTally], shown: int) -> PooledPosition:
    """From the full expected vectors, so a token likely for one sampler's prefixes and not the other's ranks by
    its pooled share (each sampler's own top list alone cannot tell)."""
    reached = [t for t in tallies if t.n]
    n = sum(t.n for t in reached)
    if not n:
        return PooledPosition([], [], [[] for _ in tallies])
    share = (sum(t.expected for t in reached) / n).cpu().numpy()
    ids = [int(x) for x in np.argsort(-share, kind="stable")[:shown] if share[x] > 0]
    return PooledPosition(ids, [float(share[x]) for x in ids],
                          [[t.observed.get(x, 0) / t.n if t.n else 0.0 for x in ids] for t in tallies])


def verdict(name: str, expect_pass: bool, tallies: list[PositionTally], alpha: float, **extra) -> Verdict:
    reached = [t for t in tallies if t.n]
    return Verdict(name, expect_pass, reached[0].n if reached else 0,
                   [position_result(i + 1, t) for i, t in enumerate(reached)],
                   float(stats.kstest([u for t in reached for u in t.pits], "uniform").pvalue), alpha, extra)
