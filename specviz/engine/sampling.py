"""One sampling path for every decoder: logits -> warped probabilities -> a token.

The speculative rule is exact only if q is the distribution the draft *really* sampled from and
p is the target's under the same warps, so the draft, the verifier and the AR baseline all call
these two functions and nothing else.
"""

from __future__ import annotations

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """The warps. Each field is also a user-facing setting: its label, help and range are declared here."""

    temperature: float = Field(0.0, ge=0, le=2, title="temperature", description="softmax temperature; 0 = greedy",
                               json_schema_extra={"step": 0.05, "min_nonzero": 1e-3,  # below, logits / T overflow
                                                  "must": "0 (greedy) or between 0.001 and 2"})
    top_k: int = Field(0, ge=0, title="top-k", description="keep the k most likely tokens; 0 = off",
                       json_schema_extra={"must": "0 (off) or positive"})
    top_p: float = Field(1.0, gt=0, le=1, title="top-p", description="keep the smallest set with this much mass; 1 = off",
                         json_schema_extra={"step": 0.01, "must": "in (0, 1]"})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Warp logits [..., V] into a distribution, in float32.

    Greedy is a point mass on the argmax; the accept/reject rule then reduces to
    "accept iff the draft's token is the target's argmax, else correct to that argmax".
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # never the first: top_p > 0
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of probs [..., V]; stays on the device (no host sync)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def draw(logits: torch.Tensor, probs: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token from `probs` (the warp of `logits` [V]). Greedy: a draw from the point mass is its argmax,
    taken directly: torch.multinomial over a 152k vocabulary costs ~3 ms per call on a CPU."""
    return logits.argmax() if greedy else sample(probs, generator)


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen
