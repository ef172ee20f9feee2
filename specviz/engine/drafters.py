"""Drafters propose K tokens and the exact distribution q each was sampled from.

Any drafter works with the rule as long as q is truthful: a small model's warped softmax (the
target's own first layers are such a model: `early_exit.py`), or a point mass for a deterministic
guess such as prompt lookup (then a drafted x is accepted with probability p(x), and the correction
is p with x removed, renormalised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch

from specviz.engine.cuts import StopRule
from specviz.engine.early_exit import EarlyExit, early_exit_problem
from specviz.compat import forward, model_vocab
from specviz.engine.plumbing import PromptCache, fit_ids, new_cache, pad_vocab, prefilled, rollback
from specviz.engine.sampling import SamplingParams, draw, logits_to_probs


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] on the device
    q: torch.Tensor  # [k, V]: the distribution each token was sampled from
    logits: torch.Tensor  # [k, V]: raw scores, for display (softmax at temperature 1)

    @property
    def k(self) -> int:
        return self.tokens.shape[0]


class Drafter(Protocol):
    name: str

    def prefill(self, ids: torch.Tensor, room: int = 0) -> None: ...  # room: tokens the run may add

    def propose(self, ids: torch.Tensor, history: list[int], k: int) -> Draft: ...

    def rollback(self, keep: int) -> None: ...


def point_mass_draft(tokens: list[int] | torch.Tensor, vocab_size: int, device) -> Draft:
    t = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens, dtype=torch.long, device=device)
    q = torch.zeros(len(tokens), vocab_size, device=device).scatter_(1, t[:, None], 1.0)
    return Draft(t, q, torch.log(q))


class ModelDrafter:
    """A small causal LM with its own KV cache.

    The cache holds every committed token the draft has seen; `propose` first feeds, in one
    forward, whatever it is missing (the last correction/bonus, or more after a lookup round).
    `stop`: ends a round's drafting early (the adaptive modes' cut; it costs one host sync per
    drafted token but a round's last, so there is none unless asked for).
    """

    name = "model"
    static = True  # may use the model's static cache (a compiled step); a drafter that reorders its cache may not

    def __init__(self, model, sampling: SamplingParams, generator, vocab_size: int, stop: StopRule | None = None,
                 prompt_cache: PromptCache | None = None):
        self.model, self.sampling, self.generator = model, sampling, generator
        self.vocab_size, self.stop, self.prompt_cache = vocab_size, stop, prompt_cache
        self.rows = model_vocab(model)  # < vocab_size when the target's vocabulary is larger
        self.cache = new_cache(model, self.static)

    def fit(self, ids: torch.Tensor) -> torch.Tensor:
        return fit_ids(ids, self.rows) if self.rows < self.vocab_size else ids

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, room: int = 0) -> None:
        self.cache = None  # its buffers back to the pool first: a run holds one set per model, the set warmed
        self.cache = prefilled(self.model, self.fit(ids), self.prompt_cache, static=self.static, room=room)

    # three seams where a draft with another vocabulary (`MappedDrafter`) differs: what it reads of the
    # committed tokens, how its scores become the target's, and how it reads back a token it drafted
    def context(self, ids: torch.Tensor) -> torch.Tensor:
        """The committed tokens the cache has not seen yet."""
        return self.fit(ids[:, self.cache.get_seq_length():])

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        return pad_vocab(logits, self.vocab_size)

    def read_back(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(1, 1)

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, history: list[int], k: int) -> Draft:
        tokens, qs, all_logits = [], [], []
        greedy = self.sampling.greedy
        feed = self.context(ids)
        once = getattr(self.stop, "read_once", False)  # the cut applied after all K drafts (see `cuts`)
        for i in range(k):
            out = forward(self.model, feed, self.cache, 1)
            logits = self.scores(out.logits[0, -1].float())
            q = None if greedy else logits_to_probs(logits, self.sampling)  # greedy: built once, below
            x = draw(logits, q, greedy, self.generator)
            qs.append(q)
            tokens.append(x), all_logits.append(logits)
            feed = self.read_back(x)
            if self.stop is not None and not once and i < k - 1 and self.stop(logits, q, i):  # (not the last)
                break
        if not tokens:
            empty = torch.empty(0, self.vocab_size, device=ids.device)
            return Draft(torch.empty(0, dtype=torch.long, device=ids.device), empty, empty)
        drafted, logits = torch.stack(tokens), torch.stack(all_logits)
        # greedy: the one warp, applied once to the whole draft (its argmax per row is what draw() took)
        q = logits_to_probs(logits, self.sampling) if greedy else torch.stack(qs)
        if once and self.stop is not None and k > 1:
            n = self.stop.after(logits, None if greedy else q)
            drafted, q, logits = drafted[:n], q[:n], logits[:n]
        return Draft(drafted, q, logits)

    def rollback(self, keep: int) -> None:
        rollback(self.cache, keep)


class VocabMapping(Protocol):
    """The draft's tokens in the target's vocabulary, for a draft of another family (built at load time:
    `specviz.models.families.VocabMap`)."""

    draft_of: torch.Tensor  # [target vocab]: each target id's draft id, -1 where the draft has none

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor: ...  # -inf where the draft has none

    def translate(self, ids: list[int], before: list[int]) -> list[int]: ...  # draft ids for ids' text after before

    def draftable(self, target_id: int) -> bool: ...


class MappedDrafter(ModelDrafter):
    """A draft model with a vocabulary of its own (another family): see `specviz.models.families`.

    Its cache holds its own tokens, so the positions differ from the target's. Drafted tokens are shared
    ones, one draft id each, so the accepted drafts are cut back one for one.
    """

    CONTEXT = 4  # target tokens decoded before the new ones, so their text starts as it does in context

    def __init__(self, model, vocab_map: VocabMapping, sampling: SamplingParams, generator, vocab_size: int,
                 stop: StopRule | None = None, prompt_cache: PromptCache | None = None):
        super().__init__(model, sampling, generator, vocab_size, stop, prompt_cache)
        self.vocab_map = vocab_map
        # mapped: the committed text in draft ids (the cache holds a prefix of it, plus `kept`); covered: the
        # target tokens mapped and kept stand for; kept: last round's accepted drafts, still on the device;
        # drafted: this round's drafts, read back into the cache
        self.mapped, self.covered, self.kept, self.drafted = [], 0, [], []

    def read_committed(self, ids: torch.Tensor) -> None:
        """Bring `mapped` up to date, with ONE host transfer: the accepted drafts kept last round (already in
        the cache, as the draft ids they were drafted as) and the draft's ids for the target tokens after them
        (the correction or bonus, or a lookup round's tokens), each piece decoded after the tokens before it."""
        start = max(0, self.covered - self.CONTEXT)
        row = ids[0, start:]
        host = torch.cat([row, torch.stack(self.kept)]).tolist() if self.kept else row.tolist()
        window, kept = host[:len(row)], host[len(row):]
        self.mapped += kept
        before, new = window[:self.covered - start], window[self.covered - start:]
        self.mapped += self.vocab_map.translate(new, before) if new else []
        self.covered, self.kept = ids.shape[1], []

    def tensor(self, draft_ids: list[int], device) -> torch.Tensor:
        return torch.tensor([draft_ids], dtype=torch.long, device=device)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, room: int = 0) -> None:
        self.mapped, self.covered, self.kept, self.drafted = [], 0, [], []
        self.read_committed(ids)
        self.cache = None
        # (the draft's tokenization may be longer than the target's: room for twice the target's tokens)
        self.cache = prefilled(self.model, self.tensor(self.mapped, ids.device), self.prompt_cache,
                               static=self.static, room=2 * room)

    def context(self, ids: torch.Tensor) -> torch.Tensor:
        self.read_committed(ids)
        self.drafted = []
        if self.cache.get_seq_length() >= len(self.mapped):  # new tokens with no text of their own: read the
            rollback(self.cache, len(self.mapped) - 1)  # last token again, for logits to draft from
        return self.tensor(self.mapped[self.cache.get_seq_length():], ids.device)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        return self.vocab_map.target_logits(logits)

    def read_back(self, x: torch.Tensor) -> torch.Tensor:
        d = self.vocab_map.draft_of[x]  # stays on the device: no sync per drafted token
        self.drafted.append(d)
        return d.view(1, 1)

    def rollback(self, keep: int) -> None:
        # the accepted drafts stay in the cache (on the device until this drafter next reads, see
        # `read_committed`: a lookup round in between adds none); the cache is cut back to them
        take = self.drafted[:max(0, keep - self.covered)]
        self.kept += take
        self.covered += len(take)
        self.drafted = []
        rollback(self.cache, len(self.mapped) + len(self.kept))


