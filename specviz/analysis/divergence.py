"""Where a speculative run and the target alone first part ways, from their events.

Greedy speculative decoding emits exactly the target's argmax sequence in exact arithmetic. In
bf16, verifying K+1 positions in one forward rounds differently from one-token steps, so at a
near-tie (top-1 and top-2 logits a hair apart) the two can pick different tokens. The target's
top-2 gap at the first differing position says whether that is what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.engine.events import Round, Step


@dataclass(frozen=True)
class Divergence:
    position: int  # index in the generated sequence of the first differing token
    target_top2_gap: float | None  # the target's top-1 minus top-2 logit there, in the AR run (None past its end)
    spec_top2_gap: float | None  # the same from the speculative run's verify forward (None past its end)


def spec_token_ids(rounds: Sequence[Round]) -> list[int]:
    return [t for r in rounds for t in r.new_token_ids]


def spec_gap_at(rounds: Sequence[Round], position: int) -> float | None:
    """The target's top-2 gap behind the speculative run's token at `position`."""
    for r in rounds:
        offset = position - r.position
        if 0 <= offset < r.tokens_emitted:
            if offset < r.n_accepted:
                return r.drafted[offset].target_top2_gap
            return r.emitted.target_top2_gap if r.emitted is not None else None
    return None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token sequences differ (a shorter one differs where it ends); None if equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def first_divergence(spec_rounds: Sequence[Round], ar_steps: Sequence[Step]) -> Divergence | None:
    """None when both runs emitted the same tokens; otherwise the first position that differs.

    A run that ends earlier than the other (while agreeing up to there) diverges where it ended.
    """
    position = first_difference(spec_token_ids(spec_rounds), [s.token.id for s in ar_steps])
    if position is None:
        return None
    ar_gap = ar_steps[position].token.target_top2_gap if position < len(ar_steps) else None
    return Divergence(position, ar_gap, spec_gap_at(spec_rounds, position))
