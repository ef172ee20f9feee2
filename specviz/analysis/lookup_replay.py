"""What prompt lookup and hybrid drafting would have accepted on a recorded run, replayed offline.

The n-gram drafter needs no model: given the context it proposes what followed the latest earlier
occurrence of its last tokens (`engine.drafters.lookup_continuation`, the live drafter's own code). The
replay walks the recorded target tokens round by round as a live run would (the same K per round, never
past max_new_tokens, the 'acceptance' mode's K schedule): a drafted token is accepted when it is the token
the target emitted there, and the round commits the accepted drafts plus the target's own next token.

For a greedy run this is exactly what a live lookup run would do (its text is the target's greedy text);
for a sampled run it is an estimate against the one text the run drew.

Hybrid drafts with lookup where the context offers a continuation and with the draft model elsewhere.
The draft model's greedy proposal at a position is known wherever the recorded run drafted there after
the true prefix (its accepted drafts and the rejected one); elsewhere (after a clean sweep, where the
target added a bonus) it is unknown, and the replayed draft stops there: counted in `unknown`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specviz.analysis.predict import CostModel, round_time
from specviz.analysis.stats import ratio
from specviz.engine.config import DecodeConfig, next_k
from specviz.engine.drafters import lookup_continuation
from specviz.engine.events import ACCEPTED, REJECTED, Round

NEVER = -1  # a draft token after the draft's own mistake: never verified, never equal to a target token
# (context, position in the output, K this round) -> (drafted tokens, drafted by the model, stopped at an unknown)
Proposer = Callable[[list[int], int, int], tuple[list[int], bool, bool]]


@dataclass(frozen=True)
class ReplayRound:
    k: int  # tokens drafted
    n_accepted: int
    new_token_ids: tuple[int, ...]
    by_model: bool = False  # hybrid: lookup had nothing here, the draft model drafted
    unknown: bool = False  # hybrid: the draft's proposal at a position was never recorded; it stopped there


@dataclass(frozen=True)
class ReplaySummary:
    rounds: int
    drafted: int
    accepted: int
    acceptance: float  # accepted / drafted
    tokens: int
    tokens_per_round: float
    model_drafted: int  # of the drafted tokens, by the draft model (they cost a draft step each)
    unknown: int  # rounds whose model draft stopped at an unrecorded proposal


def recorded_tokens(rounds: Sequence[Round]) -> list[int]:
    return [t for r in rounds for t in r.new_token_ids]


def replay(prompt_ids: Sequence[int], tokens: Sequence[int], config: DecodeConfig, propose: Proposer
           ) -> list[ReplayRound]:
    """Rounds of a drafter over the target's recorded `tokens`, as the live round loop takes them."""
    history, pos, k, out = list(prompt_ids), 0, config.k, []
    while pos < len(tokens):
        k_round = max(0, min(k, config.max_new_tokens - pos - 1))
        drafted, by_model, unknown = propose(history, pos, k_round)
        n = 0
        while n < len(drafted) and pos + n < len(tokens) and drafted[n] == tokens[pos + n]:
            n += 1
        new = tuple(tokens[pos:pos + n + 1])  # the accepted drafts and the target's next (when recorded)
        out.append(ReplayRound(len(drafted), min(n, len(new)), new, by_model, unknown))
        history += new
        pos += len(new)
        k = next_k(config, k, len(drafted), n)
    return out


def lookup_proposer(history: list[int], pos: int, k: int) -> tuple[list[int], bool, bool]:
    return lookup_continuation(history, k), False, False


def draft_oracle(rounds: Sequence[Round]) -> dict[int, tuple[int, float]]:
    """Output position -> (the draft model's token there after the true prefix, its confidence q_soft), from
    every drafted token the target tested (a token after a rejection followed a wrong prefix)."""
    seen = {}
    for r in rounds:
        for i, t in enumerate(r.drafted):
            if t.status in (ACCEPTED, REJECTED):
                seen[r.position + i] = (t.id, t.q_soft)
    return seen


def hybrid_proposer(rounds: Sequence[Round], config: DecodeConfig) -> Proposer:
    oracle, tokens = draft_oracle(rounds), recorded_tokens(rounds)
    cut = config.stop_below  # the confidence cut ends the model's drafting as it did live

    def propose(history: list[int], pos: int, k: int) -> tuple[list[int], bool, bool]:
        looked = lookup_continuation(history, k)
        if looked or k == 0:
            return looked, False, False
        drafted: list[int] = []
        for i in range(k):
            if (seen := oracle.get(pos + i)) is None:
                return drafted, True, True
            token, confidence = seen
            drafted.append(token)
            if i < k - 1 and confidence < cut:
                break
            if pos + i < len(tokens) and token != tokens[pos + i]:  # it drafts on after its mistake, unverified
                drafted += [NEVER] * (k - i - 1)  # (how far its cut would let it: unknown, so up to K)
                break
        return drafted, True, False
    return propose


def replay_lookup(prompt_ids: Sequence[int], rounds: Sequence[Round], config: DecodeConfig) -> list[ReplayRound]:
    return replay(prompt_ids, recorded_tokens(rounds), config, lookup_proposer)


def replay_hybrid(prompt_ids: Sequence[int], rounds: Sequence[Round], config: DecodeConfig
                  ) -> list[ReplayRound] | None:
    """None when the run's drafter was not a draft model (nothing recorded says what the model would draft)."""
    if not rounds or any(r.drafter not in ("model", "self") for r in rounds):
        return None
    return replay(prompt_ids, recorded_tokens(rounds), config, hybrid_proposer(rounds, config))


def summarise(replayed: Sequence[ReplayRound]) -> ReplaySummary:
    drafted, accepted = sum(r.k for r in replayed), sum(r.n_accepted for r in replayed)
    tokens = sum(len(r.new_token_ids) for r in replayed)
    return ReplaySummary(len(replayed), drafted, accepted, ratio(accepted, drafted), tokens,
                         ratio(tokens, len(replayed)), sum(r.k for r in replayed if r.by_model),
                         sum(r.unknown for r in replayed))


def replay_speedup(replayed: Sequence[ReplayRound], cost: CostModel) -> float:
    """The cost model on the replayed rounds: lookup drafts for free (a host-side search), the model pays its
    draft step per token; every round pays one verify of its drafts plus one."""
    seconds = sum(round_time(cost, r.k) - (0.0 if r.by_model else r.k * cost.draft_step_s) for r in replayed)
    return ratio(sum(len(r.new_token_ids) for r in replayed) * cost.target_step_s, seconds)
