"""The draft's head over the most frequent part of the vocabulary (FR-Spec), and the ranking it is cut from.

The draft's head multiplies by one row per token of the vocabulary (151,936 for the embedded pair: a quarter of
the int4 draft's bytes), and most of those tokens are almost never drafted. `SubsetHead` multiplies only the N
most frequent ones and gives every other token a logit of -inf. Exactness is untouched: the drafter samples from
the q these logits make, a distribution over the N (exactly zero elsewhere), and the rule reads that same q; a
token the draft cannot say is still emitted when the target wants it, through the residual max(0, p - q) = p
there. What a cut costs is acceptance where the target's token lies outside the N, which the bench measures.

The ranking is shipped (`specviz/data/draft_vocab.json`, made by `scripts/rank_draft_vocab.py` from a corpus
chosen apart from the bench's prompts) for the embedded pair's tokenizer; it is checked against the tokenizer in use.
"""

from __future__ import annotations

import hashlib
import json
from importlib.resources import files
from pathlib import Path

import torch
from torch import nn

from specviz.models.draft.quantized import DraftQuant, quantize_linear

RANKING = Path(str(files("specviz.data") / "draft_vocab.json"))


def tokenizer_digest(tokenizer) -> str:
    """A digest of a tokenizer's vocabulary (its tokens and their ids): a ranking made for one fits only it."""
    vocab = tokenizer.get_vocab(with_added_tokens=True) if hasattr(tokenizer, "get_vocab_size") \
        else tokenizer.get_vocab()
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()


def ranked_ids(tokenizer, n: int, path: Path | None = None) -> torch.Tensor | None:
    """The n most frequent token ids for `tokenizer`, sorted; None where the shipped ranking was made for another
    tokenizer."""
    ranking = json.loads((path or RANKING).read_text())
    if ranking["tokenizer_sha256"] != tokenizer_digest(tokenizer):
        return None
    ranked = ranking["ranked"][:n]
    if len(ranked) < n:  # past the tokens the corpus showed: the others in id order (BPE merge order)
        listed = set(ranked)
        ranked += [t for t in range(ranking["vocab"]) if t not in listed][:n - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


class SubsetHead(nn.Module):
    """Logits over the whole vocabulary from a head over `ids` only: -inf for every other token."""

    def __init__(self, head: nn.Module, ids: torch.Tensor, vocab: int):
        super().__init__()
        self.head, self.vocab = head, vocab
        self.register_buffer("ids", ids, persistent=False)
        self.in_features, self.out_features = head.in_features, vocab

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = h.new_full((*h.shape[:-1], self.vocab), float("-inf"))
        return logits.index_copy_(-1, self.ids, self.head(h))


def subset_linear(head: nn.Module, ids: torch.Tensor) -> nn.Linear:
    """A linear of `head`'s rows for `ids` (copied: a tied head's rows are the embedding's, which stays whole)."""
    if hasattr(head, "rows"):  # (a head kept as its codes: `store.CodedLinear`)
        return head.rows(ids)
    weight = head.weight.detach()[ids].clone()
    linear = nn.Linear(weight.shape[1], len(ids), bias=head.bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if head.bias is not None:
        linear.bias = nn.Parameter(head.bias.detach()[ids].clone(), requires_grad=False)
    return linear


def quantize_head(head: nn.Module, spec: DraftQuant, vocab_ids: torch.Tensor | None = None) -> nn.Module:
    """The draft's head quantized, over the whole vocabulary or only over `vocab_ids`; the loaded head is not
    modified (a tied head is the embedding)."""
    if vocab_ids is None:
        return quantize_linear(head, spec.bits, spec.group_size, keep_dense=False)
    sub = quantize_linear(subset_linear(head, vocab_ids), spec.bits, spec.group_size, keep_dense=False)
    return SubsetHead(sub, vocab_ids, head.out_features)
