"""The contracts of `specviz.remote`: what a probe found, and what one request measured.

Acceptance here is what the engines report: tokens drafted and accepted, verify rounds, and per draft
position the rounds whose token at that position was accepted. No engine reports the rejected drafts
themselves, so there is no round-by-round view as in specviz's own decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from specviz.remote.prometheus import SpecCounters

Source = Literal["per-request", "metrics-diff", "per-request+metrics-diff"]
DIFF_NOTE = "a difference of server-wide counters: concurrent traffic on this engine would pollute it"


@dataclass(frozen=True)
class EngineInfo:
    """What a probe found at one base URL."""

    kind: str  # "llamacpp", "vllm" or "sglang"
    base_url: str
    model: str | None  # the id to put in requests' "model" (from /v1/models)
    version: str | None
    speculative: bool | None  # None: the probe could not tell
    k: int | None  # most tokens drafted per round, where the engine says
    counters: str | None  # the Prometheus prefix of its speculative counters, when /metrics offers them
    notes: tuple[str, ...] = ()  # what the probe could not find, one sentence each


@dataclass(frozen=True)
class SpecStats:
    """One request's speculative statistics as the engine reported them."""

    drafted: int | None
    accepted: int | None
    drafts: int | None  # verify rounds
    accepted_per_position: tuple[int, ...] | None  # rounds whose i-th draft was accepted, i = 0, 1, …
    source: Source
    note: str = ""

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted and self.accepted is not None else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify round, the correction or bonus included: 1 + accepted / rounds."""
        return 1 + self.accepted / self.drafts if self.drafts and self.accepted is not None else None


@dataclass(frozen=True)
class RequestResult:
    """One streamed completion, timed on the client, with the engine's statistics for it (None: none offered)."""

    text: str
    tokens: int
    ttft_s: float | None  # request sent -> first content arrived
    decode_tokens_per_s: float | None  # (tokens - 1) / (last content - first content)
    decode_s: float | None  # last content - first content
    total_s: float
    stats: SpecStats | None


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def from_counters(diff: SpecCounters) -> SpecStats | None:
    """A counter difference as statistics; None when the page had no counters or they went backwards."""
    values = [v for v in (diff.drafts, diff.draft_tokens, diff.accepted, *diff.per_position) if v is not None]
    if not diff.present or any(v < 0 for v in values):  # (negative: the engine restarted between the reads)
        return None
    return SpecStats(_int(diff.draft_tokens), _int(diff.accepted), _int(diff.drafts),
                     tuple(_int(v) for v in diff.per_position) or None, "metrics-diff", DIFF_NOTE)


def combine(own: SpecStats | None, diff: SpecStats | None) -> SpecStats | None:
    """The request's own figures first; what they lack (rounds, positions) from the counters' difference."""
    if own is None or diff is None:
        return own or diff
    merged = replace(own, drafts=own.drafts if own.drafts is not None else diff.drafts,
                     accepted_per_position=own.accepted_per_position or diff.accepted_per_position,
                     source="per-request+metrics-diff", note=DIFF_NOTE)
    if (own.drafted, own.accepted) != (diff.drafted, diff.accepted):
        merged = replace(merged, note=f"the counters moved by {diff.accepted}/{diff.drafted} accepted/drafted "
                                      f"while the request reported {own.accepted}/{own.drafted}: other traffic "
                                      "ran on this engine, so its rounds and positions are not this request's")
        merged = replace(merged, drafts=own.drafts, accepted_per_position=own.accepted_per_position)
    return merged
