"""Aggregate event streams into measured numbers: pure functions of `Round`s and `Step`s.

One `RunStats` for the benchmark, the app's panels and the API alike, so they never disagree on
what "acceptance" or "predicted speedup" means. Everything is pooled from counts and totals, so
summarising the concatenated rounds of many runs gives ratios of totals, never means of ratios.
A run without the target alone (plain Run or Step) has no measured target step: its prediction
takes the mean verify pass as the target step (`estimated_costs`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from specviz.analysis.predict import CostModel, expected_tokens, predicted_speedup_for_rounds
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, Round, Step


def ratio(a: float, b: float) -> float:
    """a / b, or 0.0 where nothing was measured (b = 0): rates, shares and speedups alike."""
    return a / b if b > 0 else 0.0


@dataclass
class SpecStats:
    """Speculative decoding, from its rounds."""

    rounds: int = 0
    tokens: int = 0  # emitted (accepted drafts + corrections/bonuses)
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # wall time if given, else draft + verify + overhead
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0  # building the events on the host
    tested: list[int] = field(default_factory=list)  # tested[i]: rounds where drafted token i+1 was checked
    passed: list[int] = field(default_factory=list)  # passed[i]: ... and accepted
    accepted_lengths: list[int] = field(default_factory=list)  # histogram: rounds with n accepted, n = 0..max K

    @property
    def tokens_per_s(self) -> float:
        return ratio(self.tokens, self.seconds)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the share of the draft's work that was kept."""
        return ratio(self.accepted, self.drafted)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per round, correction/bonus included (one target forward each)."""
        return ratio(self.tokens, self.rounds)

    @property
    def per_position(self) -> list[float]:
        """α̂_i = P(token i accepted | tokens 1..i-1 accepted), i = 1..max K."""
        return [ratio(p, t) for p, t in zip(self.passed, self.tested)]

    @property
    def draft_step_s(self) -> float:
        """Mean draft time per drafted token (includes feeding the draft its missing tokens)."""
        return ratio(self.draft_s, self.drafted)

    @property
    def event_overhead(self) -> float:
        """Fraction of the decode time spent building events."""
        return ratio(self.overhead_s, self.draft_s + self.verify_s + self.overhead_s)


@dataclass
class ARStats:
    """Plain autoregressive decoding, from its steps."""

    tokens: int = 0
    seconds: float = 0.0
    step_s: float = 0.0  # median step after the first (the first one also reads the prompt)

    @property
    def tokens_per_s(self) -> float:
        return ratio(self.tokens, self.seconds)


@dataclass
class RunStats:
    """A speculative run and, when it ran too, the target alone: measured and predicted."""

    spec: SpecStats = field(default_factory=SpecStats)
    ar: ARStats | None = None
    speedup: float | None = None  # spec tokens/s over AR tokens/s (measured)
    cost: CostModel | None = None  # given, or estimated from the events
    predicted_speedup: float | None = None  # from α̂ and `cost`
    expected_tokens: float | None = None  # E(K) from α̂
    k: int = 0  # the K `expected_tokens` is for (the largest drafted)
    tree_nodes: float | None = None  # tree rounds: draft-tree nodes per round (no chain prediction for them)

    @property
    def alpha(self) -> float:
        """α̂ pooled over positions: accepted ÷ tested drafts."""
        return ratio(sum(self.spec.passed), sum(self.spec.tested))

    def to_dict(self) -> dict:
        """Flat, JSON-ready: the API's "stats"."""
        s, cost = self.spec, self.cost
        return {
            "rounds": s.rounds, "tokens": s.tokens, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate, "alpha": self.alpha, "k": self.k,
            "tokens_per_forward": s.mean_accepted_tokens, "per_position": s.per_position,
            "per_position_n": list(s.tested), "accepted_lengths": list(s.accepted_lengths), "compute_s": s.seconds,
            "tokens_per_s": s.tokens_per_s, "draft_step_s": s.draft_step_s,
            "target_step_s": self.ar.step_s if self.ar else None,
            "target_step_used_s": cost.target_step_s if cost else 0.0, "c_hat": cost.c if cost else None,
            "expected_tokens": self.expected_tokens, "predicted": self.predicted_speedup,
            "ar_tokens_per_s": self.ar.tokens_per_s if self.ar else None, "measured": self.speedup,
        }


def mean_beta(betas: Sequence[float | None]) -> float | None:
    """The mean β = Σ min(p, q) of some drafts: the acceptance they should have had on average (None when any of
    them has none recorded: an older trace, a tree)."""
    return None if not betas or None in betas else sum(betas) / len(betas)


def tested_drafts(rounds: Sequence[Round]) -> list:
    """The drafted tokens the target tested (accepted or rejected), in order."""
    return [t for r in rounds for t in r.drafted if t.status != NOT_VERIFIED]


def tested_betas(rounds: Sequence[Round]) -> list[float | None]:
    """β of every drafted token the target tested."""
    return [t.beta for t in tested_drafts(rounds)]


