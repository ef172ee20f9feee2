"""What every layer reads of a loaded model the same way, whichever transformers release loaded it: the keyword a
forward takes its KV cache by, and the vocabulary's size. Below the engine and the models alike (both call models;
neither may import the other), so each is written once."""

from __future__ import annotations

import dataclasses
import inspect

import torch


def cache_keyword(model) -> str:
    """The keyword `model` takes its KV cache by. transformers 5.24 renamed it (`past_key_values` -> `cache`): there
    the old name warns on every call, and 5.40 removes it; 5.17 to 5.23 know only `past_key_values`, and an unknown
    `cache=` would land in their **kwargs unread (a forward without its cache, silently). So the model's forward
    says: read from its signature once and kept on the model (a wrapper of ours declares it)."""
    keyword = getattr(model, "cache_keyword", None)
    if keyword is None:
        keyword = named_cache(inspect.signature(getattr(model, "forward", model)).parameters)
        if isinstance(model, torch.nn.Module):
            model.cache_keyword = keyword
    return keyword


def named_cache(parameters) -> str:
    """The cache's name among a forward's parameters. One that names neither (`*args, **kwargs`: a wrapper) passes
    it on to a model of the installed transformers: the name that release gives it (its outputs' field)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    return "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def forward(model, ids: torch.Tensor, cache, keep: int, **inputs: torch.Tensor):
    """`model` over `ids` on `cache` (None: none), keeping `keep` rows of logits, the cache passed by the name the
    model takes: every model call specviz makes (the engine's rounds, the models' probes and timings). `inputs`: a
    tree's attention mask and positions."""
    return model(ids, **{cache_keyword(model): cache}, use_cache=cache is not None, logits_to_keep=keep, **inputs)


def model_vocab(model) -> int:
    return model.config.get_text_config().vocab_size
