"""SGLang's server: what it offers for speculative decoding (field names changed between versions: each is
looked for, none assumed).

* per request, `meta_info` (`python/sglang/srt/managers/tokenizer_manager.py`, the speculative metrics it adds
  per request): `spec_verify_ct` (verify rounds), the accepted drafts (`spec_accept_token_num`, later
  `spec_accepted_drafts`, later `spec_num_correct_drafts`), the drafts proposed (`spec_draft_token_num`,
  `spec_proposed_drafts`, `spec_num_proposed_drafts`; computed there as rounds x (speculative_num_draft_tokens
  - 1)), `spec_accept_length` (completion tokens / rounds) and `spec_accept_histogram` (later
  `spec_correct_drafts_histogram`; H[n]: rounds that accepted exactly n drafts). The native /generate endpoint
  always returns it; /v1/chat/completions only when the request sets `return_meta_info` (its protocol.py), on
  each choice (`ChatCompletionResponseChoice.meta_info`), top level on some versions: both are read;
* /get_server_info (renamed /server_info): `speculative_algorithm`, `speculative_num_draft_tokens`, `version`;
* /metrics: `sglang:spec_accept_length` and `sglang:spec_accept_rate` are gauges over a recent window, not
  counters, so no difference of them is one request's: SGLang has no metrics-diff fallback here.
"""

from __future__ import annotations

from collections.abc import Sequence

from specviz.engine.config import DecodeConfig
from specviz.remote.adapter import Adapter, Get, first_model, json_of, number, positions_from_histogram
from specviz.remote.results import EngineInfo, SpecStats

ACCEPTED = ("spec_accept_token_num", "spec_accepted_drafts", "spec_num_correct_drafts")
PROPOSED = ("spec_draft_token_num", "spec_proposed_drafts", "spec_num_proposed_drafts")
HISTOGRAMS = ("spec_accept_histogram", "spec_correct_drafts_histogram")


def probe(base_url: str, get: Get) -> EngineInfo:
    info = json_of(get("/get_server_info")) or json_of(get("/server_info"))
    notes = ["SGLang's /metrics has gauges, not counters, for speculation: statistics come only from each "
             "response's meta_info"]
    if not isinstance(info, dict):
        notes.append("it serves neither /get_server_info nor /server_info, so its speculative settings are unknown")
        return EngineInfo("sglang", base_url, first_model(get), None, None, None, None, tuple(notes))
    algorithm = info.get("speculative_algorithm")
    tokens = number(info, "speculative_num_draft_tokens")
    k = int(tokens) - 1 if tokens and algorithm else None  # a round verifies its drafts plus the target's own
    return EngineInfo("sglang", base_url, first_model(get), info.get("version") if isinstance(info.get("version"), str)
                      else None, bool(algorithm) and str(algorithm).upper() != "NONE", k, None, tuple(notes))


def extra_body(config: DecodeConfig) -> dict:
    return {"return_meta_info": True}  # without it, its chat responses carry no meta_info


def meta_of(event: dict) -> dict | None:
    for choice in event.get("choices") or []:
        if isinstance(choice, dict) and isinstance(choice.get("meta_info"), dict):
            return choice["meta_info"]
    return event.get("meta_info") if isinstance(event.get("meta_info"), dict) else None


def per_request(events: Sequence[dict]) -> SpecStats | None:
    for event in reversed(events):
        meta = meta_of(event)
        if not meta or number(meta, "spec_verify_ct") is None:
            continue
        rounds = int(number(meta, "spec_verify_ct"))
        accepted, proposed = number(meta, *ACCEPTED), number(meta, *PROPOSED)
        histogram = next((meta[h] for h in HISTOGRAMS if meta.get(h)), None)
        positions = positions_from_histogram(histogram)
        if accepted is None and positions is not None:
            accepted = sum(positions)  # each accepted draft sits at one position
        return SpecStats(None if proposed is None else int(proposed), None if accepted is None else int(accepted),
                         rounds, positions, "per-request")
    return None


ADAPTER = Adapter("sglang", probe, extra_body, per_request)
