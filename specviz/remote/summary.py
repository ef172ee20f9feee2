"""A race's runs summarised: each lane's rates and time to first token, the speculative lane's acceptance as
the engine reported it, every number with a bootstrap 95 % interval over prompts, and specviz's cost model's
predicted speedup beside the measured one.

Rates are ratios of totals (Σ tokens / Σ seconds over prompts and repetitions), as `specviz bench` computes
its own. The decode rate counts the tokens after the first over the time between the first and the last.

The prediction (`analysis/predict.py`): with α̂_i = P(draft i accepted | 1..i-1 accepted) from the engine's
per-position counts, T1 the target alone's time per token (its decode rate measured here), c = draft step /
target step and R = one verify of K + 1 tokens / target step,

    speedup = E(K) · T1 / (K·c·T1 + R·T1),   E(K) = 1 + Σ_i Π_{j<=i} α̂_j.

c is measured when the race has a draft-alone lane (the target alone's decode rate over the draft's), else
given (`--draft-cost`); R is given (`--verify-ratio`, 1.0 = "verification is free", a GPU's regime; a CPU's
is higher). Without per-position counts, one acceptance a at every position (`analysis/whatif.py`). Beside it,
the round cost the measurement implies, E / measured speedup, in target steps: K·c + R would have to be that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.analysis.intervals import ci95, ratio_of_ratios, ratio_of_sums
from specviz.analysis.predict import CostModel, expected_tokens, predicted_speedup
from specviz.analysis.whatif import what_if
from specviz.remote.race import DRAFT, PLAIN, SPEC, Run


@dataclass(frozen=True)
class Estimate:
    value: float | None
    ci95: tuple[float, float] | None  # None below 3 prompts


@dataclass(frozen=True)
class LaneSummary:
    lane: str
    requests: int
    tokens: int
    decode_tokens_per_s: Estimate
    ttft_s: Estimate
    end_to_end_tokens_per_s: float | None  # Σ tokens / Σ request time: the first token's wait included


@dataclass(frozen=True)
class Acceptance:
    drafted: int
    accepted: int
    rounds: int | None
    acceptance: Estimate  # Σ accepted / Σ drafted
    mean_accepted_length: Estimate  # 1 + Σ accepted / Σ rounds: tokens per verify round
    per_position: tuple[float, ...] | None  # rounds that accepted position i / rounds
    conditional: tuple[float, ...] | None  # α̂_i: accepted at i / accepted at i - 1
    sources: tuple[str, ...]  # where the engine's statistics came from (per-request, metrics-diff, …)
    requests_without: int  # speculative requests the engine gave no statistics for


@dataclass(frozen=True)
class Prediction:
    k: int | None
    draft_cost: float | None  # c
    draft_cost_from: str | None  # "draft-alone lane" or "--draft-cost"
    verify_ratio: float  # R
    expected_tokens: float | None  # E(K) from α̂
    predicted_speedup: float | None
    measured_speedup: float | None  # decode rates: speculative / target alone
    implied_round_cost: float | None  # measured E / measured speedup, in target steps
    break_even_draft_cost: float | None  # the largest c at which E and K still pay: (E - R) / K


@dataclass(frozen=True)
class RaceSummary:
    lanes: tuple[LaneSummary, ...]
    speedup: Estimate  # decode rate, speculative over target alone
    end_to_end_speedup: float | None
    acceptance: Acceptance | None
    prediction: Prediction
    prompts: int
    repeats: int


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def per_prompt(runs: Sequence[Run], lane: str, value) -> list[float]:
    """Σ value(result) per prompt (over repetitions), prompts in first-seen order."""
    ids = list(dict.fromkeys(r.prompt.id for r in runs))
    return [sum(value(r.result) for r in runs if r.lane == lane and r.prompt.id == pid) for pid in ids]


def decode_tokens(x) -> float:
    return max(x.tokens - 1, 0) if x.decode_s else 0.0


def decode_seconds(x) -> float:
    return x.decode_s or 0.0


def lane_summary(runs: Sequence[Run], lane: str) -> LaneSummary:
    mine = [r.result for r in runs if r.lane == lane]
    tok, sec = per_prompt(runs, lane, decode_tokens), per_prompt(runs, lane, decode_seconds)
    ttft = per_prompt(runs, lane, lambda x: x.ttft_s or 0.0)
    seen = per_prompt(runs, lane, lambda x: x.ttft_s is not None)
    return LaneSummary(lane, len(mine), sum(x.tokens for x in mine),
                       Estimate(_ratio(sum(tok), sum(sec)), ci95((tok, sec), ratio_of_sums)),
                       Estimate(_ratio(sum(ttft), sum(seen)), ci95((ttft, seen), ratio_of_sums)),
                       _ratio(sum(x.tokens for x in mine), sum(x.total_s for x in mine)))


def stat(field: str):
    """result -> its statistics' `field`, 0 where the engine gave none."""
    return lambda x: (getattr(x.stats, field) or 0) if x.stats else 0


