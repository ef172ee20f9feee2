"""The presenter's run, fanned out: followers see its states as they happen, at no model cost.

The presenter's stream of `RaceState`s passes through `Broadcast.publishing`, which keeps a copy of the
latest; followers read `latest()` (numbered, so each sees a state once) as often as they like. Nothing
runs for them: they get the presenter's own states, copied, so that no follower reads a race while the
presenter's run changes it. Who may publish is the adapters' business (the operator's presenter key).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, replace

from specviz.runs.race import Lane, RaceState


@dataclass(frozen=True)
class Published:
    version: int  # bumps with every state published: a follower that has seen it waits for the next
    run: int  # bumps with every run the presenter starts
    state: RaceState | None  # None: the presenter has run nothing yet


def copy_lane(lane: Lane) -> Lane:
    return replace(lane, token_ids=list(lane.token_ids), events=list(lane.events), points=list(lane.points))


def snapshot(state: RaceState) -> RaceState:
    """The race as it stands, apart from the live one (events themselves are never changed once made)."""
    return replace(state, ar=copy_lane(state.ar), spec=copy_lane(state.spec))


class Broadcast:
    def __init__(self):
        self.current = Published(0, 0, None)
        self.lock = threading.Lock()

    def latest(self) -> Published:
        return self.current  # replaced whole, never changed: no lock needed to read it

    def publishing(self, states: Iterator) -> Iterator:
        """The presenter's stream, unchanged, each race state published on the way (queue updates are not)."""
        with self.lock:
            run = self.current.run + 1
        with closing(states):
            for state in states:
                if isinstance(state, RaceState):
                    self.publish(snapshot(state), run)
                yield state

    def publish(self, state: RaceState, run: int) -> None:
        with self.lock:
            self.current = Published(self.current.version + 1, run, state)
