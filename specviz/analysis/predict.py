"""The speedup prediction model: measured costs + measured per-position acceptance -> tokens/s.

A round drafts K tokens (K draft steps) and verifies them in one target forward over K+1
positions. With α_i = P(draft token i accepted | tokens 1..i-1 accepted), the tokens a round
emits are, in expectation (accepted drafts plus the correction or bonus),

    E(K) = 1 + Σ_{i=1..K} Π_{j<=i} α_j

and, with T1 the target's one-token step, ĉ = draft step / T1 and T_verify(n) the target's
forward over n new tokens,

    speedup(K) = E(K) · T1 / (K · ĉ · T1 + T_verify(K+1)).

Pure functions of numbers; measuring the costs on a device lives in `costs.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    target_step_s: float  # T1: one target forward of one new token, with a KV cache
    draft_step_s: float  # one draft forward of one new token, with a KV cache
    verify_s: tuple[float, ...]  # verify_s[n - 1]: one target forward of n new tokens, n = 1..len

    @property
    def c(self) -> float:
        """ĉ: draft step / target step."""
        return self.draft_step_s / self.target_step_s

    @property
    def verify_ratio(self) -> tuple[float, ...]:
        """T_verify(n) / T1 for n = 1..len: 1.0 everywhere would mean verification is free."""
        return tuple(t / self.target_step_s for t in self.verify_s)

    def verify_time(self, n: int) -> float:
        """T_verify(n); past the measured range, extend the last measured slope."""
        if n <= len(self.verify_s):
            return self.verify_s[n - 1]
        slope = self.verify_s[-1] - self.verify_s[-2] if len(self.verify_s) > 1 else self.verify_s[-1]
        return self.verify_s[-1] + max(slope, 0.0) * (n - len(self.verify_s))


def extend_alpha(alpha: Sequence[float], k: int) -> list[float]:
    """α̂ for positions 1..k; positions never measured take the last measured value."""
    if not alpha:
        return [0.0] * k
    return [alpha[i] if i < len(alpha) else alpha[-1] for i in range(k)]


def expected_tokens(alpha: Sequence[float], k: int) -> float:
    """E(K) = 1 + Σ_i Π_{j<=i} α_j: tokens per round incl. the correction/bonus."""
    total, run = 1.0, 1.0
    for a in extend_alpha(alpha, k):
        run *= a
        total += run
    return total


def round_time(cost: CostModel, k: int) -> float:
    """Seconds per round: K draft steps + one verify of K+1 positions."""
    return k * cost.draft_step_s + cost.verify_time(k + 1)


def predicted_speedup(alpha: Sequence[float], cost: CostModel, k: int) -> float:
    return expected_tokens(alpha, k) * cost.target_step_s / round_time(cost, k)


def predicted_speedup_for_rounds(ks: Sequence[int], tokens: int, cost: CostModel) -> float:
    """The model applied to a run's actual rounds (K_r drafted in round r, `tokens` emitted in all):
    tokens · T1 / Σ_r (K_r · ĉ · T1 + T_verify(K_r + 1)).

    For a fixed K this is the formula above: the conditional α̂'s telescope (α̂_j = rounds with
    >= j accepted / rounds with >= j-1 accepted), so E(K) from α̂ equals the measured tokens per
    round. It also covers what that formula cannot: an adaptive K, and the shorter last rounds
    (never drafting past max_new_tokens). Measured / this = how close the implementation comes
    to its own cost model: the efficiency.
    """
    seconds = sum(round_time(cost, k) for k in ks)
    return tokens * cost.target_step_s / seconds if seconds > 0 else 0.0


def best_k(alpha: Sequence[float], cost: CostModel, ks: Iterable[int]) -> int:
    """The K with the highest predicted speedup (the smaller K on a tie)."""
    return max(sorted(ks), key=lambda k: (round(predicted_speedup(alpha, cost, k), 9), -k))
