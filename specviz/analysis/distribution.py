"""Empirical token frequencies against an exact distribution: total variation and χ² goodness of fit.

The statistics of the "same distribution" experiment (`specviz.runs.distribution` draws the samples).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass
class Comparison:
    token_ids: list[int]  # the categories shown: the most likely tokens under the exact distribution
    exact: list[float]
    ar: list[float]
    spec: list[float]
    n_ar: int
    n_spec: int
    tv_ar: float  # total variation distance to the exact distribution, over the whole vocabulary
    tv_spec: float
    p_ar: float | None  # χ² goodness-of-fit p-value against the exact distribution (None: not testable)
    p_spec: float | None
    tv_noise: float  # mean TV of N samples drawn from the exact distribution itself: the chance level


def total_variation(exact: np.ndarray, counts: Counter, n: int) -> float:
    if n == 0:
        return 0.0
    diff = exact.copy()
    for t, c in counts.items():
        diff[t] -= c / n
    return 0.5 * float(np.abs(diff).sum())


def chi_square_p(exact: np.ndarray, counts: Counter, n: int, min_expected: float = 5.0) -> float | None:
    """Goodness of fit with tokens of expected count < 5 pooled into one 'other' cell."""
    if n == 0:
        return None
    big = np.flatnonzero(exact * n >= min_expected)
    observed = [counts.get(int(t), 0) for t in big]
    expected = list(exact[big] * n)
    rest_expected = n - sum(expected)
    if rest_expected > 1e-9 * n:
        observed.append(n - sum(observed))
        expected.append(rest_expected)
    if len(expected) < 2:
        return None  # one cell (a near-deterministic distribution): nothing to test
    expected = np.asarray(expected) * (n / sum(expected))
    return float(stats.chisquare(observed, expected).pvalue)


def sampling_noise_tv(exact: np.ndarray, n: int, reps: int = 20, seed: int = 0) -> float:
    """TV you get by chance from n draws of the exact distribution (TV of a finite sample is > 0)."""
    if n == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, exact, size=reps)
    return float(np.mean(0.5 * np.abs(counts / n - exact).sum(axis=1)))


def compare(exact: np.ndarray, counts_ar: Counter, counts_spec: Counter, top: int = 12) -> Comparison:
    n_ar, n_spec = sum(counts_ar.values()), sum(counts_spec.values())
    ids = [int(t) for t in np.argsort(-exact)[:top] if exact[t] > 0]
    seen = sorted(set(counts_ar) | set(counts_spec), key=lambda t: -exact[t])  # anything sampled shows too
    ids += [t for t in seen if t not in ids][: max(0, top + 4 - len(ids))]
    return Comparison(
        token_ids=ids, exact=[float(exact[t]) for t in ids],
        ar=[counts_ar.get(t, 0) / n_ar if n_ar else 0.0 for t in ids],
        spec=[counts_spec.get(t, 0) / n_spec if n_spec else 0.0 for t in ids],
        n_ar=n_ar, n_spec=n_spec,
        tv_ar=total_variation(exact, counts_ar, n_ar), tv_spec=total_variation(exact, counts_spec, n_spec),
        p_ar=chi_square_p(exact, counts_ar, n_ar), p_spec=chi_square_p(exact, counts_spec, n_spec),
        tv_noise=sampling_noise_tv(exact, max(1, min(n_ar, n_spec) or max(n_ar, n_spec))),
    )
