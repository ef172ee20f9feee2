"""One OpenAI-compatible streamed chat completion: the request specviz sends, and its timing on the client.

The prompt goes as one user message, so the server applies its own chat template (as `specviz bench` gives
specviz's lanes the target's template). specviz's warps map onto the OpenAI fields: temperature 0 is greedy;
top-k (a common extension: llama.cpp, vLLM and SGLang accept it) and top-p are sent as set; the seed when set.

Timing, on `time.perf_counter` at the client: time to first token = request sent -> first content arrived;
decode rate = (tokens - 1) / (last content - first content), the rate after the first token, which is what
speculation speeds up (the prompt's forward is the same in both lanes). Tokens are the engine's own count
(`usage.completion_tokens`, asked for with `stream_options.include_usage`), else the content events counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.engine.config import DecodeConfig


def chat_body(prompt: str, config: DecodeConfig, model: str | None, extra: dict | None = None) -> dict:
    s = config.sampling
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": config.max_new_tokens,
            "temperature": s.temperature, "top_p": s.top_p}
    if model:
        body["model"] = model
    if s.top_k > 0 and not s.greedy:
        body["top_k"] = s.top_k
    if config.seed is not None:
        body["seed"] = config.seed
    return {**body, **(extra or {})}


def content_of(event: dict) -> str:
    """The text an event adds: chat deltas (content, or a reasoning model's reasoning_content) or legacy text."""
    out = []
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        piece = delta.get("content") or delta.get("reasoning_content") or choice.get("text") or ""
        out.append(piece if isinstance(piece, str) else "")
    return "".join(out)


def usage_tokens(events: list[dict]) -> int | None:
    for event in reversed(events):
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            return usage["completion_tokens"]
    return None


@dataclass(frozen=True)
class Streamed:
    text: str
    tokens: int
    ttft_s: float | None
    decode_s: float | None
    decode_tokens_per_s: float | None
    total_s: float
    events: tuple[dict, ...]  # every event, for the adapter's per-request statistics


def measure(started: float, timed: list[tuple[float, dict]], finished: float) -> Streamed:
    """The stream's text and timing from (arrival time, event) pairs; `started`: when the request was sent."""
    events = [e for _, e in timed]
    arrivals = [(t, piece) for t, e in timed if (piece := content_of(e))]
    text = "".join(piece for _, piece in arrivals)
    tokens = usage_tokens(events)
    tokens = len(arrivals) if tokens is None else tokens
    first = arrivals[0][0] if arrivals else None
    last = arrivals[-1][0] if arrivals else None
    decode_s = last - first if arrivals else None
    rate = (tokens - 1) / decode_s if decode_s and tokens > 1 else None
    return Streamed(text, tokens, None if first is None else first - started, decode_s, rate, finished - started,
                    tuple(events))
