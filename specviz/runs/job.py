"""A request made ready to run: validated settings, a clean prompt, its tokens, the pair to run on.

Everything a user can get wrong is checked here, before any model runs and before the pair's lock
is taken, so a bad request costs nothing and says what to fix in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.engine import DecodeConfig
from specviz.engine.drafters import drafter_problem
from specviz.models import ModelPair, encode_prompt
from specviz.settings.errors import InputError
from specviz.settings.limits import Limits, check_prompt_tokens, clean_prompt
from specviz.serving.session import Session
from specviz.settings.spec import validate
from specviz.runs.trace import RunMeta


@dataclass(frozen=True)
class Job:
    pair: ModelPair
    prompt: str
    ids: list[int]
    config: DecodeConfig
    meta: RunMeta


def prepare(session: Session, limits: Limits, prompt, settings: dict | DecodeConfig) -> Job:
    """`settings`: raw values by setting name (a form, a request, flags), or a config already validated."""
    prompt = clean_prompt(prompt, limits)
    config = settings if isinstance(settings, DecodeConfig) else validate(DecodeConfig, settings, limits)
    pair = session.require()
    if problem := drafter_problem(config.drafter, pair.draft, pair.target, config.exit_layer, pair.vocab_map):
        raise InputError(problem)
    ids = encode_prompt(pair.tokenizer, prompt)
    check_prompt_tokens(len(ids), config.max_new_tokens, limits, session.context_length())
    return Job(pair, prompt, ids, config, RunMeta.of(pair, prompt, ids, config))
