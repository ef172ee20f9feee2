"""A race between engines: the same prompts through an endpoint that speculates and one that does not (and
optionally the draft model alone, to measure its cost), in a shuffled order, repeated.

Order: each repetition shuffles the prompts, and each prompt's lanes run back to back in a shuffled order, so
a slow spell on a shared machine falls on both lanes alike and a prompt's lanes stay paired for the
intervals (`summary.py`). Before the timed runs, each lane answers `warmup` short requests that are not
counted: a server's first request pays for its own start (buffers, caches) and would bias its lane.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import httpx

from specviz.engine.config import DecodeConfig
from specviz.remote.engine import Engine, complete
from specviz.remote.policy import EnginePolicy
from specviz.remote.results import RequestResult
from specviz.runs.atlas_input import AtlasPrompt as Prompt  # a prompt file's line: id, prompt, kind

SPEC, PLAIN, DRAFT = "speculative", "target alone", "draft alone"
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Run:
    prompt: Prompt
    repeat: int
    lane: str
    order: int  # its place in the race (0 first)
    result: RequestResult


def race_order(prompts: Sequence[Prompt], lanes: Sequence[str], repeats: int,
               seed: int | None) -> list[tuple[int, Prompt, str]]:
    """(repetition, prompt, lane) in the order they run: prompts shuffled per repetition, lanes per prompt."""
    rng = random.Random(seed)
    order = []
    for repeat in range(repeats):
        for prompt in rng.sample(list(prompts), len(prompts)):
            order += [(repeat, prompt, lane) for lane in rng.sample(list(lanes), len(lanes))]
    return order


def iter_race(client: httpx.Client, policy: EnginePolicy, lanes: dict[str, Engine], prompts: Sequence[Prompt],
              config: DecodeConfig, repeats: int = 1, seed: int | None = 0, warmup: int = 1) -> Iterator[Run]:
    """Every prompt through every lane, `repeats` times, one request at a time, each run as it finishes (see
    the module's docstring); `warmup` uncounted short requests per lane first."""
    short = replace(config, max_new_tokens=min(WARMUP_TOKENS, config.max_new_tokens))
    for engine in lanes.values():
        for _ in range(warmup):
            complete(client, policy, engine, prompts[0].prompt, short)
    for i, (repeat, prompt, lane) in enumerate(race_order(prompts, list(lanes), repeats, seed)):
        yield Run(prompt, repeat, lane, i, complete(client, policy, lanes[lane], prompt.prompt, config))