class SelfDrafter(ModelDrafter):
    """Self-speculation: the target's first `exit_layer` layers draft for it, with their own KV cache."""

    name = "self"

    def __init__(self, target, exit_layer: int, sampling: SamplingParams, generator, vocab_size: int,
                 stop: StopRule | None = None, prompt_cache: PromptCache | None = None):
        super().__init__(EarlyExit(target, exit_layer), sampling, generator, vocab_size, stop, prompt_cache)


LOOKUP_MAX_NGRAM = 3  # the longest suffix matched against the context


def lookup_continuation(history: list[int], k: int, max_ngram: int = LOOKUP_MAX_NGRAM) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `history` (n <=
    max_ngram) seen before; [] when none recurs. Pure: the drafter and the Atlas's offline replay share it."""
    for n in range(min(max_ngram, len(history) - 1), 0, -1):
        pattern = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start:start + n] == pattern:
                return history[start + n:start + n + k]
    return []


class PromptLookupDrafter:
    """Model-free: find the latest earlier occurrence of the last n tokens, propose what followed.

    Strong on code edits, JSON and rewrites that copy from the prompt; free to run.
    """

    name = "lookup"

    def __init__(self, vocab_size: int, device, max_ngram: int = LOOKUP_MAX_NGRAM):
        self.vocab_size, self.device, self.max_ngram = vocab_size, device, max_ngram

    def continuation(self, history: list[int], k: int) -> list[int]:
        return lookup_continuation(history, k, self.max_ngram)

    def prefill(self, ids: torch.Tensor, room: int = 0) -> None:
        pass  # no model, no cache

    def propose(self, ids: torch.Tensor, history: list[int], k: int) -> Draft:
        return point_mass_draft(self.continuation(history, k), self.vocab_size, self.device)

    def rollback(self, keep: int) -> None:
        pass


