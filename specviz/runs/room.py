"""Serving a room: the operator's room settings (a settings spec: `specviz serve`'s options are generated
from it), the room's tighter limits, the presenter's key, and the warm-up that records the examples.
"""

from __future__ import annotations

import atexit
import hmac
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import replace

from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.engine import DecodeConfig
from specviz.runs.distribution import DistributionSettings, sample_distribution
from specviz.settings.errors import USER_ERRORS, InputError
from specviz.settings.limits import Limits
from specviz.runs.race import race
from specviz.serving.recorded import COMPLETE
from specviz.serving.session import Session
from specviz.serving.turns import BACKGROUND, Waiting
from specviz.settings.spec import checked_values, fields_of

# A workshop on a 2-core CPU (README, Running it for a room): what one request may ask at most, and what the app
# opens at. The default sets what most clicks cost: a race of 24 tokens holds the model about half as long as one
# of 48, and thirty visitors' own prompts wait on the sum of them
ROOM_LIMITS = {"max_new_tokens": 48, "max_samples": 16, "max_seconds": 30}
ROOM_DEFAULTS = {"max_new_tokens": 24}
MIN_SAMPLES = next(s.lo for s in fields_of(DistributionSettings) if s.name == "samples")  # the test's smallest
MIN_KEY = 8  # characters: a presenter key is a password typed once, not a PIN to guess


@dataclass(frozen=True)
class Room:
    room: bool = Field(False, title="room",
                       description="tighter limits for a room of visitors sharing one machine: "
                                   + ", ".join(f"{k} {v}" for k, v in ROOM_LIMITS.items())
                                   + " (a limit given as a flag wins), and the app opens at "
                                   + ", ".join(f"{k} {v}" for k, v in ROOM_DEFAULTS.items())
                                   + " (a decoding flag given wins)")
    recorded: bool = Field(True, title="recorded answers",
                           description="answer a request this server already ran to the end (greedy, or sampled "
                                       "from a fixed seed: the same tokens) from that run's recording, streamed at "
                                       "its pace and labelled; the shipped examples are recorded after loading")
    recorded_mb: int = Field(64, ge=1, title="recorded answers' memory",
                             description="megabytes of recorded answers kept (compressed events); the least "
                                         "recently used go first")
    presenter_key: str | None = Field(None, title="presenter key",
                                      description=f"a secret of at least {MIN_KEY} characters: the browser it is "
                                                  "entered in presents (its Live runs stream to every visitor who "
                                                  "follows); none: nobody presents")


def room_of(values: dict) -> Room:
    """The room settings from raw values (flags), checked like every setting, the key's length too."""
    room = Room(**checked_values(Room, values))
    if room.presenter_key is not None and len(room.presenter_key.strip()) < MIN_KEY:
        raise InputError(f"the presenter key must have at least {MIN_KEY} characters.")
    return room


def room_limits(given: dict, room: Room) -> dict:
    """Raw limit values: the room's where the operator gave none (`given` holds only the flags given)."""
    return ({**ROOM_LIMITS} if room.room else {}) | given


def room_defaults(defaults: DecodeConfig, room: Room, limits: Limits) -> DecodeConfig:
    """The app's decoding defaults: in a room, the room's where the flags left the spec's own, within the limits."""
    if not room.room:
        return defaults
    spec = DecodeConfig()
    chosen = replace(defaults, **{k: v for k, v in ROOM_DEFAULTS.items() if getattr(defaults, k) == getattr(spec, k)})
    return replace(chosen, max_new_tokens=min(chosen.max_new_tokens, limits.max_new_tokens))


def is_presenter(key: str | None, given) -> bool:
    """Does `given` (typed in a browser) match the operator's key? Compared in constant time."""
    return bool(key) and isinstance(given, str) and hmac.compare_digest(given.strip().encode(), key.strip().encode())


WARM_UP = BACKGROUND  # the queue's owner of the background runs: behind every visitor, yielding to them
RETRIES = 3  # times a warm-up race cut for a visitor is tried again


def record_examples(session: Session, limits: Limits, prompts: Sequence[str], settings: dict,
                    log: Callable[[str], None] = lambda line: None, calibrate: bool = True) -> threading.Thread:
    """Race each prompt once at `settings` (the app's defaults) in the background, as a visitor's Run would: a
    warm-up that is also a recording, so the first click on an example streams at once. It is the app's own work,
    so it never makes a visitor wait: a visitor's job goes ahead of it in the queue, and the race holding the model
    stops at its next event when a visitor waits (cut, not recorded, and raced again later). Then (`calibrate`)
    one same-distribution test of the smallest size, so that the queue's first estimates know its cost too
    (a room's first jobs would otherwise wait behind one priced as a median job, several times too cheap)."""
    stop = threading.Event()

    def work() -> None:
        start, recorded = time.monotonic(), 0
        todo = [(prompt, 0) for prompt in prompts]
        while todo and not stop.is_set():
            prompt, tries = todo.pop(0)
            try:
                outcome = warm_up_race(session, limits, prompt, settings, stop)
            except USER_ERRORS as e:  # an example too long for these limits: the others still run
                log(f"an example was not recorded: {e}")
                continue
            if outcome == "cut" and tries < RETRIES:
                todo.append((prompt, tries + 1))
            recorded += outcome == "recorded"
        log(f"recorded {recorded} of {len(prompts)} examples in {time.monotonic() - start:.0f} s")
        if calibrate and prompts and not stop.is_set():
            try:
                for _ in sample_distribution(session, limits, prompts[0], settings,
                                             {"samples": MIN_SAMPLES, "temperature": 1.0}, owner=WARM_UP):
                    if stop.is_set():
                        break
            except USER_ERRORS as e:
                log(f"the same-distribution test was not timed: {e}")

    def finish() -> None:
        """Stop at the next event and wait for it: a thread killed inside a forward as the interpreter exits aborts
        the process ("terminate called without an active exception", exit 134) instead of ending it."""
        stop.set()
        thread.join(timeout=30)
        atexit.unregister(finish)

    thread = threading.Thread(target=work, name="specviz-record-examples", daemon=True)
    thread.finish = finish  # (the app's exit calls it; so may a caller that is done with the app)
    atexit.register(finish)
    thread.start()
    return thread


def warm_up_race(session: Session, limits: Limits, prompt: str, settings: dict,
                 stop: threading.Event | None = None) -> str:
    """One warm-up race: "cut" at its next event because a visitor waits for the model (or `stop` was set), else
    "recorded" (or already recorded) or "not recorded" (the race's conditions for keeping it: both lanes ended by
    themselves, a speed that measures)."""
    last = None
    with closing(race(session, limits, prompt, settings, owner=WARM_UP)) as states:
        for state in states:
            if isinstance(state, Waiting):
                continue
            last = state
            if not state.done and (session.turns.visitor_waiting() or (stop is not None and stop.is_set())):
                return "cut"
    kept = last is not None and (last.recorded_at is not None or (
        last.timing_note is None and {last.ar.finished, last.spec.finished} <= set(COMPLETE)))
    return "recorded" if kept else "not recorded"
