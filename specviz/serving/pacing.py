"""How fast results are shown: thinning a live stream for a browser, and pacing a replay.

Neither changes what is computed or measured; both only decide when a consumer sees it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass

from specviz.serving.quiet import Quiet

MAX_REPLAY_SECONDS = 300.0  # however slow a trace says it was, a replay holds a worker no longer than this


@dataclass(frozen=True)
class Pace:
    """Pacing of live views; tests set everything to 0."""

    min_interval: float = 0.15  # seconds between streamed updates (fast devices make many events)
    stage_delay: float = 0.7  # step mode: pause between the draft, verify and accept stages
    quiet: Quiet = Quiet()  # after a shown view, the next timed forward waits for the page's work (tests: cap 0)
    # a timed run shown in a browser: a view at most this often, where its waits are on. The page's work and the wait
    # after it then come once per several forwards, not once per token (headless Chromium on the same 2-core Zen 4,
    # three prompts interleaved with the bench: the target-alone lane at 0.75-0.88 of the bench's speed with a view
    # every 0.15 s, 0.85-0.92 with one every 0.6 s)
    timed_every: float = 0.6

    @property
    def timed_interval(self) -> float:
        """The interval between a timed run's shown views: `timed_every` where the page is waited for, else
        `min_interval` (no waits: nothing to space out)."""
        return max(self.min_interval, self.timed_every) if self.quiet.cap > 0 else self.min_interval

    def timed(self, events: Iterator, others_waiting: Callable[[], bool], warm=None) -> Iterator[tuple]:
        """`paced` for a timed run shown in a browser: a view every `timed_interval`, the page's work waited for
        before each next forward (`Quiet.for_run`, `warm`: its spinners)."""
        return paced(events, self.timed_interval, settle=self.quiet.for_run(others_waiting, warm))


def paced(events: Iterator, min_interval: float, clock: Callable[[], float] = time.monotonic,
          settle: Callable[[], object] = lambda: None) -> Iterator[tuple]:
    """(event, show) pairs: show is True at most every min_interval seconds, and for the last event
    (one whose `finished` is set). Before the first event is made, and after each shown event once the consumer asks
    for the next (the view handed on), `settle()` runs: a timed run waits there for the page's work (`Quiet.settle`),
    the first time for what the click itself made the page do (a tab switched, the blank lanes drawn), which would
    otherwise overlap the prompt's forward: in headless Chromium on a 2-core Zen 4 the speculative lane's prefill took
    0.76-1.06 s on the page against 0.50-0.76 s in the bench."""
    last = None
    settle()
    with closing(events):  # closing the pacer (Stop) closes the run it paces
        for event in events:
            now = clock()
            show = last is None or now - last >= min_interval or event.finished is not None
            if show:
                last = now
            yield event, show
            if show:
                settle()


def pacer(speed, budget: float = MAX_REPLAY_SECONDS, sleep: Callable[[float], None] = time.sleep
          ) -> Callable[[float], None]:
    """Sleep each recorded interval divided by `speed` (0: no pauses), at most 5 s each and `budget` in all."""
    speed, left = float(speed or 0), [budget]

    def wait(seconds: float) -> None:
        pause = min(seconds / speed, 5.0, left[0]) if speed > 0 and seconds > 0 else 0.0
        if pause > 0 and math.isfinite(pause):
            left[0] -= pause
            sleep(pause)
    return wait
