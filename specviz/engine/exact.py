"""The target's exact next-token distributions: the reference a sampler is checked against.

Plain target forwards (no cache, no drafts) warped by the same `logits_to_probs` every decoder uses,
so "exact" means exactly what plain decoding of the target samples each token from.
"""

from __future__ import annotations

import torch

from specviz.compat import forward
from specviz.engine.plumbing import PromptCache, pad_vocab
from specviz.engine.sampling import SamplingParams, logits_to_probs


@torch.inference_mode()
def path_distributions(pair, prompt_ids: list[int], paths: list[list[int]], sampling: SamplingParams,
                       prompt_cache: PromptCache | None = None) -> torch.Tensor:
    """The target's warped distribution before each token of each path, on the device: [B, L, V], row t of
    path b = p(. | prompt, path_b[:t]). One plain batched forward with no drafts: the reference a sampled
    path is scored against. With `prompt_cache` the prompt is read once for every batch (a long prompt
    would otherwise be read again for each path); without it the forward uses no cache at all. Shorter
    paths are right-padded: attention is causal, so padding after a position never changes it (rows past
    a path's end are meaningless)."""
    longest = max(map(len, paths))
    tails = [(x + [0] * longest)[:longest - 1] for x in paths]
    if prompt_cache is None:
        ids = torch.tensor([prompt_ids + t for t in tails], dtype=torch.long, device=pair.device)
        cache = None
    else:  # the cache holds all but the prompt's last token (see `prefill`)
        # a dynamic cache: it is repeated along the batch, which a compiled step's static one is not
        cache = prompt_cache.copy(pair.target, torch.tensor([prompt_ids], device=pair.device), static=False)
        cache.batch_repeat_interleave(len(paths))
        ids = torch.tensor([prompt_ids[cache.get_seq_length():] + t for t in tails], dtype=torch.long,
                           device=pair.device)
    logits = forward(pair.target, ids, cache, longest).logits[:, -longest:].float()
    return logits_to_probs(pad_vocab(logits, pair.vocab_size), sampling)


def randomized_pit(probs: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """P(X ranks before x) + u * p(x), tokens ranked by probability (ties by id), u [N] uniform: for x drawn
    from `probs` [N, V] the result is exactly Uniform(0, 1) (the randomised probability integral transform),
    and a path's values are independent (Rosenblatt), so any sampler error shows up as non-uniform values.
    Ranking by probability makes a sampler that favours likely (or unlikely) tokens push them down (or up)."""
    px = probs.gather(-1, tokens[:, None])
    ids = torch.arange(probs.shape[-1], device=probs.device)
    before = (probs > px) | ((probs == px) & (ids < tokens[:, None]))
    return (probs * before).sum(-1) + u * px.squeeze(-1)
