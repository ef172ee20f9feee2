"""All decoding settings in one frozen dataclass, passed in; nothing persists between runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from specviz.engine.sampling import SamplingParams

ADAPTIVE_MODES = ("fixed", "confidence", "acceptance")


@dataclass(frozen=True)
class DecodeConfig:
    k: int = 4  # tokens drafted per round (the cap, for adaptive modes)
    max_new_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = 0
    drafter: str = "model"  # model | lookup | hybrid
    adaptive: str = "fixed"  # fixed | confidence | acceptance
    confidence: float = 0.4  # "confidence": stop drafting when the draft's top probability drops below
    top_n: int = 10  # candidates recorded per position for drill-down

    @property
    def stop_below(self) -> float:
        """The drafter's confidence cut: `confidence` in "confidence" mode, 0 (off) otherwise."""
        return self.confidence if self.adaptive == "confidence" else 0.0


def next_k(config: DecodeConfig, k: int, drafted: int, accepted: int) -> int:
    """K for the next round. "acceptance": grow by 2 after a clean sweep, shrink by 1 after a rejection."""
    if config.adaptive != "acceptance" or drafted == 0:
        return k
    return min(config.k, k + 2) if accepted == drafted else max(1, k - 1)
