"""An engine's speculative-decoding counters on its Prometheus page, and their difference around a request.

vLLM (`vllm/v1/spec_decode/metrics.py`, `SpecDecodingProm`) and recent llama.cpp (`tools/server/server-task.cpp`,
`to_metrics`) expose the same four counters under their own prefix:

    <prefix>spec_decode_num_drafts_total                      verify steps (rounds)
    <prefix>spec_decode_num_draft_tokens_total                tokens drafted
    <prefix>spec_decode_num_accepted_tokens_total             drafted tokens accepted
    <prefix>spec_decode_num_accepted_tokens_per_pos_total{position="i"}   rounds whose i-th draft was accepted

(prometheus_client's parser names a counter's family without `_total`.) Sample values are summed over every
other label (vLLM labels each engine core and model), grouped by `position` for the last one. Counters are
cumulative and server-wide: a difference is one request's only if nothing else ran meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from specviz.remote.policy import EngineError

FAMILIES = {"drafts": "spec_decode_num_drafts", "draft_tokens": "spec_decode_num_draft_tokens",
            "accepted": "spec_decode_num_accepted_tokens", "per_position": "spec_decode_num_accepted_tokens_per_pos"}


@dataclass(frozen=True)
class SpecCounters:
    drafts: float | None  # None: this page has no such counter
    draft_tokens: float | None
    accepted: float | None
    per_position: tuple[float, ...]  # accepted at draft position 0, 1, …; () when not exposed (yet)

    @property
    def present(self) -> bool:
        return any(v is not None for v in (self.drafts, self.draft_tokens, self.accepted))


def counter_values(text: str, prefix: str) -> dict[str, dict[str, float]]:
    """{family without prefix: {position label or "": summed value}} for the counters under `prefix`."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        raise EngineError(f"the engine's /metrics page is not Prometheus text ({str(e).rstrip('.')}).") from None
    out: dict[str, dict[str, float]] = {}
    for family in families:
        if not family.name.startswith(prefix):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):  # prometheus_client's creation timestamp, not a count
                continue
            by = out.setdefault(family.name.removeprefix(prefix), {})
            key = sample.labels.get("position", "")
            by[key] = by.get(key, 0.0) + float(sample.value)
    return out


def read_counters(text: str, prefix: str) -> SpecCounters:
    values = counter_values(text, prefix)

    def total(name: str) -> float | None:
        found = values.get(FAMILIES[name])
        return sum(found.values()) if found else None

    positions = values.get(FAMILIES["per_position"], {})
    try:
        ordered = sorted(positions.items(), key=lambda kv: int(kv[0]))
    except ValueError:
        raise EngineError("the engine's per-position counter has a position label that is not a number.") from None
    return SpecCounters(total("drafts"), total("draft_tokens"), total("accepted"), tuple(v for _, v in ordered))


def difference(before: SpecCounters, after: SpecCounters) -> SpecCounters:
    """after - before, counter by counter (a position first seen after counts from 0)."""
    def minus(a, b):
        return None if a is None else a - (b or 0.0)

    n = len(after.per_position)
    earlier = before.per_position + (0.0,) * (n - len(before.per_position))
    return SpecCounters(minus(after.drafts, before.drafts), minus(after.draft_tokens, before.draft_tokens),
                        minus(after.accepted, before.accepted),
                        tuple(a - b for a, b in zip(after.per_position, earlier)))
