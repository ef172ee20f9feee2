"""The target's exact next-token distribution: the reference a sampler is checked against.

One target forward over the prompt, warped by the same `logits_to_probs` every decoder uses, so
"exact" means exactly what plain decoding of the target samples its first token from.
"""

from __future__ import annotations

import numpy as np
import torch

from specviz.engine.plumbing import pad_vocab
from specviz.engine.sampling import SamplingParams, logits_to_probs


@torch.inference_mode()
def next_token_distribution(pair, prompt_ids: list[int], sampling: SamplingParams) -> np.ndarray:
    """p(x | prompt) over the pair's vocabulary, as float64 on the host (sums to 1)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=pair.device)
    logits = pair.target(ids, logits_to_keep=1).logits[0, -1].float()
    p = logits_to_probs(pad_vocab(logits, pair.vocab_size), sampling)
    p = p.double().cpu().numpy()
    return p / p.sum()
