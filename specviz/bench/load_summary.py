"""The load test's numbers: percentiles of waits, by kind of request, and the queue's estimates against the
waits that followed them (pure functions of the records, `loadtest.Record`s), and the summary as printed."""

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


def numbers(values: dict) -> str:
    return "  ".join(f"{k} {'-' if v is None else f'{v:.2f}' if isinstance(v, float) else v}"
                     for k, v in values.items())


def table(summary: dict) -> str:
    """`LoadResult.summary()` as text: throughput, waits (by kind), estimates, memory, outcomes, errors."""
    w, rss = summary["wait_s"], summary["rss_mb"]
    lines = [f"{summary['users']} users, {summary['seconds']:.1f} s: {summary['throughput']:.2f} completed runs/s",
             "wait s (until the first result): " + numbers(w)
             + f"  (furthest back in the queue: {summary['max_queue_rank']})"]
    lines += [f"  {kind:<20} wait {numbers(v)}" for kind, v in summary["wait_by_kind"].items()]
    lines += [f"  {kind:<20} first token {numbers(v)}" for kind, v in summary["first_token_by_kind"].items()]
    lines += [f"recorded answers: {summary['recorded_answers'] or 'none'}"]
    e = summary["estimates"]
    if e["n"]:
        lines.append(f"queue estimates: {e['n']} waits of a second or more, {e['within_2x']:.0%} within a factor of "
                     f"2 of the estimate; real ÷ estimated: {numbers(e['real_to_estimate'])}")
    lines += [f"server RSS MB: {rss['before']} before, {rss['after']} after"] if rss["before"] is not None else []
    lines += [f"  {kind:<20} " + "  ".join(f"{o} {n}" for o, n in outcomes.items())
              for kind, outcomes in summary["requests"].items()]
    return "\n".join(lines + ([f"error: {e}" for e in summary["errors"]] or ["no unexpected errors"]))
