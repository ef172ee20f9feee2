"""A draft from another model family: its tokens carried over into the target's vocabulary.

Speculative decoding compares token ids, so a draft with another tokenizer may propose only the tokens
both vocabularies share (the same string after each tokenizer's own decoding). Its warped distribution
is restricted to those tokens, renormalised, and carried over to the target's ids, zero elsewhere: that
is the q it samples from (`specviz.engine.drafters.MappedDrafter`), so the accept/reject rule runs
unchanged and the output is still exactly the target's distribution. Tokens only the target has still
appear, as corrections and bonuses drawn from p, never as drafts (one reason such a draft is accepted
less). The draft reads the committed text re-encoded by its own tokenizer (`translate`). The method:
transformers' universal assisted generation, arXiv 2502.05202.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specviz.models.pair import ModelLoadError

# below this share of the draft's vocabulary in common, a draft would hardly ever propose what the target says
MIN_SHARED = 0.25


def shared_tokens(draft: Sequence[str | None], target: Sequence[str | None]) -> list[tuple[int, int]]:
    """(draft id, target id) of every string that is exactly one token in each vocabulary. A string two ids
    of one tokenizer decode to (byte fragments that decode to the same replacement character) is left out:
    it would not say which of the two a drafted token is. None marks an id with no string (padding rows)."""
    in_draft, in_target = Counter(draft), Counter(target)
    draft_id = {s: i for i, s in enumerate(draft) if s and in_draft[s] == 1}
    return [(draft_id[s], t) for t, s in enumerate(target) if s in draft_id and in_target[s] == 1]


@dataclass(frozen=True, eq=False)
class VocabMap:
    """Which draft id is which target id, and how the draft reads the target's tokens."""

    draft_ids: torch.Tensor  # [S] the shared tokens' ids in the draft's vocabulary ...
    target_ids: torch.Tensor  # [S] ... and the same tokens' ids in the target's
    draft_of: torch.Tensor  # [target vocab] the draft id of each target id, -1 where the draft has none
    translate: Callable[[list[int], list[int]], list[int]]  # (target ids, the ids before them) -> the draft's ids
    shared: frozenset[int]  # the target ids the draft can propose, for host-side questions

    @classmethod
    def build(cls, draft: Sequence[str | None], target: Sequence[str | None],
              translate: Callable[[list[int], list[int]], list[int]], device=None) -> VocabMap:
        """From each vocabulary's strings by id (`draft[i]`: the string of draft id i)."""
        found = shared_tokens(draft, target)
        pairs = torch.tensor(found, dtype=torch.long, device=device).view(-1, 2)
        draft_of = torch.full((len(target),), -1, dtype=torch.long, device=device)
        draft_of[pairs[:, 1]] = pairs[:, 0]
        return cls(pairs[:, 0], pairs[:, 1], draft_of, translate, frozenset(t for _, t in found))

    @property
    def size(self) -> int:
        return self.draft_ids.shape[0]

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., draft vocab] -> [..., target vocab]: the shared tokens' scores at their target ids, -inf
        (probability zero after any warp) everywhere else, so q sums to one over the shared tokens."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.draft_of.shape[0]), float("-inf"))
        out[..., self.target_ids] = draft_logits[..., self.draft_ids]
        return out

    def draftable(self, target_id: int) -> bool:
        """Whether the draft can propose this target token at all."""
        return target_id in self.shared


def same_tokenizer(draft_tok, target_tok) -> bool:
    """Whether both mean the same thing by every id (a sample of ~2,000 ids is compared)."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    return len(dv) == len(tv) and all(tv.get(t) == dv[t] for t in list(dv)[:: max(1, len(dv) // 2000)])


def strings(tokenizer, rows: int) -> list[str | None]:
    """Each id's string after the tokenizer's own decoding, read after an anchor token: decoded alone, a
    SentencePiece token loses its leading space (▁the and the would look alike). None for embedding rows
    past the tokenizer."""
    n = min(rows, len(tokenizer))
    anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
    head = tokenizer.decode(anchor)
    texts = tokenizer.batch_decode([anchor + [i] for i in range(n)])
    return [t[len(head):] if t.startswith(head) else None for t in texts] + [None] * (rows - n)


def vocab_map(draft_tok, target_tok, draft_rows: int, target_rows: int, draft_name: str, target_name: str,
              device=None) -> VocabMap:
    """The draft's tokens in the target's vocabulary; refused when too few are shared to be worth drafting.
    The draft reads the committed text as its own tokenizer encodes the target's decoding of it, each new
    piece decoded after the tokens before it (so it starts as it does in context)."""
    def translate(ids: list[int], before: list[int]) -> list[int]:
        head, text = target_tok.decode(before), target_tok.decode(before + ids)
        piece = text[len(head):] if text.startswith(head) else target_tok.decode(ids)  # (a split character)
        return draft_tok.encode(piece, add_special_tokens=False)

    mapping = VocabMap.build(strings(draft_tok, draft_rows), strings(target_tok, target_rows), translate, device)
    if mapping.size < MIN_SHARED * draft_rows:
        raise ModelLoadError(f"draft {draft_name} and target {target_name} use different tokenizers that share "
                             f"only {mapping.size:,} of the draft's {draft_rows:,} tokens: too few for the draft to "
                             "propose what the target says; pick a draft from the target's family.")
    return mapping