def acceptance_of(runs: Sequence[Run]) -> Acceptance | None:
    results = [r.result for r in runs if r.lane == SPEC]
    told = [x for x in results if x.stats and x.stats.drafted is not None and x.stats.accepted is not None]
    if not told:
        return None
    acc, drafted, rounds = (per_prompt(runs, SPEC, stat(f)) for f in ("accepted", "drafted", "drafts"))
    with_rounds = all(x.stats.drafts is not None for x in told)
    positions = [x.stats.accepted_per_position for x in told]
    per_pos = conditional = None
    if with_rounds and all(positions):
        depth = max(len(p) for p in positions)
        counts = [sum(p[i] for p in positions if i < len(p)) for i in range(depth)]
        total_rounds = sum(rounds)
        per_pos = tuple(c / total_rounds for c in counts) if total_rounds else None
        conditional = tuple(c / prev if prev else 0.0 for c, prev in zip(counts, [total_rounds, *counts]))
    return Acceptance(int(sum(drafted)), int(sum(acc)), int(sum(rounds)) if with_rounds else None,
                      Estimate(_ratio(sum(acc), sum(drafted)), ci95((acc, drafted), ratio_of_sums)),
                      Estimate(1 + sum(acc) / sum(rounds) if with_rounds and sum(rounds) else None,
                               ci95((acc, rounds), lambda a, r, axis=-1: 1 + ratio_of_sums(a, r, axis))
                               if with_rounds else None),
                      per_pos, conditional, tuple(sorted({x.stats.source for x in told})),
                      len(results) - len(told))


def predict(acc: Acceptance | None, k: int | None, draft_cost: float | None, draft_cost_from: str | None,
            verify_ratio: float, measured: float | None) -> Prediction:
    """The cost model's speedup from the measured acceptance, beside the measured one (see the docstring)."""
    k = k or (len(acc.conditional) if acc and acc.conditional else None)
    e_measured = acc.mean_accepted_length.value if acc else None
    implied = e_measured / measured if e_measured and measured else None
    expected = speedup = None
    if acc and acc.acceptance.value is not None and k and draft_cost is not None:
        if acc.conditional:
            cost = CostModel(1.0, draft_cost, (verify_ratio,) * (k + 1))  # time in target steps (T1 = 1)
            expected, speedup = expected_tokens(acc.conditional, k), predicted_speedup(acc.conditional, cost, k)
        else:
            w = what_if(min(max(acc.acceptance.value, 0.0), 1.0), k, draft_cost, verify_ratio)
            expected, speedup = w.expected_tokens, w.speedup
    even = (e_measured - verify_ratio) / k if e_measured and k else None
    return Prediction(k, draft_cost, draft_cost_from if draft_cost is not None else None, verify_ratio, expected,
                      speedup, measured, implied, even)


def summarise(runs: Sequence[Run], k: int | None = None, draft_cost: float | None = None,
              verify_ratio: float = 1.0) -> RaceSummary:
    lanes = [lane for lane in (SPEC, PLAIN, DRAFT) if any(r.lane == lane for r in runs)]
    summaries = {lane: lane_summary(runs, lane) for lane in lanes}
    spec, plain = summaries.get(SPEC), summaries.get(PLAIN)
    columns = (*(per_prompt(runs, SPEC, f) for f in (decode_tokens, decode_seconds)),
               *(per_prompt(runs, PLAIN, f) for f in (decode_tokens, decode_seconds)))
    measured = _ratio(spec.decode_tokens_per_s.value or 0, plain.decode_tokens_per_s.value or 0) \
        if spec and plain else None
    speedup = Estimate(measured, ci95(columns, ratio_of_ratios) if spec and plain else None)
    e2e = _ratio(spec.end_to_end_tokens_per_s or 0, plain.end_to_end_tokens_per_s or 0) if spec and plain else None
    cost_from = "--draft-cost" if draft_cost is not None else None
    if draft_cost is None and DRAFT in summaries and plain and summaries[DRAFT].decode_tokens_per_s.value:
        draft_cost = _ratio(plain.decode_tokens_per_s.value or 0, summaries[DRAFT].decode_tokens_per_s.value)
        cost_from = "draft-alone lane"
    acc = acceptance_of(runs)
    return RaceSummary(tuple(summaries.values()), speedup, e2e, acc,
                       predict(acc, k, draft_cost, cost_from, verify_ratio, measured),
                       len({r.prompt.id for r in runs}), 1 + max((r.repeat for r in runs), default=0))
