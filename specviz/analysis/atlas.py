"""The Atlas: where a draft fails on a set of prompts, from their recorded rounds. Pure: events in, numbers out.

Every rate comes with its count (`Count`: how many were tested, how many accepted). A drafted token the
target tested is one trial; the drafts after a rejection were never tested. A rejection loses the rejected
draft and every draft after it in that round (`rejections.Rejection.lost`). A position's *class* is the
class of the token the target put there (the accepted draft, or the correction that replaced a rejected
one): "when the target writes a number, the draft matches it in 60 % of 120 tries". What to change (K,
the cut, another drafter, the ceiling) is in `atlas_advice.py`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from specviz.analysis.predict import CostModel, predicted_speedup_for_rounds
from specviz.analysis.rejections import PromptRun, Rejection, chain_rounds, rejections
from specviz.analysis.stats import mean_beta, ratio, spec_stats, tested_drafts
from specviz.analysis.token_classes import CLASSES, UNDRAFTABLE, token_class
from specviz.engine.events import ACCEPTED, NOT_VERIFIED, Round

CONTEXT_CHARS = 80  # of generated text shown before a disagreement
EXAMPLES = 3  # contexts kept per disagreement
TOP_DISAGREEMENTS = 20
CONFIDENCE_BINS = 10
ENTROPY_EDGES = (0.0, 0.1, 0.5, 1.0, 2.0, 4.0, math.inf)  # nats: sure ... spread over many tokens


@dataclass(frozen=True)
class Count:
    n: int  # tested
    accepted: int
    rate: float  # accepted / n (0 when n = 0)
    # what should have happened: the mean β = Σ min(p, q) of the same tested drafts (None: none recorded, as in
    # older traces and trees)
    expected: float | None = None


def count(n: int, accepted: int, betas: Sequence[float | None] = ()) -> Count:
    return Count(n, accepted, ratio(accepted, n), mean_beta(betas) if len(betas) == n else None)


Z99 = 2.5758  # the normal quantile of a two-sided 99 % interval


def beta_range(betas: Sequence[float]) -> tuple[float, float] | None:
    """The acceptance rate the drafts' βs predict, as a 99 % interval: the accepted count is a sum of independent
    Bernoulli(β_i) (a Poisson binomial: mean Σβ, variance Σβ(1 - β)), its normal approximation over n."""
    if not betas:
        return None
    n, mean = len(betas), sum(betas)
    half = Z99 * math.sqrt(sum(b * (1 - b) for b in betas))
    return max(0.0, (mean - half) / n), min(1.0, (mean + half) / n)


@dataclass(frozen=True)
class PromptRow:
    id: str
    kind: str
    prompt_tokens: int
    rounds: int
    tokens: int
    acceptance: Count  # accepted / drafted (as `totals`; per position, class and bin: / tested)
    tokens_per_round: float
    predicted_speedup: float | None  # the cost model on this run's rounds
    measured_speedup: float | None  # its race, when it raced
    finished: str | None
    tested: Count = Count(0, 0, 0.0)  # accepted / tested, with the mean β of the same drafts
    # the 99 % range of acceptance those βs predict (`beta_range`), and whether the realised rate fell outside it:
    # a draft that truly disagrees, or an unlucky run, told apart (None: no β recorded)
    expected_range: tuple[float, float] | None = None
    outside_expected: bool | None = None


@dataclass(frozen=True)
class Bin:
    low: float
    high: float | None  # None: open-ended
    mean: float  # of the binned value (confidence, entropy)
    acceptance: Count


@dataclass(frozen=True)
class Where:
    """Where in the round the draft fails."""

    by_position: tuple[Count, ...]  # i = 1..K: P(accepted | drafts 1..i-1 accepted), n = rounds that tested i
    by_confidence: tuple[Bin, ...]  # the draft's q_soft(x): a reliability curve
    by_entropy: tuple[Bin, ...]  # the entropy the draft showed (nats); tokens recorded without it are left out


@dataclass(frozen=True)
class Token:
    id: int
    text: str


@dataclass(frozen=True)
class Example:
    prompt_id: str
    round: int
    context: str  # the generated text just before the position


@dataclass(frozen=True)
class Disagreement:
    drafted: Token  # what the draft proposed
    wanted: Token  # what the target emitted instead
    count: int
    tokens_lost: int
    examples: tuple[Example, ...]


@dataclass(frozen=True)
class ClassRow:
    name: str
    acceptance: Count  # positions where the target's token is of this class
    rejections: int
    tokens_lost: int


@dataclass(frozen=True)
class Totals:
    prompts: int
    rounds: int
    tokens: int
    acceptance: Count  # accepted / drafted (drafts after a rejection count: the work thrown away)
    tokens_per_round: float
    predicted_speedup: float | None
    measured_speedup: float | None  # over every race: all speculative tokens/s over all target-alone tokens/s


@dataclass(frozen=True)
class Findings:
    """What the Atlas measured (the advice aside)."""

    totals: Totals
    prompts: tuple[PromptRow, ...]  # worst first
    where: Where
    disagreements: tuple[Disagreement, ...]
    classes: tuple[ClassRow, ...]
    undraftable: ClassRow  # targets' tokens the draft could not have proposed (another family's vocabulary)
    kinds: dict[str, Count]  # acceptance per prompt kind


def predicted(rounds: Sequence[Round], cost: CostModel | None) -> float | None:
    """The cost model on these rounds; None for tree rounds (the chain's model does not describe them)."""
    if cost is None or not any(r.k for r in rounds) or any(r.drafter == "tree" for r in rounds):
        return None
    return predicted_speedup_for_rounds([r.k for r in rounds], sum(r.tokens_emitted for r in rounds), cost)


def prompt_row(run: PromptRun, cost: CostModel | None) -> PromptRow:
    s = spec_stats(run.rounds)
    tokens = tested_drafts(chain_rounds(run))
    trial = count(len(tokens), sum(t.status == ACCEPTED for t in tokens), [t.beta for t in tokens])
    span = beta_range([t.beta for t in tokens]) if trial.expected is not None else None
    return PromptRow(run.id, run.kind, len(run.prompt_ids), s.rounds, s.tokens, count(s.drafted, s.accepted),
                     s.mean_accepted_tokens, predicted(run.rounds, cost), run.measured_speedup, run.finished,
                     trial, span, None if span is None else not span[0] <= trial.rate <= span[1])


def worst_first(rows: Sequence[PromptRow]) -> list[PromptRow]:
    """Lowest acceptance first (then fewest tokens per round); a row with nothing drafted last."""
    return sorted(rows, key=lambda r: (r.acceptance.n == 0, r.acceptance.rate, r.tokens_per_round, r.id))


def binned(values: Sequence[float], tokens: Sequence, edges: Sequence[float]) -> tuple[Bin, ...]:
    """Acceptance (and mean β) of the tested `tokens` per bin [edges[i], edges[i+1]) of their `values`; empty bins
    left out."""
    rows = []
    for low, high in zip(edges, edges[1:]):
        inside = [(v, t) for v, t in zip(values, tokens) if low <= v < high]
        if inside:
            rows.append(Bin(low, None if math.isinf(high) else high, sum(v for v, _ in inside) / len(inside),
                            count(len(inside), sum(t.status == ACCEPTED for _, t in inside),
                                  [t.beta for _, t in inside])))
    return tuple(rows)


def where(runs: Sequence[PromptRun]) -> Where:
    rounds = [r for run in runs for r in chain_rounds(run)]
    s = spec_stats(rounds)
    tokens = tested_drafts(rounds)
    # the acceptance model's reliability bins, with the confidence q_soft as the prediction
    edges = [b / CONFIDENCE_BINS for b in range(CONFIDENCE_BINS)] + [math.inf]  # (its last bin holds q_soft = 1)
    confidence = tuple(replace(b, high=min(b.high or 1.0, 1.0)) for b in binned([t.q_soft for t in tokens], tokens,
                                                                                 edges))
    shown = [t for t in tokens if t.q_entropy is not None]
    entropy = binned([t.q_entropy for t in shown], shown, ENTROPY_EDGES)
    at = [[r.drafted[i].beta for r in rounds if len(r.drafted) > i and r.drafted[i].status != NOT_VERIFIED]
          for i in range(len(s.tested))]
    return Where(tuple(count(t, p, b) for t, p, b in zip(s.tested, s.passed, at)), confidence, entropy)


def context_before(rej: Rejection) -> str:
    """The generated text just before the rejected draft: earlier rounds, then this round's accepted drafts."""
    earlier = rej.run.rounds[rej.round.index - 1].text if rej.round.index > 0 else ""
    return (earlier + "".join(t.text for t in rej.round.drafted[:rej.index]))[-CONTEXT_CHARS:]


def disagreements(runs: Sequence[PromptRun], top: int = TOP_DISAGREEMENTS) -> list[Disagreement]:
    """(drafted x, target wanted y) pairs, most tokens lost first, each with up to EXAMPLES contexts."""
    groups: dict[tuple[int, int], list[Rejection]] = defaultdict(list)
    for rej in rejections(runs):
        groups[(rej.round.drafted[rej.index].id, rej.round.emitted.id)].append(rej)
    out = []
    for rejs in groups.values():
        drafted, wanted = rejs[0].round.drafted[rejs[0].index], rejs[0].round.emitted
        examples = tuple(Example(rej.run.id, rej.round.index, context_before(rej)) for rej in rejs[:EXAMPLES])
        out.append(Disagreement(Token(drafted.id, drafted.text), Token(wanted.id, wanted.text), len(rejs),
                                sum(rej.lost for rej in rejs), examples))
    return sorted(out, key=lambda d: (-d.tokens_lost, -d.count, d.drafted.id, d.wanted.id))[:top]


@dataclass
class _Tally:
    n: int = 0
    accepted: int = 0
    rejections: int = 0
    lost: int = 0
    betas: list = field(default_factory=list)

    def row(self, name: str) -> ClassRow:
        return ClassRow(name, count(self.n, self.accepted, self.betas), self.rejections, self.lost)


def classes(runs: Sequence[PromptRun], special_ids: frozenset[int] = frozenset()
            ) -> tuple[list[ClassRow], ClassRow]:
    """Acceptance and tokens lost per content class of the target's token, and, apart, the tokens the
    target chose that the draft could not have proposed."""
    tally = {name: _Tally() for name in CLASSES}
    undraftable = _Tally()
    for run in runs:
        for r in chain_rounds(run):
            for t in r.drafted:
                if t.status == ACCEPTED:
                    row = tally[token_class(t.text, t.id in special_ids)]
                    row.n += 1
                    row.accepted += 1
                    row.betas.append(t.beta)
        for rej in rejections([run]):
            e = rej.round.emitted
            for row in [tally[token_class(e.text, e.id in special_ids)], *([] if e.draftable else [undraftable])]:
                row.n += 1
                row.rejections += 1
                row.lost += rej.lost
                row.betas.append(rej.round.drafted[rej.index].beta)
    return [t.row(name) for name, t in tally.items()], undraftable.row(UNDRAFTABLE)


def totals(runs: Sequence[PromptRun], cost: CostModel | None) -> Totals:
    rounds = [r for run in runs for r in run.rounds]
    s = spec_stats(rounds)
    raced = [run for run in runs if run.steps and run.measured_speedup]
    measured = None
    if raced:  # ratio of totals (each lane's recorded times, prompt reading included), never a mean of ratios
        spec_s = sum(r.prefill_time + r.draft_time + r.verify_time + r.overhead_time for run in raced
                     for r in run.rounds)
        ar_s = sum(st.prefill_time + st.time for run in raced for st in run.steps)
        spec_tokens = sum(r.tokens_emitted for run in raced for r in run.rounds)
        measured = ratio(ratio(spec_tokens, spec_s), ratio(sum(len(run.steps) for run in raced), ar_s)) or None
    return Totals(len(runs), s.rounds, s.tokens, count(s.drafted, s.accepted), s.mean_accepted_tokens,
                  predicted(rounds, cost), measured)


def by_kind(runs: Sequence[PromptRun]) -> dict[str, list[PromptRun]]:
    kinds: dict[str, list[PromptRun]] = defaultdict(list)
    for run in runs:
        kinds[run.kind].append(run)
    return dict(sorted(kinds.items()))


def findings(runs: Sequence[PromptRun], cost: CostModel | None, special_ids: frozenset[int] = frozenset()
             ) -> Findings:
    class_rows, undraftable = classes(runs, special_ids)
    kinds = {}
    for kind, rs in by_kind(runs).items():
        s = spec_stats([r for run in rs for r in run.rounds])
        kinds[kind] = count(s.drafted, s.accepted)
    return Findings(totals(runs, cost), tuple(worst_first([prompt_row(run, cost) for run in runs])), where(runs),
                    tuple(disagreements(runs)), tuple(class_rows), undraftable, kinds)
