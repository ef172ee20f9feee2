"""Numbers for the stats panel: the benchmark's aggregation (`specviz.bench.stats.summary_of`),
flattened for display.

Reusing the bench's pure functions keeps the app and `specviz bench` from ever disagreeing on what
"acceptance" or "predicted speedup" means. A run without the target alone (plain Run or Step) has
no measured target step, so its prediction takes the mean verify pass as the target step
(`estimated_costs`), and the panel says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specviz.bench.stats import ratio, summary_of
from specviz.engine.events import Round, Step
from specviz.race import RaceState


@dataclass
class RunStats:
    rounds: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0  # accepted / drafted
    alpha: float = 0.0  # accepted / tested drafts: α̂ pooled over positions
    k: int = 0  # the K predicted for (the largest drafted)
    tokens_per_forward: float = 0.0
    per_position: list[float] = field(default_factory=list)  # α̂_i = P(accept i | 1..i-1 accepted)
    per_position_n: list[int] = field(default_factory=list)  # rounds that tested position i
    accepted_lengths: list[int] = field(default_factory=list)  # histogram: rounds with n accepted, n = 0..K
    compute_s: float = 0.0  # the speculative run's seconds (lane clock in a race, else event times)
    tokens_per_s: float = 0.0
    draft_step_s: float = 0.0
    target_step_s: float | None = None  # measured (target alone), else None
    target_step_used_s: float = 0.0  # the measured one, or the mean verify pass without a target-alone run
    c_hat: float | None = None  # draft step / target step
    expected_tokens: float | None = None  # E(K) from the per-position α̂
    predicted: float | None = None
    ar_tokens_per_s: float | None = None
    measured: float | None = None  # speculative tokens/s over target-alone tokens/s (a race)


def summarize(rounds: Sequence[Round], ar_steps: Sequence[Step] | None = None, *,
              spec_seconds: float | None = None, ar_seconds: float | None = None) -> RunStats:
    """`summary_of` as the stats panel shows it."""
    if not rounds:
        return RunStats()
    sm = summary_of(rounds, ar_steps, spec_seconds=spec_seconds, ar_seconds=ar_seconds)
    spec, cost = sm.spec, sm.cost
    return RunStats(
        rounds=spec.rounds, tokens=spec.tokens, drafted=spec.drafted, accepted=spec.accepted,
        acceptance_rate=spec.acceptance_rate, alpha=ratio(sum(spec.passed), sum(spec.tested)),
        k=max(r.k for r in rounds), tokens_per_forward=spec.mean_accepted_tokens,
        per_position=spec.per_position, per_position_n=list(spec.tested),
        accepted_lengths=list(spec.accepted_lengths), compute_s=spec.seconds, tokens_per_s=spec.tokens_per_s,
        draft_step_s=spec.draft_step_s, target_step_s=sm.ar.step_s if sm.ar else None,
        target_step_used_s=cost.target_step_s if cost else 0.0, c_hat=cost.c if cost else None,
        expected_tokens=sm.expected_tokens, predicted=sm.predicted_speedup,
        ar_tokens_per_s=sm.ar.tokens_per_s if sm.ar else None, measured=sm.speedup,
    )


def race_stats(state: RaceState) -> RunStats:
    """The speculative lane's numbers against the target alone, each timed by its lane's own clock."""
    return summarize(state.spec.events, state.ar.events, spec_seconds=state.spec.clock, ar_seconds=state.ar.clock)
