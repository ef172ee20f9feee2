"""What ends a round's drafting before K: the adaptive modes' cuts, as stop rules a model drafter calls after
each drafted token but the last it may draft (each costs one host sync, so a run without a cut has none).

A cut can be applied in one of two ways, with the same drafts kept: as it drafts (a host read per drafted token;
no draft step past the cut), or once a round (`Cut.read_once`: every one of the K tokens drafted, then one host
read finds where the cut falls and the rest are dropped). Which pays depends on the device: on a CPU a host read
costs nothing and a draft step is real work; on a GPU each read stops the host from queueing the next steps.
Exactness is the same either way: the kept drafts and their q are what the draft sampled (the dropped ones only
take draws from the generator, and the draft's cache is cut back at the round's end as always).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.engine.acceptance import AcceptanceModel, feature_vector


def top_probs(logits: torch.Tensor) -> torch.Tensor:
    """The top probability of each row, max softmax = exp(max - logsumexp), without a softmax over V; on the device."""
    return (logits.max(-1).values - torch.logsumexp(logits, -1)).exp()


def top_prob(logits: torch.Tensor) -> float:
    """`top_probs` of one row, read to the host (a sync)."""
    return top_probs(logits).item()


# (draft logits [V], the q it sampled from or None when greedy, position in the round) -> stop drafting now?
StopRule = Callable[[torch.Tensor, "torch.Tensor | None", int], bool]


@dataclass(frozen=True)
class Cut:
    """A stop rule (called per drafted token) that can also be applied once to a whole round's drafts."""

    stop: StopRule
    after: Callable[[torch.Tensor, "torch.Tensor | None"], int]  # (logits [K, V], q [K, V] or None) -> drafts kept
    read_once: bool = False  # draft all K, then cut with one host read (else: a read per drafted token)

    def __call__(self, logits: torch.Tensor, q: torch.Tensor | None, position: int) -> bool:
        return self.stop(logits, q, position)


def first_stop(stops: list[bool]) -> int:
    """Drafts kept when drafting stops after the first position whose check says stop (the last is not checked)."""
    return next((i + 1 for i, s in enumerate(stops[:-1]) if s), len(stops))


def confidence_cut(cut: float, read_once: bool = False) -> Cut:
    """Stop once the draft's top probability (softmax of its logits) falls under `cut`."""
    def after(logits: torch.Tensor, q: torch.Tensor | None) -> int:
        return first_stop((top_probs(logits) < cut).tolist())  # one host read for the round
    return Cut(lambda logits, q, position: top_prob(logits) < cut, after, read_once)


def predicted_cut(model: AcceptanceModel, cut: float, drafter: str, top_n: int, read_once: bool = False) -> Cut:
    """Stop once the predicted acceptance of the token just drafted falls under `cut`. The features are read
    from the distribution a round's event shows (the softmax when greedy, q when sampling), so the prediction
    here is the one the event reports."""
    def tops(logits: torch.Tensor, q: torch.Tensor | None) -> list:
        shown = torch.softmax(logits, -1) if q is None else q
        return shown.topk(min(top_n, shown.shape[-1])).values.tolist()  # one host read

    def after(logits: torch.Tensor, q: torch.Tensor | None) -> int:
        return first_stop([model.predict(feature_vector(top, i, drafter)) < cut
                           for i, top in enumerate(tops(logits, q))])
    return Cut(lambda logits, q, position: model.predict(feature_vector(tops(logits, q), position, drafter)) < cut,
               after, read_once)
