"""The cheaper draft a pair decodes with: the lean int4 step where it applies, else a quantized
copy of the Hugging Face model, else the draft as loaded. The target is never touched."""

from __future__ import annotations

from dataclasses import replace

from specviz.models.leandraft import lean_draft
from specviz.models.quantize import DraftQuant, quantize_draft

# --draft-quant choices -> bits (16: leave the draft's linears as they are)
DRAFT_QUANT = {"int4": 4, "int8": 8, "none": 16}


def special_token_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set((getattr(tokenizer, "added_tokens_decoder", None) or {}).keys())
    return ids


def fast_draft(pair, spec: DraftQuant, lean: bool = True):
    """The cheaper draft for `pair` (its own draft stays as loaded, e.g. for transformers' generate)."""
    if pair.draft is None:
        return None
    if lean and spec.keep_vocab is None:
        model = lean_draft(pair.draft, spec)
        if model is not None:
            return model
    return quantize_draft(pair.draft, spec, special_token_ids(pair.tokenizer) | set(pair.eos_token_ids))


def fast_pair(pair, spec: DraftQuant, lean: bool = True):
    """The same pair with the cheaper draft, named so (where it applies: CPU; elsewhere `pair` itself)."""
    draft = fast_draft(pair, spec, lean)
    if draft is None or draft is pair.draft:
        return pair
    return replace(pair, draft=draft, draft_name=f"{pair.draft_name} [int{spec.bits} draft step]")
