"""One interface over an OpenAI-compatible engine: connect (check the URL, probe what it offers), then complete
prompts, each timed on the client with the engine's speculative statistics for it.

Statistics come from the response itself where the engine offers them per request; what that lacks (llama.cpp
reports no rounds or positions per request) comes from its Prometheus counters read just before and just after
the request: `source` says which, and a difference is marked as such (other traffic on the engine meanwhile
would be counted too). Requests run one at a time, so in a race nothing of specviz's own overlaps them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from specviz.engine.config import DecodeConfig
from specviz.remote import llamacpp, sglang, vllm
from specviz.remote.adapter import Adapter, Get, json_of, owner
from specviz.remote.policy import EngineError, EnginePolicy, base_url, display
from specviz.remote.prometheus import difference, read_counters
from specviz.remote.results import EngineInfo, RequestResult, combine, from_counters
from specviz.remote.stream import chat_body, content_of, measure
from specviz.remote.transport import get_text, stream_events

ADAPTERS = (llamacpp.ADAPTER, vllm.ADAPTER, sglang.ADAPTER)
KINDS = tuple(a.kind for a in ADAPTERS)
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Engine:
    info: EngineInfo
    adapter: Adapter

    @property
    def url(self) -> str:
        return self.info.base_url


def getter(client: httpx.Client, policy: EnginePolicy, base: str) -> Get:
    return lambda path: get_text(client, policy, base + path)


def detect(get: Get, where: str) -> str:
    """Which engine answers: /v1/models' owner, else the endpoint only one of them serves."""
    said = (owner(get) or "").lower().replace(".", "").replace("-", "")
    for kind in KINDS:
        if kind in said:
            return kind
    if isinstance(json_of(get("/props")), dict):
        return "llamacpp"
    if isinstance(json_of(get("/get_server_info")), dict) or isinstance(json_of(get("/server_info")), dict):
        return "sglang"
    if isinstance(json_of(get("/version")), dict):
        return "vllm"
    raise EngineError(f"the server at {where} is none of llama.cpp, vLLM or SGLang by its answers (/v1/models, "
                      "/props, /get_server_info, /version); name its kind.")


def connect(client: httpx.Client, policy: EnginePolicy, url: str, kind: str = "auto") -> Engine:
    """Check `url` against the policy (before any connection), wait for nothing, probe what the engine offers."""
    base = base_url(policy.check(url))
    get = getter(client, policy, base)
    get("/health")  # a server still loading answers 503 here: one sentence, before any probe
    kind = detect(get, display(base)) if kind == "auto" else kind
    adapter = next((a for a in ADAPTERS if a.kind == kind), None)
    if adapter is None:
        raise EngineError(f"{kind!r} is not an engine specviz knows; choose from {', '.join(KINDS)}.")
    return Engine(adapter.probe(base, get), adapter)


def counters_now(client: httpx.Client, policy: EnginePolicy, engine: Engine):
    text = get_text(client, policy, engine.url + "/metrics")
    return None if text is None else read_counters(text, engine.info.counters)


@dataclass(frozen=True)
class Partial:
    """The text streamed so far, while a completion is under way (for a view that shows it growing)."""

    text: str
    tokens: int


def completing(client: httpx.Client, policy: EnginePolicy, engine: Engine, prompt: str,
               config: DecodeConfig) -> Iterator[Partial | RequestResult]:
    """Stream one completion of `prompt` (a user message) at `config`'s length and sampling: a `Partial` as each
    piece of text arrives, then the `RequestResult`, timed from the same arrival times as `complete`'s."""
    body = chat_body(prompt, config, engine.info.model, engine.adapter.extra_body(config))
    before = counters_now(client, policy, engine) if engine.info.counters else None
    started = time.perf_counter()
    timed, text, pieces = [], "", 0
    for arrived, event in stream_events(client, policy, engine.url + CHAT_PATH, body, started):
        timed.append((arrived, event))
        if piece := content_of(event):
            text, pieces = text + piece, pieces + 1
            yield Partial(text, pieces)
    streamed = measure(started, timed, time.perf_counter())
    after = counters_now(client, policy, engine) if before is not None else None
    diff = from_counters(difference(before, after)) if after is not None else None
    stats = combine(engine.adapter.per_request(streamed.events), diff)
    yield RequestResult(streamed.text, streamed.tokens, streamed.ttft_s, streamed.decode_tokens_per_s,
                        streamed.decode_s, streamed.total_s, stats)


def complete(client: httpx.Client, policy: EnginePolicy, engine: Engine, prompt: str,
             config: DecodeConfig) -> RequestResult:
    """Stream one completion of `prompt` (a user message) at `config`'s length and sampling, and time it."""
    *_, result = completing(client, policy, engine, prompt, config)
    return result
