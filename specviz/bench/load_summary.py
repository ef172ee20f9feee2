"""The load test's numbers: percentiles of waits, by kind of request, and the queue's estimates against the
waits that followed them (pure functions of the records, `loadtest.Record`s)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence


def percentiles(values: list[float]) -> dict:
    if len(values) < 2:  # statistics.quantiles needs two points
        return dict.fromkeys(("p50", "p95", "max"), values[0] if values else None)
    q = statistics.quantiles(values, n=100, method="inclusive")  # q[i]: the (i+1)th percentile
    return {"p50": q[49], "p95": q[94], "max": max(values)}


def by_kind(records: Sequence, value: Callable[[object], float | None]) -> dict:
    """Percentiles of `value(record)`, and how many, per kind of valid request that completed."""
    out = {}
    for kind in sorted({r.kind for r in records if r.valid}):
        values = [v for r in records if r.kind == kind and r.outcome == "ok" and (v := value(r)) is not None]
        if values:
            out[kind] = percentiles(values) | {"n": len(values)}
    return out


def estimates(records: Sequence, at_least: float = 1.0) -> dict:
    """How the queue's first estimate compared with the wait that followed it, for requests that then waited at
    least `at_least` seconds (shorter ones are mostly the polling's jitter): the ratios real ÷ estimated."""
    ratios = sorted(r.estimated_wait / r.estimate for r in records
                    if r.estimate and r.estimated_wait is not None and r.estimated_wait >= at_least)
    if not ratios:
        return {"n": 0}
    return {"n": len(ratios), "within_2x": sum(0.5 <= x <= 2.0 for x in ratios) / len(ratios),
            "real_to_estimate": percentiles(ratios) | {"min": ratios[0]}}
