"""transformers' generate(), the baselines a user would otherwise pick: the target alone, assisted
generation with a draft model, and prompt lookup.

`generate(assistant_model=draft)` keeps its drafting settings on the assistant's generation
config, and some of them persist across calls (the "heuristic" schedule writes K back; the
confidence threshold can adapt). So every call restores the assistant's settings first, then
applies the setting asked for: a constant K (with specviz's confidence cut, or none), or HF's defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from specviz.engine import SamplingParams
from specviz.engine.drafters import LOOKUP_MAX_NGRAM

ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
# transformers' assisted generation calls the assistant's generate() with a generation_config and arguments beside
# it, which generate() itself warns is deprecated (5.24, once a process): transformers' own call, none of ours
GENERATE_LOGGER = "transformers.generation.utils"


# the start of that one warning: every other record of that logger still shows
GENERATE_DEPRECATION = "Passing `generation_config` together with generation-related arguments"


@contextmanager
def without_message(name: str, start: str) -> Iterator[None]:
    """The logger `name` drops the records whose message starts with `start` while the block runs (a filter, removed
    after): its level and every other record stay as they are."""
    logger = logging.getLogger(name)

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(start)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


@dataclass(frozen=True)
class HFSetting:
    name: str  # "k=4", "k=4 c=0.4", "k=4 heuristic" or "default"
    k: int | None  # None: HF's defaults (20 tokens, constant schedule, confidence threshold 0.4)
    confidence: float = 0.0  # stop drafting below this draft probability (HF's assistant_confidence_threshold)
    schedule: str = "constant"  # "heuristic": +2 after a clean sweep, -1 after a rejection (specviz's "acceptance")

    @staticmethod
    def fixed(k: int, confidence: float = 0.0, schedule: str = "constant") -> HFSetting:
        """K drafts per round: exactly, at most K with a confidence cut, or K adapted by HF's heuristic schedule."""
        name = f"k={k}" + (f" c={confidence:g}" if confidence else "") + (f" {schedule}" if schedule != "constant" else "")
        return HFSetting(name, k, confidence, schedule)


HF_DEFAULT = HFSetting("default", None)


def sampling_kwargs(sampling: SamplingParams) -> dict:
    """generate()'s arguments for the warps specviz decodes with: greedy, or sampled at the same temperature,
    top-k and top-p (None leaves a warp off, and keeps the model's generation_config from adding one)."""
    if sampling.greedy:
        return dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    return dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                top_p=sampling.top_p if sampling.top_p < 1.0 else None)


class HFGenerate:
    """`target.generate(...)` with specviz's warps and seed: alone, with an assistant model, or with prompt lookup."""

    def __init__(self, target, eos_token_ids, pad_token_id: int | None, device,
                 sampling: SamplingParams = SamplingParams(), seed: int | None = 0):
        self.target, self.device = target, device
        self.sampling, self.seed = sampling, seed
        self.eos = sorted(eos_token_ids)
        self.pad = pad_token_id if pad_token_id is not None else self.eos[0]
        self.originals: dict[int, dict] = {}  # each assistant's own drafting settings, as first seen

    def _apply(self, assistant, setting: HFSetting) -> None:
        config = assistant.generation_config
        original = self.originals.setdefault(id(assistant), {f: getattr(config, f, None) for f in ASSISTANT_FIELDS})
        for f, v in original.items():
            setattr(config, f, v)
        if setting.k is not None:
            config.num_assistant_tokens = setting.k
            config.num_assistant_tokens_schedule = setting.schedule
            config.assistant_confidence_threshold = setting.confidence  # 0: no early stop

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, setting: HFSetting | None = None,
                 assistant=None, lookup: bool = False, static: bool = False) -> list[int]:
        """The new token ids. No setting: the target alone (`static`: on transformers' static cache, which its
        generate() compiles on a GPU). With a setting: assisted by `assistant`, or by prompt lookup (`lookup`,
        K = the setting's). An assistant's settings are restored afterwards."""
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        extra = {"cache_implementation": "static"} if static else {}
        if setting is not None and lookup:
            # no HF default for K: 10 is its documented example; the n-gram as long as specviz's lookup matches
            extra.update(prompt_lookup_num_tokens=setting.k or 10, max_matching_ngram_size=LOOKUP_MAX_NGRAM)
        elif setting is not None:
            self._apply(assistant, setting)
            extra["assistant_model"] = assistant
        if self.seed is not None and not self.sampling.greedy:
            torch.manual_seed(self.seed)  # generate() samples from the global generator
        assisted = "assistant_model" in extra
        try:
            with without_message(GENERATE_LOGGER, GENERATE_DEPRECATION) if assisted else nullcontext():
                out = self.target.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, eos_token_id=self.eos,
                    pad_token_id=self.pad, repetition_penalty=None, **sampling_kwargs(self.sampling), **extra)
        finally:
            if assisted:
                self._apply(assistant, HF_DEFAULT)
        return out[0, len(prompt_ids):].tolist()
