"""Recorded answers: a request this server has already run is answered from that run's recording.

A run's result is fixed by its request when it is greedy, or sampled with a fixed seed: the same prompt,
every decoding setting and the same served pair (weights, dtype, kernels) give the same tokens. Such a
run, once complete, is kept as its events (and, for a race, each event's measured seconds), so the same
request later streams the very same events at their recorded pace, with the numbers that real run
measured, labelled with when it ran (`recorded_at`). A recording holds no tensor and no model time.

Memory is bounded: `Recordings` keeps the least recently used out, counting the bytes it stores (each
recording is its events as compressed JSON). The run paths (decode.py, race.py) record and replay.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from specviz.engine import DecodeConfig

COMPLETE = ("eos", "length")  # only runs that ended by themselves: a budget or a Stop depends on the moment


@dataclass(frozen=True)
class RecordingKey:
    """Everything that fixes a run's events: which path, the prompt as cleaned, the validated settings (seed
    included), and the served pair (its load, spec and name: draft, target, device, dtype, quantisations,
    kernels)."""

    kind: str  # "run" (speculative decoding alone) or "race"
    prompt: str
    config: DecodeConfig
    pair: tuple


def deterministic(config: DecodeConfig) -> bool:
    """Greedy, or sampled from a fixed seed: the same request gives the same tokens."""
    return config.sampling.greedy or config.seed is not None


def key_of(session, kind: str, prompt: str, config: DecodeConfig) -> RecordingKey | None:
    """The request's key, or None when it cannot be answered from a recording (recordings off, or a fresh
    seed each run)."""
    if session.recordings is None or not deterministic(config):
        return None
    return RecordingKey(kind, prompt, config, (session.generation, session.spec, session.name))


@dataclass(frozen=True)
class Recording:
    blob: bytes  # the events as compressed JSON: what `size` counts, and all a recording holds
    recorded_at: float  # seconds since the epoch, when the run finished
    shared_cpu: bool = False  # a race: another job took CPU while it was timed (it says so when replayed)

    @property
    def size(self) -> int:
        return len(self.blob)

    @property
    def items(self) -> list:
        return json.loads(zlib.decompress(self.blob))


def recording(items: list, shared_cpu: bool = False, now=time.time) -> Recording:
    return Recording(zlib.compress(json.dumps(items, separators=(",", ":")).encode(), 1), now(), shared_cpu)


class Recordings:
    """Recorded answers by `RecordingKey`, least recently used first out, at most `max_bytes` in all."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.kept: OrderedDict[RecordingKey, Recording] = OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, key: RecordingKey | None) -> Recording | None:
        with self.lock:
            found = self.kept.get(key) if key is not None else None
            if found is not None:
                self.kept.move_to_end(key)
            return found

    def put(self, key: RecordingKey, rec: Recording) -> bool:
        """Keep `rec`, dropping the least recently used until it fits; one larger than the bound is not kept."""
        if rec.size > self.max_bytes:
            return False
        with self.lock:
            old = self.kept.pop(key, None)
            self.size -= old.size if old is not None else 0
            while self.kept and self.size + rec.size > self.max_bytes:
                _, dropped = self.kept.popitem(last=False)
                self.size -= dropped.size
            self.kept[key] = rec
            self.size += rec.size
            return True

    def __len__(self) -> int:
        return len(self.kept)


@dataclass
class Meanwhile:
    """Looks, when a job's turn comes, for the same request recorded while it waited (many visitors clicking
    one example at once): `missing()` (the run is still needed) is `Session.stream`'s `needed`."""

    recordings: Recordings | None
    key: RecordingKey | None
    recording: Recording | None = None

    def missing(self) -> bool:
        if self.key is not None and self.recordings is not None:
            self.recording = self.recordings.get(self.key)
        return self.recording is None


def clock_time(recorded_at: float) -> str:
    """When a recording was made, as a visitor reads a clock: '10:42' (the server's local time)."""
    return time.strftime("%H:%M", time.localtime(recorded_at))


def iso_time(recorded_at: float | None) -> str | None:
    """The same for JSON: ISO 8601 with the server's UTC offset."""
    if recorded_at is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(recorded_at))
