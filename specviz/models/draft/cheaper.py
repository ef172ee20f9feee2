"""The cheaper draft a pair decodes with: the lean int4 step where it applies, else a quantized
copy of the Hugging Face model, else the draft as loaded. The target is never touched."""

from __future__ import annotations

from dataclasses import replace

from specviz.models.draft.lean import lean_draft
from specviz.models.draft.quantized import DraftQuant, quantize_draft, supports
from specviz.models.draft.vocab import quantize_head


def cheaper_draft(pair, quant: DraftQuant, lean: bool = True, vocab_ids=None):
    """The cheaper draft for `pair` (its own draft stays as loaded, e.g. for transformers' generate), its head over
    `vocab_ids` only where given (`vocab.SubsetHead`). `lean=False` keeps the Hugging Face forward (what
    `generate(assistant_model=...)` needs)."""
    if pair.draft is None:
        return None
    model = lean_draft(pair.draft, quant, vocab_ids) if lean else None
    if model is not None:
        return model
    head = None if vocab_ids is None or not supports(next(pair.draft.parameters()).device, quant.bits) else \
        quantize_head(pair.draft.get_output_embeddings(), quant, vocab_ids)  # (the loaded draft keeps its own)
    return quantize_draft(pair.draft, quant, head)


def with_cheaper_draft(pair, quant: DraftQuant, lean: bool = True, vocab_ids=None):
    """The same pair with the cheaper draft, named so (where it applies: CPU; elsewhere `pair` itself)."""
    draft = cheaper_draft(pair, quant, lean, vocab_ids)
    if draft is None or draft is pair.draft:
        return pair
    head = "" if vocab_ids is None else f", head over {len(vocab_ids):,} tokens"
    return replace(pair, draft=draft, draft_name=f"{pair.draft_name} [int{quant.bits} draft step{head}]")
