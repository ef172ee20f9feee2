"""vLLM's OpenAI server: what it offers for speculative decoding (sources named per item; names change between
versions, so each is looked for, none assumed).

* /metrics (`vllm/v1/spec_decode/metrics.py`, `SpecDecodingProm`, registered only when a speculative config is
  set): `vllm:spec_decode_num_drafts`, `…_num_draft_tokens`, `…_num_accepted_tokens` and
  `…_num_accepted_tokens_per_pos{position}` (counters, exposed with `_total`; positions 0..K-1 from the start,
  so K shows before any request), labelled per engine core and model;
* per request, with `--per-request-spec-decode-metrics summary|detailed` (vLLM 0.29): the final streamed event
  (the usage one, hence `stream_options.include_usage`) carries `metrics.speculative_decoding` with
  `num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`, `mean_acceptance_length`,
  `draft_acceptance_rate`, `acceptance_histogram` (H[n]: steps that accepted exactly n drafts; a list, or an
  object with string keys) and `num_spec_tokens`; `detailed` adds `per_step_accepted` / `per_step_drafted`
  (vLLM's test `test_per_request_spec_decode_metrics`). The same object under a choice's
  `speculative_decoding_stats` (`--per-request-spec-decode-stats`, the naming of vLLM PR #48915, as AIPerf's
  `docs/reference/spec-decode-acceptance.md` documents it) is read too;
* /version: `{"version": …}`.
"""

from __future__ import annotations

from collections.abc import Sequence

from specviz.engine.config import DecodeConfig
from specviz.remote.adapter import Adapter, Get, first_model, json_of, metrics_probe, number, positions_from_histogram
from specviz.remote.results import EngineInfo, SpecStats

PREFIX = "vllm:"


def probe(base_url: str, get: Get) -> EngineInfo:
    version = json_of(get("/version"))
    metrics = metrics_probe(get, PREFIX)
    # the counters exist exactly when a speculative config is set: a page without them is a plain engine
    speculative = True if metrics.prefix else (False if metrics.page else None)
    notes = [] if speculative is False else [
        "per-request statistics come with vLLM 0.29+ started with --per-request-spec-decode-metrics summary (or "
        "detailed); a response without them is measured by the counters' difference around it"]
    if metrics.note and speculative is not False:
        notes.append(f"{metrics.note}: either it does not speculate, or its metrics are off")
    return EngineInfo("vllm", base_url, first_model(get), version.get("version") if isinstance(version, dict) else None,
                      speculative, metrics.k, metrics.prefix, tuple(notes))


def extra_body(config: DecodeConfig) -> dict:
    return {}  # its defaults are specviz's: no min-p, top-k off


def block_of(event: dict) -> dict | None:
    metrics = event.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        return metrics["speculative_decoding"]
    for choice in event.get("choices") or []:
        if isinstance(choice, dict) and isinstance(choice.get("speculative_decoding_stats"), dict):
            return choice["speculative_decoding_stats"]
    return None


def per_request(events: Sequence[dict]) -> SpecStats | None:
    for event in reversed(events):
        block = block_of(event)
        if block is None:
            continue
        drafted, accepted = number(block, "num_draft_tokens"), number(block, "num_accepted_draft_tokens")
        steps = number(block, "num_spec_steps")
        if drafted is None or accepted is None:
            return None
        k = number(block, "num_spec_tokens")
        positions = positions_from_histogram(block.get("acceptance_histogram"), int(k) if k else None)
        return SpecStats(int(drafted), int(accepted), None if steps is None else int(steps), positions, "per-request")
    return None


ADAPTER = Adapter("vllm", probe, extra_body, per_request)
