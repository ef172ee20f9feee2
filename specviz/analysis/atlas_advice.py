"""What to change, computed from the recorded rounds: K and the cut per prompt kind, another drafter, the ceiling.

K and the cut: each recorded round is replayed under a smaller K or a stricter confidence cut, which only
ever drops drafts it made: K' keeps its first K' drafts, a cut c' ends it after the first draft whose
confidence (q_soft) falls under c'. Accepted drafts are those kept of the ones it accepted; the round still
ends with one token of the target's. The cost model (`predict.py`) prices each replayed round, as it prices
a live run's. Larger K or a looser cut than the run's would need drafts never made: for those the fixed-K
what-if model (`whatif.py`) extrapolates from the measured acceptance.

Another drafter: prompt lookup and hybrid replayed offline on the recorded target tokens (`lookup_replay`).
The ceiling: a draft that is always right (every draft accepted) at this K and this draft's cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.analysis.atlas import Count, by_kind, count
from specviz.analysis.lookup_replay import (
    ReplayRound, ReplaySummary, replay_hybrid, replay_lookup, replay_speedup, summarise,
)
from specviz.analysis.predict import CostModel, expected_tokens, predicted_speedup, predicted_speedup_for_rounds
from specviz.analysis.rejections import PromptRun, chain_rounds
from specviz.analysis.stats import spec_stats
from specviz.analysis.whatif import MAX_K, what_if
from specviz.engine.config import DecodeConfig
from specviz.engine.events import Round

CUTS = tuple(round(0.1 * i, 1) for i in range(1, 10))  # stricter cuts tried: 0.1 .. 0.9


@dataclass(frozen=True)
class Setting:
    k: int
    cut: float  # the confidence cut, 0: none
    predicted_speedup: float


@dataclass(frozen=True)
class KindAdvice:
    kind: str
    prompts: int
    rounds: int
    acceptance: Count
    current: Setting  # the run's own K and cut, priced on its rounds as they ran
    best: Setting  # the best K <= the run's and cut >= the run's
    whatif_best_k: int | None  # fixed K, no cut, at this kind's acceptance (may exceed the run's K)
    lookup: ReplaySummary
    hybrid: ReplaySummary | None


@dataclass(frozen=True)
class Alternative:
    """Another drafter on the same prompts, replayed."""

    name: str  # lookup | hybrid
    replay: ReplaySummary
    predicted_speedup: float | None


@dataclass(frozen=True)
class Ceiling:
    k: int
    tokens_per_round: float  # K + 1
    predicted_speedup: float


@dataclass(frozen=True)
class Advice:
    kinds: tuple[KindAdvice, ...]
    alternatives: tuple[Alternative, ...]
    ceiling: Ceiling | None


def cut_round(r: Round, k: int, cut: float) -> tuple[int, int, int]:
    """(drafted, accepted, tokens emitted) of a recorded round had it drafted at most k tokens and stopped after
    the first whose confidence fell under `cut` (as a live cut does, never after its last allowed draft)."""
    allowed = min(k, len(r.drafted))
    drafted = next((i + 1 for i, t in enumerate(r.drafted[:allowed]) if i < allowed - 1 and t.q_soft < cut),
                   allowed)
    accepted = min(r.n_accepted, drafted)
    # a round cut before its own end emits the target's token there; uncut, what it emitted
    return drafted, accepted, accepted + 1 if accepted < r.n_accepted else r.tokens_emitted


def replayed_speedup(rounds: Sequence[Round], k: int, cut: float, cost: CostModel) -> float:
    cut_rounds = [cut_round(r, k, cut) for r in rounds]
    return predicted_speedup_for_rounds([d for d, _, _ in cut_rounds], sum(t for _, _, t in cut_rounds), cost)


def settings_grid(rounds: Sequence[Round], config: DecodeConfig, cost: CostModel) -> tuple[Setting, Setting]:
    """(the run's own setting, the best of it and of K' <= its K x cuts >= its cut). The run's own is priced on
    its rounds as they ran; the others by the replay (with a sampled run's q_soft standing in for the
    draft's top probability, which the live cut reads: the same when greedy)."""
    k_max = max((len(r.drafted) for r in rounds), default=0) or config.k
    base = config.stop_below
    cuts = (base, *(c for c in CUTS if c > base + 1e-9))
    grid = [Setting(k, c, replayed_speedup(rounds, k, c, cost)) for k in range(1, k_max + 1) for c in cuts]
    current = Setting(config.k, base, predicted_speedup_for_rounds([r.k for r in rounds],
                                                                   sum(r.tokens_emitted for r in rounds), cost))
    # ties: the run's own (nothing to change), then the smaller K, then the cut nearest the run's
    best = max([current, *grid], key=lambda s: (round(s.predicted_speedup, 9), s is current, -s.k, -s.cut))
    return current, best


def whatif_best_k(acceptance: float, config: DecodeConfig, cost: CostModel) -> int:
    """The what-if calculator's best K at this acceptance, the draft's cost and the verify ratio at K + 1."""
    verify = cost.verify_time(config.k + 1) / cost.target_step_s
    return what_if(min(max(acceptance, 0.0), 1.0), min(config.k, MAX_K), cost.c, verify).best_k


Replays = dict[str, tuple[list[ReplayRound], list[ReplayRound] | None]]  # run id -> (lookup, hybrid)


def replays_of(runs: Sequence[PromptRun], config: DecodeConfig) -> Replays:
    return {run.id: (replay_lookup(run.prompt_ids, run.rounds, config),
                     replay_hybrid(run.prompt_ids, run.rounds, config)) for run in runs}


def pooled(runs: Sequence[PromptRun], replays: Replays) -> tuple[list[ReplayRound], list[ReplayRound] | None]:
    """The runs' lookup and hybrid replays, concatenated (hybrid: None if any run cannot replay it)."""
    lookup, hybrid = [], []
    for run in runs:
        one, other = replays[run.id]
        lookup += one
        hybrid = None if other is None or hybrid is None else hybrid + other
    return lookup, hybrid


def kind_advice(kind: str, runs: Sequence[PromptRun], config: DecodeConfig, cost: CostModel, replays: Replays
                ) -> KindAdvice:
    rounds = [r for run in runs for r in chain_rounds(run)]
    s = spec_stats(rounds)
    current, best = settings_grid(rounds, config, cost)
    lookup, hybrid = pooled(runs, replays)
    return KindAdvice(kind, len(runs), len(rounds), count(s.drafted, s.accepted), current, best,
                      whatif_best_k(s.acceptance_rate, config, cost) if s.drafted else None,
                      summarise(lookup), None if hybrid is None else summarise(hybrid))


def advice(runs: Sequence[PromptRun], config: DecodeConfig, cost: CostModel | None) -> Advice:
    """Nothing to advise without a cost model (no round drafted anything) or with tree rounds only. Run ids
    must be unique (they name the runs everywhere)."""
    runs = [run for run in runs if chain_rounds(run)]
    if cost is None or not runs:
        return Advice((), (), None)
    replays = replays_of(runs, config)
    kinds = tuple(kind_advice(kind, rs, config, cost, replays) for kind, rs in by_kind(runs).items())
    lookup, hybrid = pooled(runs, replays)
    alternatives = [Alternative("lookup", summarise(lookup), replay_speedup(lookup, cost))]
    if hybrid is not None:
        alternatives.append(Alternative("hybrid", summarise(hybrid), replay_speedup(hybrid, cost)))
    ceiling = Ceiling(config.k, expected_tokens([1.0], config.k), predicted_speedup([1.0], cost, config.k))
    return Advice(kinds, tuple(alternatives), ceiling)