class HybridDrafter:
    """Prompt lookup when the context offers a continuation, the draft model otherwise."""

    name = "hybrid"

    def __init__(self, lookup: PromptLookupDrafter, model: ModelDrafter):
        self.lookup, self.model = lookup, model

    def prefill(self, ids: torch.Tensor, room: int = 0) -> None:
        self.model.prefill(ids, room)

    def propose(self, ids: torch.Tensor, history: list[int], k: int) -> Draft:
        draft = self.lookup.propose(ids, history, k)
        return draft if draft.k > 0 or k == 0 else self.model.propose(ids, history, k)

    def rollback(self, keep: int) -> None:
        self.model.rollback(keep)


DrafterName = Literal["model", "lookup", "hybrid", "self", "tree"]
DRAFTERS = get_args(DrafterName)
NEEDS_DRAFT_MODEL = ("model", "hybrid", "tree")


def drafter_problem(name: str, draft_model, target, exit_layer: int, vocab_map=None) -> str | None:
    """Why drafter `name` cannot run on this pair, in one sentence; None when it can. A run checks this
    before any model runs (the message is the user's); `make_drafter` raises it."""
    if name not in DRAFTERS:
        return f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}."
    if name in NEEDS_DRAFT_MODEL and draft_model is None:
        return f"this pair has no draft model, which the {name!r} drafter needs: use the 'lookup' or 'self' drafter."
    if name == "tree" and vocab_map is not None:
        return "the 'tree' drafter needs a draft model with the target's tokenizer; use the 'model' drafter here."
    return early_exit_problem(target, exit_layer) if name == "self" else None


class DrafterChoice(Protocol):
    """What `make_drafter` reads of a run's settings: a `DecodeConfig` (which imports this module for the names)."""

    drafter: str
    sampling: SamplingParams
    exit_layer: int


def make_drafter(config: DrafterChoice, pair, generator, stop: StopRule | None = None,
                 prompt_cache: PromptCache | None = None) -> Drafter:
    """The drafter `config` names (`drafter`, its sampling, the 'self' drafter's `exit_layer`) on `pair`: its draft
    model (with `vocab_map`, the draft's tokens in the target's vocabulary, when it has another tokenizer), or the
    target itself for 'self'. `stop`: a model drafter's cut (see `cuts`)."""
    name, sampling, vocab, device = config.drafter, config.sampling, pair.vocab_size, pair.device
    if problem := drafter_problem(name, pair.draft, pair.target, config.exit_layer, pair.vocab_map):
        raise ValueError(problem)
    if name == "tree":
        raise ValueError("the 'tree' drafter has a round loop of its own: `specviz.engine.tree_round`.")
    if name == "lookup":
        return PromptLookupDrafter(vocab, device)
    if name == "self":
        return SelfDrafter(pair.target, config.exit_layer, sampling, generator, vocab, stop, prompt_cache)
    if pair.vocab_map is None:
        model = ModelDrafter(pair.draft, sampling, generator, vocab, stop, prompt_cache)
    else:
        model = MappedDrafter(pair.draft, pair.vocab_map, sampling, generator, vocab, stop, prompt_cache)
    return model if name == "model" else HybridDrafter(PromptLookupDrafter(vocab, device), model)
