"""Small helpers the decoders share: clocks, the per-round host transfer, sync-free indexing, KV rollback."""

from __future__ import annotations

import contextlib
import copy
import time

import torch
from transformers import DynamicCache

from specviz.compat import forward


def clock(device: torch.device) -> float:
    """A timestamp taken after the device has finished its queued work, so intervals are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Phases:
    """A round's phase boundaries, read once the round is over. On a CPU, host clock readings. On a GPU, events
    recorded in the device's stream: reading a clock there needs a synchronize, and each one stops the host from
    queueing the next phase's kernels while the device still runs this one's (an H200's profile of a round at
    K = 4 showed the device idle 45 % of the round, four synchronizes a round among the causes)."""

    def __init__(self, device: torch.device):
        self.device, self.marks = device, []

    def mark(self) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """The time between consecutive marks (on a GPU, once the device has reached the last: by then it is idle,
        the round's host transfer having waited for its work)."""
        if self.device.type != "cuda":
            return [b - a for a, b in zip(self.marks, self.marks[1:])]
        self.marks[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]


def to_host(**tensors: torch.Tensor) -> dict[str, float | list]:
    """Move many small tensors to the host in ONE transfer (one sync per round, not one per value),
    as Python numbers and (nested) lists: reading them later costs no tensor op at all.

    float32 carries token ids exactly (vocabularies are far below 2**24) and is supported everywhere.
    """
    names = list(tensors)
    flat = torch.cat([tensors[n].reshape(-1).to(torch.float32) for n in names]).cpu()
    parts = flat.split([tensors[n].numel() for n in names])
    return {n: part.view(tensors[n].shape).tolist() for n, part in zip(names, parts)}


def at(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """x[i] for a 0-d index tensor i, staying on the device: x[i] itself would call i.item(), a host sync."""
    return x.index_select(0, i.view(1))[0]


def rollback(cache, keep: int) -> None:
    """Crop a KV cache to its first `keep` tokens (transformers 5: crop(-n) removes n)."""
    excess = cache.get_seq_length() - keep
    if excess > 0:
        cache.crop(-excess)


def prefill(model, cache, ids: torch.Tensor) -> None:
    """Read the prompt into `cache`, all but its last token: that token's forward yields the first new token
    (the AR step's, or the first round's verify), so prefill is timed apart at no extra cost. Within the model's
    `reading_prompt` where it has one (a tuned model's prompt kernels: rows never compared with a one-token step,
    read alike in both lanes since both read a prompt here)."""
    if ids.shape[1] > 1:
        with getattr(model, "reading_prompt", None) or contextlib.nullcontext():
            forward(model, ids[:, :-1], cache, 1)


def new_cache(model, static: bool = True, tokens: int = 0):
    """A fresh KV cache for `model`. A model with a compiled one-token step (`models.compiled`) hands out the
    static caches its step was compiled for, sized up front for `tokens` (so a run never changes size, or meets
    a graph, midway); any other model, and any caller that needs a dynamic one (`static=False`: a batch), gets a
    DynamicCache. Both are read and cut the same way: `get_seq_length`, `crop(-n)`."""
    make = getattr(model, "new_cache", None) if static else None
    return make(tokens) if make is not None else DynamicCache()


class PromptCache:
    """Prompts read once per model, handed out as copies: many runs of one prompt (the proof, the
    same-distribution experiment) then pay its prefill once, and each run still crops its own cache."""

    def __init__(self):
        self.saved: dict[tuple, DynamicCache] = {}

    def copy(self, model, ids: torch.Tensor, static: bool = True, room: int = 0):
        # keyed by the model itself, not its id: an id is reused once its object is gone, and equal views
        # of one model (the self drafter's early exit at one depth) must share an entry
        key = (model, tuple(ids[0].tolist()), static, room)
        if key not in self.saved:
            self.saved[key] = prefilled(model, ids, static=static, room=room)
        return copy.deepcopy(self.saved[key])


def prefilled(model, ids: torch.Tensor, prompt_cache: PromptCache | None = None, *, static: bool = True,
              room: int = 0):
    """A cache holding the prompt (see `prefill`): read now, or copied from `prompt_cache`; `static`: see
    `new_cache`; `room`: the tokens the run may add after the prompt (a static cache is sized for them)."""
    if prompt_cache is not None:
        return prompt_cache.copy(model, ids, static, room)
    cache = new_cache(model, static, ids.shape[1] + room)
    prefill(model, cache, ids)
    return cache


def pad_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Models of one family may pad their vocabularies differently; missing ids get probability 0."""
    missing = vocab_size - logits.shape[-1]
    if missing <= 0:
        return logits
    return torch.nn.functional.pad(logits, (0, missing), value=float("-inf"))


def model_dtype(model) -> torch.dtype:
    """The dtype a model computes in (an attention mask must be in it): a Hugging Face model says; a plain
    module's first floating-point parameter tells."""
    dtype = getattr(model, "dtype", None)
    return dtype if dtype is not None else next(p.dtype for p in model.parameters() if p.is_floating_point())


def fit_ids(ids: torch.Tensor, rows: int) -> torch.Tensor:
    """Feed ids past a model's embedding table (the other model's larger, padded vocabulary) as 0.

    Exactness is unaffected: for the target such an id is a drafted token with p = 0, so it is
    rejected and the logits after it are never used; for the draft it only blurs its context, and
    q stays the distribution it really sampled from.
    """
    return ids.masked_fill(ids >= rows, 0)


class Pieces:
    """Token id -> text, memoised per run: decoding the same ids every round is pure overhead."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.memo: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.memo:
            self.memo[token_id] = self.tokenizer.decode([token_id])
        return self.memo[token_id]

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
