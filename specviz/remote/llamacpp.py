"""llama.cpp's `llama-server`: what it offers, read from the source of the build specviz makes (llama.cpp vendored
in llama-cpp-python 0.3.36, `tools/server/`; older builds had the same server under `examples/server/`).

* per request: the last streamed event's `timings` (`server-common.cpp`, `server_slot_stats::to_json`) holds
  `draft_n` and `draft_n_accepted`, present only when the request drafted (older builds: absent);
* /metrics, with `--metrics` (`server-task.cpp`, `to_metrics`): `llamacpp:spec_decode_num_drafts_total`,
  `…_num_draft_tokens_total`, `…_num_accepted_tokens_total` and `…_num_accepted_tokens_per_pos_total{position}`
  (one position per token of `--spec-draft-n-max`; the per-position series appears after the first speculative
  request). A slot adds its request's counts when it is released, before the next request is served;
* /slots: each slot's `speculative` (whether it has a drafter) and `params["speculative.types"]`;
* /props: `build_info`, `model_path`. Per-request speculative settings (`speculative.n_max`, `.n_min`,
  `.p_min`) are compiled out in this version (`server-schema.cpp`, `#if 0`), so a race needs two servers:
  the target alone, and the target with its draft (`specviz engines llamacpp` starts both).

Its sampler defaults differ from specviz's (min-p 0.05, top-k 40): the request turns both off unless set.
"""

from __future__ import annotations

from collections.abc import Sequence

from specviz.engine.config import DecodeConfig
from specviz.remote.adapter import Adapter, Get, first_model, json_of, metrics_probe, number
from specviz.remote.results import EngineInfo, SpecStats

PREFIX = "llamacpp:"


def probe(base_url: str, get: Get) -> EngineInfo:
    props = json_of(get("/props")) or {}
    slots = json_of(get("/slots"))
    metrics = metrics_probe(get, PREFIX)
    notes = []
    speculative = None
    if isinstance(slots, list) and slots and all(isinstance(s, dict) for s in slots):
        flags = [s.get("speculative") for s in slots]
        speculative = any(flags) if all(isinstance(f, bool) for f in flags) else None
    else:
        notes.append("it serves no /slots page (started with --no-slots), so whether it drafts shows only in its "
                     "results")
    if metrics.note:
        hint = "" if metrics.page else " (start llama-server with --metrics)"
        notes.append(f"{metrics.note}{hint}: rounds and per-position acceptance are then unknown")
    return EngineInfo("llamacpp", base_url, first_model(get) or props.get("model_alias"),
                      props.get("build_info") if isinstance(props.get("build_info"), str) else None,
                      speculative, metrics.k, metrics.prefix, tuple(notes))


def extra_body(config: DecodeConfig) -> dict:
    s = config.sampling
    return {"min_p": 0.0, **({} if s.greedy or s.top_k else {"top_k": 0})}  # its defaults: min-p 0.05, top-k 40


def per_request(events: Sequence[dict]) -> SpecStats | None:
    """The request's own draft counts from the last event's `timings` (rounds and positions: not per request)."""
    for event in reversed(events):
        timings = event.get("timings")
        if isinstance(timings, dict):
            drafted, accepted = number(timings, "draft_n"), number(timings, "draft_n_accepted")
            if drafted is None or accepted is None:
                return None  # it drafted nothing, or this build does not say
            return SpecStats(int(drafted), int(accepted), None, None, "per-request")
    return None


ADAPTER = Adapter("llamacpp", probe, extra_body, per_request)
