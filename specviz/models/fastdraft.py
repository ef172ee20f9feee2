"""The cheaper draft a pair decodes with: the lean int4 step where it applies, else a quantized
copy of the Hugging Face model, else the draft as loaded. The target is never touched."""

from __future__ import annotations

from dataclasses import replace

from specviz.models.leandraft import lean_draft
from specviz.models.quantize import DraftQuant, quantize_draft

# --draft-quant choices -> bits (16: leave the draft's linears as they are)
DRAFT_QUANT = {"int4": 4, "int8": 8, "none": 16}


def fast_draft(pair, spec: DraftQuant, lean: bool = True):
    """The cheaper draft for `pair` (its own draft stays as loaded, e.g. for transformers' generate).
    `lean=False` keeps the Hugging Face forward (what `generate(assistant_model=...)` needs)."""
    if pair.draft is None:
        return None
    model = lean_draft(pair.draft, spec) if lean else None
    return model if model is not None else quantize_draft(pair.draft, spec)


def fast_pair(pair, spec: DraftQuant, lean: bool = True):
    """The same pair with the cheaper draft, named so (where it applies: CPU; elsewhere `pair` itself)."""
    draft = fast_draft(pair, spec, lean)
    if draft is None or draft is pair.draft:
        return pair
    return replace(pair, draft=draft, draft_name=f"{pair.draft_name} [int{spec.bits} draft step]")
