"""transformers' assisted generation, the baseline a user would otherwise pick.

`generate(assistant_model=draft)` keeps its drafting settings on the assistant's generation
config, and some of them persist across calls (the "heuristic" schedule writes K back; the
confidence threshold can adapt). So every call restores the assistant's settings first, then
applies the setting asked for: a constant K with no confidence cut-off, or HF's own defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.engine import SamplingParams

ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@dataclass(frozen=True)
class HFSetting:
    name: str  # "k=4" or "default"
    k: int | None  # None: HF's defaults (20 tokens, constant schedule, confidence threshold 0.4)
    confidence: float = 0.0  # stop drafting below this draft probability (HF's assistant_confidence_threshold)

    @staticmethod
    def fixed(k: int, confidence: float = 0.0) -> HFSetting:
        """Exactly K drafts per round, or, with a confidence, at most K (as specviz's "confidence" mode)."""
        return HFSetting(f"k={k}", k, confidence)


HF_DEFAULT = HFSetting("default", None)


@dataclass
class HFResult:
    """One timed `HFAssisted.generate` call (timed by the runner, as its own decoders are)."""

    tokens: list[int]
    seconds: float
    stall: float | None = None  # fraction of the call's wall time another task waited for a CPU


def sampling_kwargs(sampling: SamplingParams) -> dict:
    """generate()'s arguments for the warps specviz decodes with: greedy, or sampled at the same temperature,
    top-k and top-p (None leaves a warp off, and keeps the model's generation_config from adding one)."""
    if sampling.greedy:
        return dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    return dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                top_p=sampling.top_p if sampling.top_p < 1.0 else None)


class HFAssisted:
    """Runs `target.generate(..., assistant_model=draft)` with specviz's warps, one setting per call."""

    def __init__(self, target, assistant, eos_token_ids, pad_token_id: int | None, device,
                 sampling: SamplingParams = SamplingParams(), seed: int | None = 0):
        self.target, self.assistant, self.device = target, assistant, device
        self.sampling, self.seed = sampling, seed
        self.eos = sorted(eos_token_ids)
        self.pad = pad_token_id if pad_token_id is not None else self.eos[0]
        config = assistant.generation_config
        self.original = {f: getattr(config, f, None) for f in ASSISTANT_FIELDS}

    def _apply(self, setting: HFSetting) -> None:
        config = self.assistant.generation_config
        for f, v in self.original.items():
            setattr(config, f, v)
        if setting.k is not None:
            config.num_assistant_tokens = setting.k
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = setting.confidence  # 0: no early stop

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, setting: HFSetting) -> list[int]:
        """The new token ids; the assistant's settings are restored afterwards, even on an error."""
        self._apply(setting)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        if self.seed is not None and not self.sampling.greedy:
            torch.manual_seed(self.seed)  # generate() samples from the global generator
        try:
            out = self.target.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=self.assistant,
                max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                repetition_penalty=None, **sampling_kwargs(self.sampling),
            )
        finally:
            self._apply(HF_DEFAULT)
        return out[0, len(prompt_ids):].tolist()
