"""Self-speculation: the target drafts for itself with its first L layers, its final norm and its head.

Early exit (LayerSkip; transformers' `assistant_early_exit`): after L of N decoder layers the hidden
state already leans towards the token the whole model will choose; read out with the model's own
norm and head, it is a draft that costs about L/N of a target step and no second model in memory.

`EarlyExit` calls the target's modules directly (embedding, layers 0..L-1, norm, head) with a KV
cache of its own for those L layers. It never changes the model: transformers instead lowers
`config.num_hidden_layers` for the draft and restores it, which mutates a model the verifier shares.
Exactness needs nothing new: the drafter samples from the warped softmax of these logits and reports
that as q, as for any model draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from specviz.compat import cache_keyword

# the attention kinds whose masks this module builds, as the model's own forward does (Qwen2, Llama)
MASKS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
MASK_CACHE = cache_keyword(create_causal_mask)  # the mask builders' name for the cache, in the installed transformers
PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def layer_types(model) -> list[str]:
    """Each decoder layer's attention kind (configs without `layer_types`, such as Llama's: all full)."""
    config = model.model.config
    return list(getattr(config, "layer_types", None) or ["full_attention"] * len(model.model.layers))


def early_exit_problem(model, exit_layer: int) -> str | None:
    """Why `model` cannot draft for itself from its first `exit_layer` layers, in one sentence; None if it can."""
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, part) for part in PARTS) or not hasattr(model, "lm_head"):
        return (f"the 'self' drafter needs a Llama/Qwen2-style target (embedding, decoder layers, final norm, "
                f"head); {type(model).__name__} is not one.")
    n = len(inner.layers)
    if not 1 <= exit_layer < n:
        return (f"the exit layer must be between 1 and {n - 1} for this target's {n} layers (got {exit_layer}): "
                f"drafting with all of them would be the target itself.")
    unknown = sorted(set(layer_types(model)[:exit_layer]) - set(MASKS))
    if unknown:
        return f"the 'self' drafter knows full and sliding-window attention layers, not {', '.join(unknown)}."
    return None


@dataclass(frozen=True)
class EarlyExit:
    """The target's first `layers` decoder layers, then its final norm and head. Callable as the drafter
    calls a causal LM: `view(ids, cache=cache, use_cache=True, logits_to_keep=1).logits` (or `past_key_values=`,
    the name before transformers 5.24). Frozen: equal views (the same target object, the same L) share a prompt
    cache entry."""

    target: torch.nn.Module
    layers: int
    cache_keyword = "cache"  # what the engine passes it (`compat.cache_keyword`)

    @property
    def config(self):
        return self.target.config

    def __call__(self, input_ids: torch.Tensor, cache=None, use_cache: bool = True, logits_to_keep: int = 1,
                 past_key_values=None) -> SimpleNamespace:
        inner, cache = self.target.model, cache if cache is not None else past_key_values
        h = inner.embed_tokens(input_ids)
        past = cache.get_seq_length()
        positions = torch.arange(past, past + input_ids.shape[1], device=h.device)[None]
        kinds = layer_types(self.target)[:self.layers]
        # the masks the model's own forward would build for these inputs; None where attention needs none
        masks = {kind: MASKS[kind](config=inner.config, inputs_embeds=h, attention_mask=None, position_ids=positions,
                                   **{MASK_CACHE: cache}) for kind in set(kinds)}
        rotary = inner.rotary_emb(h, positions)
        for layer, kind in zip(inner.layers[:self.layers], kinds):
            h = layer(h, attention_mask=masks[kind], position_embeddings=rotary, position_ids=positions,
                      **{cache_keyword(layer): cache}, use_cache=use_cache)
        return SimpleNamespace(logits=self.target.lm_head(inner.norm(h[:, -logits_to_keep:])))
