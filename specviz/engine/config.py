"""All decoding settings in one frozen dataclass, passed in; nothing persists between runs.

This is also the settings *spec*: each field declares its type, default, range or choices, label
(title) and help (description). The CLI options, validation messages, Gradio controls and API
parameters are generated from it (`specviz.settings.spec`), so adding a setting means adding one
field here. "limit" names the server limit (`specviz.settings.limits.Limits`) that caps a field.
Defaults: the settings `specviz bench` measured fastest on the embedded pair (README, Benchmarks).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.engine.drafters import DrafterName
from specviz.engine.sampling import SamplingParams

Adaptive = Literal["fixed", "confidence", "acceptance", "predicted"]
CUT_MODES = ("confidence", "predicted")  # the modes that stop drafting at `confidence`


@dataclass(frozen=True)
class DecodeConfig:
    k: int = Field(12, ge=1, title="K", description="tokens drafted per round (the cap, for adaptive modes)",
                   json_schema_extra={"limit": "max_k"})
    max_new_tokens: int = Field(64, ge=1, title="max new tokens", description="tokens to generate at most",
                                json_schema_extra={"limit": "max_new_tokens"})
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    seed: int | None = Field(0, ge=0, le=2**32 - 1, title="seed",
                             description="same seed, same tokens; none (empty) = a fresh seed each run",
                             json_schema_extra={"must": "a whole number between 0 and 4294967295"})
    drafter: DrafterName = Field("model", title="drafter",
                             description="model: the draft model · lookup: copy from the context · hybrid: lookup, "
                                         "else the model · self: the target's own first layers (no draft model) · "
                                         "tree: the draft model's top candidates as a tree, verified in one forward")
    adaptive: Adaptive = Field("confidence", title="adaptive K",
                               description="fixed: always K · confidence: stop drafting when the draft is unsure · "
                                           "acceptance: grow K after a clean sweep, shrink it after a rejection · "
                                           "predicted: stop when a fitted model predicts the target will reject")
    confidence: float = Field(0.4, ge=0, le=1, title="confidence cut",
                              description="'confidence' mode: stop drafting when the draft's top probability "
                                          "drops below this; 'predicted' mode: when the predicted acceptance of "
                                          "the token just drafted does", json_schema_extra={"step": 0.05})
    top_n: int = Field(10, ge=1, le=50, title="candidates shown",
                       description="top candidates recorded per position for the drill-down")
    # last: the API's positional parameters follow the field order, and scripts written before it keep working
    exit_layer: int = Field(16, ge=1, title="exit layer",
                            description="'self' drafter: draft with the target's first L layers, then its final "
                                        "norm and head; fewer layers draft cheaper and are accepted less "
                                        "(the embedded target has 28; 16 measured fastest here, still slower "
                                        "than the target alone)",
                            json_schema_extra={"must": "a whole number of at least 1, below the target's layer count"})
    tree_budget: int = Field(15, ge=1, le=64, title="tree budget",
                             description="'tree' drafter: nodes per round, all verified in one target forward "
                                         "(K caps the tree's depth)")

    @property
    def room(self) -> int:
        """Tokens a run may add to its KV caches after the prompt: its new tokens and a round's K + 1 past them
        (both lanes size their static caches by it, so that both use the same compiled graphs)."""
        return self.max_new_tokens + self.k + 1

    @property
    def stop_below(self) -> float:
        """The draft's top-probability cut: `confidence` in "confidence" mode, 0 (off) otherwise."""
        return self.confidence if self.adaptive == "confidence" else 0.0

    @property
    def cut(self) -> float:
        """The cut of either mode that stops drafting early, 0 (off) in the others."""
        return self.confidence if self.adaptive in CUT_MODES else 0.0


def next_k(config: DecodeConfig, k: int, drafted: int, accepted: int) -> int:
    """K for the next round. "acceptance": grow by 2 after a clean sweep, shrink by 1 after a rejection."""
    if config.adaptive != "acceptance" or drafted == 0:
        return k
    return min(config.k, k + 2) if accepted == drafted else max(1, k - 1)
