"""Waiting for the machine to go quiet after a view is shown, so that no page's work overlaps a timed forward.

A race shown in a browser on the same machine (a laptop projecting the demo) makes that browser parse, lay out and
paint every update, and the server serialise it, on the cores the next forward needs: a forward timed meanwhile
is slower by what they took, and since the page's heavy work (a new round's p/q figure) follows a speculative round,
it lands mostly on the target-alone lane's next step and inflates the speedup shown. So after each shown view the
race waits until the other tasks on the machine have been runnable a quarter of the time or less for a short window
(Linux's run queue, /proc/loadavg), at most `cap` seconds. Where the run queue cannot be read (another OS), it does
not wait; where the machine stays busy past the cap (other work, not the page), the next forward runs all the same,
and the race's step check (`runs.race.stray_note`) reports a lane its measure did not hold for. A run does not wait
while another visitor's job waits for the model, and stops waiting after `patience` waits in a row ran to the cap
(`Quiet.for_run`): the machine is busy with other work (a workshop), which waiting cannot end, and would only make
every visitor slower. While it waits, idle-priority spinners keep the cores awake (`serving.warm`): a forward after an
idle wait was 1.21x one after another forward on a 2-core Zen 4 VM, and the target alone waits once a token.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from specviz.serving.warm import Warmers

LOADAVG = Path("/proc/loadavg")


def runnable(path: Path = LOADAVG) -> int | None:
    """Tasks runnable on the whole machine right now, the reader included (/proc/loadavg's fourth field, 'R/T');
    None where it cannot be read."""
    try:
        return int(path.read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Quiet:
    """How to tell that the page's work is done: over the last `window` seconds, looked at every `poll`, other
    tasks were runnable `busy` of the time or less on average (headless Chromium idles at a tenth of a core or so,
    compositing frames; rendering an update keeps one to four tasks runnable for tens of ms); at most `cap`
    seconds. A looser rule (half the time, over 25 ms) measured no better on a 2-core Zen 4."""

    cap: float = 0.5
    window: float = 0.05  # three 60 Hz frames: a paint waiting for its frame is not missed
    poll: float = 0.001
    busy: float = 0.25
    patience: int = 4  # waits in a row that ran to the cap, after which a run stops waiting (one page: two seen)

    def settle(self, count: Callable[[], int | None] = runnable, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> bool:
        """Wait until the last `window` seconds were quiet (True), or `cap` seconds passed (False: the machine
        stayed busy). Returns at once where the run queue cannot be read or the cap is 0."""
        if self.cap <= 0 or count() is None:
            return True
        looks = deque(maxlen=max(1, round(self.window / self.poll)))
        start = clock()
        while clock() - start < self.cap:
            looks.append(max(0, (count() or 1) - 1))  # the reader counts itself
            if len(looks) == looks.maxlen and sum(looks) <= self.busy * len(looks):
                return True
            sleep(self.poll)
        return False

    def for_run(self, others_waiting: Callable[[], bool] = lambda: False, warm: Warmers | None = None,
                count: Callable[[], int | None] = runnable, **machine) -> Callable[[], bool]:
        """`settle` for one run: at once (False) while `others_waiting()` (another visitor's job waits for the model:
        waiting here would delay theirs, and the race's step check labels what the overlap costs this one), and
        after `patience` waits in a row ran to the cap, for the rest of the run. With `warm`, its idle-priority
        spinners hold the cores while it waits (`serving.warm`), left out of the run queue it reads. `count`,
        `machine`: `settle`'s count, clock and sleep (tests)."""
        capped = [0]

        def settle() -> bool:
            if capped[0] >= self.patience or others_waiting():
                return False
            with warm.held() if warm is not None and self.cap > 0 else nullcontext(0) as spinning:
                quiet = self.settle(lambda: None if (n := count()) is None else n - spinning, **machine)
            capped[0] = 0 if quiet else capped[0] + 1
            return quiet
        return settle
