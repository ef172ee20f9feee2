"""What one request may ask of the server, and the prompt checks every run path shares.

`Limits` is a settings spec like `DecodeConfig`: `specviz serve --max-...` options are generated from
it, and fields of other specs name the limit that caps them (`limit` in their metadata). Every check
raises `InputError` with one sentence a user can act on; callers show it and carry on.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable

from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.engine.events import Finish
from specviz.settings.errors import InputError
from specviz.settings.spec import checked_values


def _limit(default: int, name: str, help: str, flag: str | None = None):
    return Field(default, ge=1, title=f"the limit {name}", description=help,
                 json_schema_extra={"flag": flag} if flag else None)


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int = _limit(8000, "max_prompt_chars", "longest prompt, in characters")
    max_prompt_tokens: int = _limit(2048, "max_prompt_tokens", "longest prompt, in tokens")
    max_new_tokens: int = _limit(512, "max_new_tokens", "most new tokens a run may ask for",
                                 flag="--max-new-tokens-limit")  # --max-new-tokens is the run's own setting
    max_k: int = _limit(16, "max_k", "most tokens drafted per round")
    max_samples: int = _limit(2000, "max_samples", "'same distribution' samples per side")
    max_queue: int = _limit(64, "max_queue", "requests that may wait for the model; more are turned away")
    max_waiting_per_client: int = _limit(8, "max_waiting_per_client", "requests one address may have waiting for the "
                                         "model (loopback, the operator's own, is not counted; behind a reverse proxy "
                                         "on another host every visitor has the proxy's address: raise it there)")
    max_sessions: int = _limit(200, "max_sessions", "browser sessions whose state (the last run, a paused run) the "
                               "server keeps; the oldest beyond are dropped")
    max_paused: int = _limit(8, "max_paused", "paused step-mode runs kept at once (each holds KV caches); the "
                             "oldest beyond are closed")
    paused_seconds: int = _limit(600, "paused_seconds", "seconds a paused step-mode run is kept without a step")
    max_atlas_prompts: int = _limit(200, "max_atlas_prompts", "prompts one Atlas request may run (more are left "
                                    "out, and it says so)")
    max_seconds: int = _limit(180, "max_seconds", "wall-clock seconds one request may hold the model; then it "
                              "ends (finished: 'budget') and keeps what it made; a run that gives nothing for as "
                              "long (its client gone) is stopped and the model handed to the next in line")
    max_load_seconds: int = _limit(900, "max_load_seconds", "wall-clock seconds a visitor's pair load may take "
                                   "(downloads, kernel timing and compiling included); then it is given up and the "
                                   "served pair stays")


_init = Limits.__init__


def _checked_init(self, **values):
    """Built directly (a test, the CLI), a bad limit is an InputError naming it, as from any surface."""
    checked_values(Limits, values)
    _init(self, **values)


Limits.__init__ = _checked_init

# The CLI runs on the user's own machine: the same checks as the app's controls, but not the web
# server's per-request caps (only the model's context bounds a run; K stays a sane number).
CLI_LIMITS = Limits(max_new_tokens=1_000_000, max_k=256, max_samples=1_000_000, max_atlas_prompts=1_000_000,
                    max_seconds=10**9, max_load_seconds=10**9)


def budget(seconds: float, clock: Callable[[], float] = time.monotonic) -> Callable[[], Finish]:
    """A request's time budget as the engine's `should_stop`, counted from now: create it once the pair is
    taken, so waiting in the queue costs none of it."""
    end = clock() + seconds
    return lambda: "budget" if clock() >= end else None


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
