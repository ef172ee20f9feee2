"""Bootstrap 95 % intervals over prompts, for `specviz bench`'s speedups (bench/report.py, `speedup_ci95`) and
the engines' races: rows (prompts) resampled with replacement, each row kept whole (a prompt's lanes ran back to
back, so they are paired), the statistic a ratio of totals, 4999 resamples, percentile interval, a fixed seed.
Below 3 rows there is no interval: too few prompts to say how much the number would move.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

MIN_ROWS = 3
RESAMPLES = 4999


def ci95(columns: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray],
         n_resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """The interval of `statistic(*columns, axis=-1)` (vectorised over resamples); None below `MIN_ROWS` rows or
    where a resample leaves it undefined (a zero denominator)."""
    data = tuple(np.asarray(c, dtype=float) for c in columns)
    if len(data[0]) < MIN_ROWS:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ci = scipy_stats.bootstrap(data, statistic, paired=True, vectorized=True, n_resamples=n_resamples,
                                   method="percentile", rng=np.random.default_rng(0)).confidence_interval
    low, high = float(ci.low), float(ci.high)
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


def ratio_of_sums(numerator, denominator, axis=-1):
    """Σ numerator / Σ denominator: long and short prompts weigh what they cost."""
    return np.sum(numerator, axis=axis) / np.sum(denominator, axis=axis)


def ratio_of_ratios(a, b, c, d, axis=-1):
    """(Σa / Σb) / (Σc / Σd): one lane's rate over another's, e.g. a speedup."""
    return ratio_of_sums(a, b, axis) / ratio_of_sums(c, d, axis)
