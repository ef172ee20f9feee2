"""Serving a room: the operator's room settings (a settings spec: `specviz serve`'s options are generated
from it), the room's tighter limits, the presenter's key, and the warm-up that records the examples.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Sequence

from pydantic import Field
from pydantic.dataclasses import dataclass

from specviz.runs.errors import USER_ERRORS, InputError
from specviz.runs.limits import Limits
from specviz.runs.race import race
from specviz.runs.session import Session
from specviz.runs.settings import checked_values

# A workshop on a 2-core CPU: a race of 48 tokens holds the model ~15 s, so thirty visitors' own prompts get
# through in minutes, not a quarter of an hour (README, Running it for a room)
ROOM_LIMITS = {"max_new_tokens": 48, "max_samples": 16, "max_seconds": 30}
MIN_KEY = 8  # characters: a presenter key is a password typed once, not a PIN to guess


@dataclass(frozen=True)
class Room:
    room: bool = Field(False, title="room",
                       description="tighter limits for a room of visitors sharing one machine: "
                                   + ", ".join(f"{k} {v}" for k, v in ROOM_LIMITS.items())
                                   + " (a limit given as a flag wins); the decoding defaults shrink to fit")
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


def is_presenter(key: str | None, given) -> bool:
    """Does `given` (typed in a browser) match the operator's key? Compared in constant time."""
    return bool(key) and isinstance(given, str) and hmac.compare_digest(given.strip().encode(), key.strip().encode())


WARM_UP = "warm-up"  # the queue's owner of the background runs


def record_examples(session: Session, limits: Limits, prompts: Sequence[str], settings: dict,
                    log: Callable[[str], None] = lambda line: None) -> threading.Thread:
    """Race each prompt once at `settings` (the app's defaults) in the background, as a visitor's Run would: a
    warm-up that is also a recording, so the first click on an example streams at once. Each waits its turn
    in the queue, so a visitor's click meanwhile waits as it would behind any other run."""
    def work() -> None:
        start, before = time.monotonic(), len(session.recordings or ())
        for prompt in prompts:
            try:
                for _ in race(session, limits, prompt, settings, owner=WARM_UP):
                    pass
            except USER_ERRORS as e:  # an example too long for these limits: the others still run
                log(f"an example was not recorded: {e}")
        done = len(session.recordings or ()) - before  # a race cut by the time budget is not recorded
        log(f"recorded {done} of {len(prompts)} examples in {time.monotonic() - start:.0f} s")

    thread = threading.Thread(target=work, name="specviz-record-examples", daemon=True)
    thread.start()
    return thread
