"""Will the target accept a drafted token? A logistic model of what the draft knew when it proposed it.

The features: the draft's top probability and the entropy of the distribution it showed (its top-n, the
rest as one more outcome), the token's position in its round, and which drafter made it. Its weights are
fitted on recorded rounds (`specviz.analysis.acceptance`, `specviz bench --save-predictor`); the shipped fit
is `specviz/data/acceptance_model.json`. The 'predicted' adaptive mode stops drafting once the prediction for
the token just drafted falls below the cut. Like any stop rule it decides only how many tokens to draft, so
exactness is untouched.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from specviz.engine.events import DraftedToken

DRAFTERS = ("model", "lookup", "hybrid", "self")
FEATURES = ("top_prob", "entropy", "position", *(f"drafter={d}" for d in DRAFTERS[1:]))
SHIPPED = "acceptance_model.json"


def entropy_of_top(probs: Sequence[float]) -> float:
    """Entropy (nats) of a top-n distribution, the mass outside it counted as one more outcome."""
    probs = [p for p in probs if p > 0]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in [*probs, rest] if p > 0)


def feature_vector(top_probs: Sequence[float], position: int, drafter: str) -> list[float]:
    """`top_probs`: the shown distribution's top-n probabilities, largest first; `position`: 0-based in the round."""
    return [top_probs[0] if top_probs else 0.0, entropy_of_top(top_probs), float(position),
            *(float(drafter == d) for d in DRAFTERS[1:])]


def token_features(t: DraftedToken, position: int, drafter: str) -> list[float]:
    """The features of a drafted token as its round's event records it (what the draft showed)."""
    return feature_vector([c.prob for c in t.q_top] or [t.q], position, drafter)


@dataclass(frozen=True)
class AcceptanceModel:
    """P(accept) = sigmoid(bias + Σ weight_i · feature_i)."""

    bias: float
    weights: tuple[float, ...]

    def predict(self, x: Sequence[float]) -> float:
        z = self.bias + sum(w * v for w, v in zip(self.weights, x))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def to_dict(self) -> dict:
        return {"bias": self.bias, "weights": dict(zip(FEATURES, self.weights))}

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceModel:
        return cls(float(d["bias"]), tuple(float(d["weights"][f]) for f in FEATURES))


@functools.cache  # read once per process: a run of the proof asks thousands of times
def shipped_model() -> AcceptanceModel:
    """The fit shipped with specviz (`specviz bench --save-predictor`; its `fitted_on` says on what)."""
    return AcceptanceModel.from_dict(json.loads(resources.files("specviz.data").joinpath(SHIPPED).read_text()))
