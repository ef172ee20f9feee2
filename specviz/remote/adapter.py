"""What an engine adapter is: a probe, the request fields its engine needs, and a reader of its per-request
statistics. Adapters take a `Get` (path -> body text, None when the endpoint is absent) instead of an HTTP
client, so they are pure functions of what the engine answers, and their tests feed them recorded answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specviz.engine.config import DecodeConfig
from specviz.remote.policy import EngineError
from specviz.remote.prometheus import read_counters
from specviz.remote.results import EngineInfo, SpecStats

Get = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Adapter:
    kind: str
    probe: Callable[[str, Get], EngineInfo]  # (base URL, get) -> what this engine offers
    extra_body: Callable[[DecodeConfig], dict]  # fields its chat completions need beyond the OpenAI ones
    per_request: Callable[[Sequence[dict]], SpecStats | None]  # a stream's events -> its own statistics


def json_of(text: str | None):
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def first_model(get: Get) -> str | None:
    """The first model id /v1/models lists (the one a single-model server serves)."""
    models = json_of(get("/v1/models"))
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
        return data[0]["id"]
    return None


def owner(get: Get) -> str | None:
    """/v1/models' `owned_by` (llama.cpp says "llamacpp", vLLM "vllm", SGLang "sglang")."""
    models = json_of(get("/v1/models"))
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return str(data[0].get("owned_by") or "") or None
    return None


@dataclass(frozen=True)
class MetricsProbe:
    page: bool  # the engine serves /metrics
    prefix: str | None  # set when the page has the speculative counters under it
    k: int | None  # positions of the per-position counter (K), when exposed yet
    note: str | None  # why there are no counters to difference


def metrics_probe(get: Get, prefix: str) -> MetricsProbe:
    text = get("/metrics")
    if text is None:
        return MetricsProbe(False, None, None, "it serves no /metrics page")
    try:
        counters = read_counters(text, prefix)
    except EngineError as e:
        return MetricsProbe(True, None, None, str(e).rstrip("."))
    if not counters.present:
        return MetricsProbe(True, None, None, f"its /metrics page has no {prefix}spec_decode_* counters")
    return MetricsProbe(True, prefix, len(counters.per_position) or None, None)


def number(obj: dict, *names: str) -> float | None:
    """The first of `names` that `obj` holds as a number (engines rename fields between versions)."""
    for name in names:
        value = obj.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def positions_from_histogram(histogram, k: int | None = None) -> tuple[int, ...] | None:
    """Per draft position, the rounds that accepted it, from H[n] = rounds that accepted exactly n drafts
    (a list, or a {"n": count} object as JSON writes integer keys): position i counts every H[n], n > i."""
    if isinstance(histogram, dict):
        try:
            counts = {int(n): int(c) for n, c in histogram.items()}
        except (TypeError, ValueError):
            return None
    elif isinstance(histogram, list) and all(isinstance(c, (int, float)) for c in histogram):
        counts = {n: int(c) for n, c in enumerate(histogram)}
    else:
        return None
    depth = max([n for n, c in counts.items() if c] + [k or 0], default=0)
    return tuple(sum(c for n, c in counts.items() if n > i) for i in range(depth)) or None
