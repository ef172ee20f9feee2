"""What ends a round's drafting before K: the adaptive modes' cuts, as stop rules a model drafter calls after
each drafted token but the last it may draft (each costs one host sync, so a run without a cut has none)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specviz.engine.acceptance import AcceptanceModel, feature_vector


def top_prob(logits: torch.Tensor) -> float:
    """The top probability, max softmax = exp(max - logsumexp), without a [V] softmax: a host sync."""
    return (logits.max() - torch.logsumexp(logits, -1)).exp().item()


# (draft logits [V], the q it sampled from or None when greedy, position in the round) -> stop drafting now?
StopRule = Callable[[torch.Tensor, "torch.Tensor | None", int], bool]


def confidence_cut(cut: float) -> StopRule:
    """Stop once the draft's top probability (softmax of its logits) falls under `cut`."""
    return lambda logits, q, position: top_prob(logits) < cut


def predicted_cut(model: AcceptanceModel, cut: float, drafter: str, top_n: int) -> StopRule:
    """Stop once the predicted acceptance of the token just drafted falls under `cut`. The features are read
    from the distribution a round's event shows (the softmax when greedy, q when sampling), so the prediction
    here is the one the event reports."""
    def stop(logits: torch.Tensor, q: torch.Tensor | None, position: int) -> bool:
        shown = torch.softmax(logits, -1) if q is None else q
        top = shown.topk(min(top_n, shown.shape[-1])).values.tolist()  # one host sync per drafted token
        return model.predict(feature_vector(top, position, drafter)) < cut
    return stop