def _grow(counts: list[int], n: int) -> None:
    counts.extend([0] * (n - len(counts)))


def spec_stats(rounds: Sequence[Round], seconds: float | None = None) -> SpecStats:
    s = SpecStats(rounds=len(rounds))
    for r in rounds:
        s.tokens += r.tokens_emitted
        s.drafted += r.k
        s.accepted += r.n_accepted
        s.draft_s += r.draft_time
        s.verify_s += r.verify_time
        s.overhead_s += r.overhead_time
        _grow(s.tested, r.k)
        _grow(s.passed, r.k)
        _grow(s.accepted_lengths, r.k + 1)
        s.accepted_lengths[r.n_accepted] += 1
        for i, t in enumerate(r.drafted):
            if t.status != NOT_VERIFIED:
                s.tested[i] += 1
                s.passed[i] += t.status == ACCEPTED
    s.seconds = seconds if seconds is not None else s.draft_s + s.verify_s + s.overhead_s
    return s


def ar_stats(steps: Sequence[Step], seconds: float | None = None) -> ARStats:
    step_s = statistics.median(st.time for st in steps[1:]) if len(steps) > 1 else (steps[0].time if steps else 0.0)
    total = seconds if seconds is not None else sum(st.time for st in steps)
    return ARStats(tokens=len(steps), seconds=total, step_s=step_s)


def estimated_costs(rounds: Sequence[Round], steps: Sequence[Step] | None = None) -> CostModel | None:
    """A cost model from events alone, for when nothing was measured separately (the app).

    The verify time is the mean over rounds after the first (which also reads the prompt; a
    one-round run keeps it), taken as the cost at every K; the draft step is the mean per drafted
    token. T1 is the median AR step when the target also ran alone, else the mean verify pass.
    """
    later = [r for r in rounds[1:] if r.k > 0] or [r for r in rounds if r.k > 0]
    if not later:
        return None
    verify = statistics.fmean(r.verify_time for r in later)
    target_step = ar_stats(steps).step_s if steps else verify
    if target_step <= 0:
        return None
    draft_step = sum(r.draft_time for r in later) / sum(r.k for r in later)
    return CostModel(target_step, draft_step, (verify,) * (max(r.k for r in later) + 1))


def run_stats(rounds: Sequence[Round], steps: Sequence[Step] | None = None, *,
              spec_seconds: float | None = None, ar_seconds: float | None = None,
              cost: CostModel | None = None, k: int | None = None) -> RunStats:
    """Measured and predicted numbers for a speculative run and (optionally) the target alone.

    The prediction follows the rounds' own K's and tokens (`predicted_speedup_for_rounds`); `k` is
    the K for `expected_tokens` from α̂ (default: the largest drafted). Without `cost`, the
    prediction uses `estimated_costs` from the events themselves.
    """
    spec = spec_stats(rounds, spec_seconds)
    k = k if k is not None else max((r.k for r in rounds), default=0)
    out = RunStats(spec, k=k)
    if steps:
        out.ar = ar_stats(steps, ar_seconds)
        out.speedup = ratio(spec.tokens_per_s, out.ar.tokens_per_s) or None
    if any(r.tree for r in rounds):  # the chain's model does not describe a tree's rounds: measured costs only
        out.tree_nodes = ratio(sum(len(r.tree) for r in rounds), len(rounds))
        out.cost = cost or estimated_costs(rounds, steps)
    elif k > 0 and spec.tested:
        out.expected_tokens = expected_tokens(spec.per_position, k)
        out.cost = cost or estimated_costs(rounds, steps)
        if out.cost is not None:
            out.predicted_speedup = predicted_speedup_for_rounds([r.k for r in rounds], spec.tokens, out.cost)
    return out


def tree_acceptance(rounds: Sequence[Round]) -> dict[str, list[dict]]:
    """For tree rounds: per depth, how often the walk got there (tried a node at that depth) and accepted one;
    per sibling rank (0: the draft's first choice), how often a candidate of that rank was tried and accepted."""
    def grow(rows: list[dict], i: int) -> dict:
        rows.extend({"tried": 0, "accepted": 0} for _ in range(i + 1 - len(rows)))
        return rows[i]
    depth: list[dict] = []
    rank: list[dict] = []
    for r in rounds:
        reached = {n.depth for n in r.tree if n.accept_prob is not None}
        kept = {n.depth for n in r.tree if n.status == ACCEPTED}
        for d in reached:
            row = grow(depth, d - 1)
            row["tried"] += 1
            row["accepted"] += d in kept
        for n in r.tree:
            if n.accept_prob is not None:
                row = grow(rank, n.rank)
                row["tried"] += 1
                row["accepted"] += n.status == ACCEPTED
    for row in depth + rank:
        row["rate"] = ratio(row["accepted"], row["tried"])
    return {"by_depth": depth, "by_rank": rank}
