"""Limits and input validation shared by the app, its API and the CLI.

Every check raises `InputError` with one sentence a user can act on; callers show it and carry on.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from specviz.engine.config import ADAPTIVE_MODES, DecodeConfig
from specviz.engine.drafters import DRAFTERS
from specviz.engine.sampling import SamplingParams


class InputError(ValueError):
    """Bad user input; the message is meant for the user."""


MAX_SEED = 2**32 - 1  # the usual seed range; the distribution tab adds the sample index to it
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0  # below 1e-3, logits / T overflows float32 into NaN


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (`specviz serve --max-...` flags)."""

    max_prompt_chars: int = 8000
    max_prompt_tokens: int = 2048
    max_new_tokens: int = 512
    max_k: int = 16
    max_samples: int = 2000  # "same distribution" tab: continuations per side
    max_queue: int = 64  # requests waiting for the model; more are turned away ("queue is full")

    def __post_init__(self):
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"the limit {name} must be a whole number of at least 1, got {value!r}.")


def _short(value, n: int = 40) -> str:
    """A bad value, quoted for a message without echoing megabytes back."""
    text = repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"


def _number(name: str, value, kind=float) -> float:
    if isinstance(value, bool):
        raise InputError(f"{name} must be a number, got {value!r}.")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
        raise InputError(f"{name} must be a number, got {_short(value)}.") from None
    if not math.isfinite(x):
        raise InputError(f"{name} must be a finite number, got {_short(value)}.")
    if kind is int:
        if x != int(x):
            raise InputError(f"{name} must be a whole number, got {_short(value)}.")
        return int(x)
    return x


def clean_prompt(prompt, limits: Limits) -> str:
    """Strip control characters (keeping newlines and tabs) and enforce the length limit."""
    if not isinstance(prompt, str):
        raise InputError("the prompt must be text.")
    prompt = "".join(c for c in prompt if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cs"))
    if not prompt.strip():
        raise InputError("the prompt is empty: type something for the models to continue.")
    if len(prompt) > limits.max_prompt_chars:
        raise InputError(f"the prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars}.")
    return prompt


def check_prompt_tokens(n_tokens: int, max_new_tokens: int, limits: Limits, context: int | None) -> None:
    if n_tokens > limits.max_prompt_tokens:
        raise InputError(f"the prompt is {n_tokens} tokens long; the limit is {limits.max_prompt_tokens}.")
    if context is not None and n_tokens + max_new_tokens > context:
        raise InputError(f"prompt ({n_tokens} tokens) + max new tokens ({max_new_tokens}) exceeds the "
                         f"model's context of {context} tokens.")


def decode_config(limits: Limits, *, k, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                  drafter="model", adaptive="fixed") -> DecodeConfig:
    k = _number("K", k, int)
    if not 1 <= k <= limits.max_k:
        raise InputError(f"K must be between 1 and {limits.max_k}, got {k}.")
    max_new_tokens = _number("max new tokens", max_new_tokens, int)
    if not 1 <= max_new_tokens <= limits.max_new_tokens:
        raise InputError(f"max new tokens must be between 1 and {limits.max_new_tokens}, got {max_new_tokens}.")
    temperature = _number("temperature", temperature)
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise InputError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}, "
                         f"got {temperature:g}.")
    top_k = _number("top-k", top_k, int)
    if top_k < 0:
        raise InputError(f"top-k must be 0 (off) or positive, got {top_k}.")
    top_p = _number("top-p", top_p)
    if not 0 < top_p <= 1:
        raise InputError(f"top-p must be in (0, 1], got {top_p}.")
    if seed is None or seed == "":
        seed = None
    else:
        seed = _number("seed", seed, int)
        if not 0 <= seed <= MAX_SEED:
            raise InputError(f"seed must be a whole number between 0 and {MAX_SEED}, got {seed}.")
    if drafter not in DRAFTERS:
        raise InputError(f"drafter must be one of {', '.join(DRAFTERS)}, got {_short(drafter)}.")
    if adaptive not in ADAPTIVE_MODES:
        raise InputError(f"adaptive K must be one of {', '.join(ADAPTIVE_MODES)}, got {_short(adaptive)}.")
    return DecodeConfig(k=k, max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature, top_k, top_p),
                        seed=seed, drafter=drafter, adaptive=adaptive)
