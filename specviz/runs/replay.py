"""Replays: recorded runs streamed again without any model, at their recorded pace.

A trace comes from an upload, from a shipped trace chosen by name (package data: never a path a
visitor chose), or, for the API, as JSON text. Replays read nothing but the trace, so a failure on
the way is the trace's fault: it becomes a `TraceError`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from specviz.runs import trace as tracefile
from specviz.settings.errors import USER_ERRORS, InputError
from specviz.serving.pacing import pacer
from specviz.runs.race import RaceState, replay_race
from specviz.runs.trace import Trace

MAX_TRACE_CHARS = 20_000_000  # as much as the UI's upload limit (20 MB)


def shipped_dir():
    """The traces shipped inside the package (found as package data, installed or not)."""
    return resources.files("specviz.data") / "traces"


def shipped_traces() -> list[str]:
    """Names of the shipped traces: the only server files a replay may read."""
    return sorted(p.name for p in shipped_dir().iterdir() if p.name.endswith(".json") and p.is_file())


def open_trace(upload, shipped: str | None) -> Trace:
    """An uploaded file wins; otherwise a shipped trace chosen by name from the listing (never a path)."""
    if upload:
        path = Path(upload if isinstance(upload, str) else getattr(upload, "name", upload))
        t = tracefile.load(path)
        t.source = f"Replay of {path.name}"
        return t
    if shipped:
        names = shipped_traces()
        if shipped not in names:
            raise InputError(f"{shipped!r} is not one of the shipped traces ({', '.join(names) or 'none'}).")
        with resources.as_file(shipped_dir() / shipped) as path:
            t = tracefile.load(path)
        t.source = f"Replay of {shipped}"
        return t
    raise InputError("choose a shipped trace or upload a trace file (.json) first.")


def trace_from_text(value) -> Trace:
    """For the API: a shipped trace's name, or a whole trace as JSON text."""
    if value is not None and not isinstance(value, str):
        raise InputError("the trace must be text: a shipped trace's name or a trace as JSON.")
    value = (value or "").strip()
    if len(value) > MAX_TRACE_CHARS:
        raise InputError(f"the trace is {len(value)} characters long; the limit is {MAX_TRACE_CHARS}.")
    if value.startswith("{"):
        t = tracefile.parse(tracefile.loads(value))
        t.source = "Replay of uploaded JSON"
        return t
    return open_trace(None, value)


def trace_data(fn: Callable) -> Callable:
    """For an adapter's replay or page (a function or generator that reads nothing but a trace, rendering included): a
    failure on the way is the trace's fault, said in one sentence (`trace.damaged`)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except USER_ERRORS:
                raise
            except tracefile.DAMAGE as e:
                raise tracefile.damaged(e) from e
        return gen

    @functools.wraps(fn)
    def plain(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS:
            raise
        except tracefile.DAMAGE as e:
            raise tracefile.damaged(e) from e
    return plain


def replay(t: Trace, speed) -> Iterator[Trace]:
    """A recorded run round by round, at its recorded pace divided by `speed` (0: at once): a growing
    Trace (first with no rounds), like a live run's."""
    shown = Trace(t.meta, [], t.ar_steps, source=t.source)
    yield shown
    wait = pacer(speed)
    for r in t.rounds:
        wait(r.draft_time + r.verify_time + r.overhead_time)
        shown.rounds.append(r)
        yield shown


def replay_race_paced(t: Trace, speed) -> Iterator[RaceState]:
    """A recorded race (the trace needs target-alone steps), at its recorded pace divided by `speed`."""
    if not t.ar_steps:
        raise InputError(f"{t.source.removeprefix('Replay of ')} has no target-alone steps to race against "
                         "(record it with --with-ar).")
    shown, wait = 0.0, pacer(speed)
    for state in replay_race(t):
        wait(state.ar.clock + state.spec.clock - shown)
        shown = state.ar.clock + state.spec.clock
        yield state
