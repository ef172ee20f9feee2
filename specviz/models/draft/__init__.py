"""Draft speed-ups, in one place: weight-only int4/int8 linears (`quantized`), a lean one-token step
(`lean`), and the choice between them (`cheaper`). Exactness never depends on them: the drafter
samples from the q the cheaper draft computes, and the rule uses that q."""

from specviz.models.draft.cheaper import cheaper_draft, with_cheaper_draft
from specviz.models.draft.quantized import DraftQuant

__all__ = ["DraftQuant", "cheaper_draft", "with_cheaper_draft"]
