"""The token ids a cut draft head keeps for a loaded pair (`PairSpec.draft_vocab`, `draft/vocab.py`): the shipped
ranking, checked against the pair's tokenizer, or one sentence saying why it cannot serve."""

from __future__ import annotations

from pathlib import Path

import torch

from specviz.models.draft.vocab import ranked_ids
from specviz.models.pair import ModelLoadError, ModelPair


def draft_vocab_ids(pair: ModelPair, n: int, ranking: Path | None = None) -> torch.Tensor | None:
    """The token ids a draft head over n tokens keeps for `pair` (None: n = 0, the whole vocabulary); one sentence
    where the shipped ranking does not fit the pair's tokenizer."""
    if not n:
        return None
    ids = ranked_ids(pair.tokenizer, n, ranking) if pair.vocab_map is None else None
    if ids is None:
        raise ModelLoadError(f"--draft-vocab {n}: the shipped token ranking was made for the embedded pair's "
                             f"tokenizer, not {pair.draft_name}'s (scripts/rank_draft_vocab.py --tokenizer makes "
                             "one); use --draft-vocab 0 for the whole vocabulary.")
    return ids
