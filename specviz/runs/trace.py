"""Traces: a run's event stream as JSON, to export, replay without models, or diff.

Format (version 1):
    {"format": "specviz-trace", "version": 1,
     "meta": {"draft", "target", "device", "dtype", "prompt", "prompt_tokens", "config"},
     "rounds": [Round, ...],        # speculative decoding, one object per round
     "ar_steps": [Step, ...]}       # optional: the target alone, one object per token

A `Trace` is also what the run paths yield as a run grows (`source` says which path made it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specviz.engine import DecodeConfig, Round, Step, autoregressive_generate, speculative_generate
from specviz.engine.events import round_from_dict, step_from_dict
from specviz.models import ModelPair, encode_prompt
from specviz.settings.errors import TraceError
from specviz.runs.outputs import write_atomic

FORMAT, VERSION = "specviz-trace", 1


@dataclass(frozen=True)
class RunMeta:
    """Which pair ran which prompt with which settings."""

    draft: str
    target: str
    device: str
    dtype: str
    prompt: str
    prompt_tokens: int
    config: DecodeConfig
    # why the target's verify rows may round unlike its one-token steps (None: they cannot; `ModelPair.not_invariant`);
    # a trace from before the invariant verify says nothing
    not_invariant: str | None = "this trace predates the invariant verify"

    @property
    def greedy(self) -> bool:
        return self.config.sampling.greedy

    @property
    def recorded_on(self) -> str:
        return f"{self.device} in {self.dtype} ({self.target})"

    @staticmethod
    def of(pair: ModelPair, prompt: str, prompt_ids: list[int], config: DecodeConfig) -> RunMeta:
        return RunMeta(pair.draft_name, pair.target_name, str(pair.device), str(pair.dtype).removeprefix("torch."),
                       prompt, len(prompt_ids), config, pair.not_invariant)

    @staticmethod
    def from_dict(d: dict) -> RunMeta:
        return RunMeta(**{**d, "config": DecodeConfig(**d["config"])})  # the nested sampling dict too


@dataclass
class Trace:
    meta: RunMeta
    rounds: list[Round] = field(default_factory=list)
    ar_steps: list[Step] = field(default_factory=list)
    source: str = "run"  # what made it ("Run", "Race", "Replay of x.json"); not saved
    recorded_at: float | None = None  # a recorded answer: when the run it replays ran (epoch seconds); not saved

    @property
    def finished(self):
        """How the run ended (a Round's `finished`), None while it goes on."""
        return self.rounds[-1].finished if self.rounds else None

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": asdict(self.meta),
                "rounds": [r.to_dict() for r in self.rounds], "ar_steps": [s.to_dict() for s in self.ar_steps]}


def record(pair: ModelPair, prompt: str, config: DecodeConfig, with_ar: bool = False) -> Trace:
    ids = encode_prompt(pair.tokenizer, prompt)
    rounds = list(speculative_generate(pair, ids, config))
    steps = list(autoregressive_generate(pair, ids, config)) if with_ar else []
    return Trace(RunMeta.of(pair, prompt, ids, config), rounds, steps)


def save(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, json.dumps(trace.to_dict(), ensure_ascii=False))
    return path


def parse(data) -> Trace:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError("this file is not a specviz trace (no \"format\": \"specviz-trace\" field).")
    if data.get("version") != VERSION:
        raise TraceError(f"trace version {data.get('version')!r} is not supported (this specviz reads {VERSION}).")
    try:
        return Trace(RunMeta.from_dict(dict(data["meta"])), [round_from_dict(r) for r in data["rounds"]],
                     [step_from_dict(s) for s in data.get("ar_steps", [])])
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"this specviz trace is damaged or incomplete ({type(e).__name__}: {e}).") from e


def load(path: str | Path) -> Trace:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"could not read a trace from {Path(path).name}: {e}") from e
    return parse(data)
