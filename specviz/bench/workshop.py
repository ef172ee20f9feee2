"""The workshop mix of `specviz loadtest --mix workshop`: what a room of visitors sends while a presenter teaches.

60 % clicks on the app's examples at its default settings (the server's recorded answers), 25 % their own
prompts (each a new request: a run for the model), 10 % replays and What if (no model), 5 % the same
distribution test, and besides these a few bad inputs (each must be refused in one sentence) and a dropped
stream. Every request is a race, as the Live view's Run is, unless it is one of the others.
"""

from __future__ import annotations

import random
from specviz.bench.loadtest import PROMPT, Request

WEIGHTS = {"example": 60, "own": 25, "replay": 5, "whatif": 5, "distribution": 5}
TOPICS = ("a lighthouse", "the sea", "a robot learning to paint", "a city at night", "a cat in a library",
          "bread baking", "a mountain pass", "rain on a tin roof", "a chess match", "the first snow")
OWN = ("Write a haiku about {}.", "Describe {} in two sentences.", "Write a Python function named after {} that "
       "returns its name reversed.", "List three facts about {} as a JSON array.")
BAD = ("empty_prompt", "zero_k", "unknown_trace", "greedy_distribution", "too_many_tokens")


def own_prompt(n: int, seed: int = 0) -> str:
    """The n-th visitor prompt of a seeded plan: all different, and different from another seed's, so none is
    answered from a recording (a second load test against the same server included)."""
    return OWN[n % len(OWN)].format(TOPICS[n // len(OWN) % len(TOPICS)]) + f" (visitor request {seed}-{n})"


def workshop_requests(info: dict, n: int, seed: int = 0, bad: int = 0) -> list[Request]:
    """`n` requests drawn from the workshop's weights (seeded), then `bad` bad inputs among them. `info`: the
    server's /info (its examples, limits and shipped traces)."""
    rng = random.Random(seed)
    examples = [e["prompt"] for e in info.get("examples") or [{"prompt": PROMPT}]]
    trace = next(iter(info.get("shipped_traces") or []), None)
    samples = min(16, info["limits"]["max_samples"])
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=n)
    out = []
    for i, kind in enumerate(kinds):
        if kind == "example":
            out.append(Request("example", "/race", {"prompt": rng.choice(examples)}))
        elif kind == "own":
            out.append(Request("own", "/race", {"prompt": own_prompt(i, seed)}))
        elif kind == "replay" and trace is not None:
            out.append(Request("replay", "/replay", {"trace": trace}))
        elif kind == "distribution":
            out.append(Request("distribution", "/same_distribution",
                               {"prompt": own_prompt(i, seed), "samples": samples, "temperature": 1.0}))
        else:  # What if (or a replay with no shipped trace to replay)
            out.append(Request("whatif", "/whatif", {"acceptance": round(rng.uniform(0.3, 0.9), 2),
                                                     "k": rng.randint(2, 8), "draft_cost": 0.1}, streams=False))
    for j in range(bad):
        out.insert(rng.randrange(len(out) + 1), bad_request(BAD[j % len(BAD)], info))
    return out


def bad_request(kind: str, info: dict) -> Request:
    """A request the server must refuse, and a word its one sentence must contain."""
    too_many = info["limits"]["max_new_tokens"] + 1
    return {
        "empty_prompt": Request("empty_prompt", "/race", {"prompt": "   "}, "empty"),
        "zero_k": Request("zero_k", "/race", {"prompt": PROMPT, "k": 0}, "k must be"),
        "unknown_trace": Request("unknown_trace", "/replay", {"trace": "no_such_trace.json"}, "shipped"),
        "greedy_distribution": Request("greedy_distribution", "/same_distribution",
                                       {"prompt": PROMPT, "samples": 16, "temperature": 0.0}, "temperature"),
        "too_many_tokens": Request("too_many_tokens", "/race", {"prompt": PROMPT, "max_new_tokens": too_many},
                                   "max new tokens"),
    }[kind]
