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
from specviz.settings.errors import InputError, TraceError
from specviz.settings.spec import INT64, short, validate
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
        """Its settings checked as a run's are (`settings.spec`: a bad one is named), the nested sampling dict too."""
        config = d["config"]
        if not isinstance(config, dict) or not isinstance(config.get("sampling", {}), dict):
            raise InputError("they must be a JSON object (their sampling too).")
        flat = {k: v for k, v in config.items() if k != "sampling"} | config.get("sampling", {})
        return RunMeta(**{**d, "config": validate(DecodeConfig, flat)})


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
        raise TraceError(f"trace version {short(data.get('version'))} is not supported (this specviz reads {VERSION}).")
    try:
        return Trace(RunMeta.from_dict(dict(data["meta"])), [round_from_dict(r) for r in data["rounds"]],
                     [step_from_dict(s) for s in data.get("ar_steps", [])])
    except InputError as e:  # its settings, checked as a run's are
        raise TraceError(f"this specviz trace is damaged or incomplete: in its settings, {e}") from e
    except DAMAGE as e:
        raise damaged(e) from e


# what wrong types under the right keys raise on the way through a trace (and JSON nested absurdly deep), each said
# as what it means for the file rather than in Python's words
DAMAGE = (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, RecursionError)


def damaged(e: BaseException) -> TraceError:
    """A failure while reading or replaying a trace, said as the file's fault in one sentence."""
    if isinstance(e, KeyError):
        what = f"it has no {short(e.args[0] if e.args else '', 30)} field where one is needed"
    elif isinstance(e, RecursionError):
        what = "its JSON is nested too deep"
    elif isinstance(e, (IndexError, ZeroDivisionError)):
        what = "its counts or times do not agree with each other"
    else:
        what = "a field holds a value of the wrong kind or out of range"
    return TraceError(f"this specviz trace is damaged or incomplete: {what}.")


def whole_number(text: str) -> int:
    """JSON's integers, refused past 64 bits before Python converts them (a 5,000-digit one would be its own error,
    and one past 64 bits, sent back in an answer, one Gradio's JSON encoder cannot write)."""
    if len(text.lstrip("-")) > 19 or not -INT64 <= (n := int(text)) < INT64:
        raise TraceError(f"this specviz trace is damaged or incomplete: {short(text, 24)} does not fit in 64 bits.")
    return n


def loads(text: str):
    """A trace's JSON text as Python values, a failure said in one sentence."""
    try:
        return json.loads(text, parse_int=whole_number)
    except json.JSONDecodeError as e:
        raise TraceError(f"the text is not valid JSON (line {e.lineno}, column {e.colno}).") from None
    except RecursionError as e:
        raise damaged(e) from None


def load(path: str | Path) -> Trace:
    name = Path(path).name
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"could not read a trace from {name}: it is not UTF-8 text.") from None
    except OSError as e:
        raise TraceError(f"could not read a trace from {name}: {(e.strerror or 'unreadable').lower()}.") from e
    try:
        data = loads(text)
    except TraceError as e:
        raise TraceError(f"could not read a trace from {name}: {e}") from e
    return parse(data)
