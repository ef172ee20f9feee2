"""The honest queue: model jobs take turns, first come first served, and a waiting job knows its place
and about how long it will wait, from the measured durations of the jobs ahead of it and the pace of the one
holding the model (a room's load can slow it well past what was measured before the load came).

    with turns.turn("race", work=48, owner=session_hash) as ticket:
        for waiting in turns.wait(ticket):  # a `Waiting` when the place or the estimate changes
            ...
        ...  # this job's turn: nobody else holds the model until the block ends

A browser session keeps one waiting job: a second one from the same `owner` replaces the first, whose
`wait` raises `Replaced`. An address keeps at most `per_client` waiting jobs: the session id is the client's to
choose (a script may send a new one with every request), the connection's address is not, so it is the address
that is counted (`Owner`); loopback is the operator's own machine (its load tests, a proxy on it) and is not.
The app's own background work (`BACKGROUND`: recording its examples) goes behind every visitor's job that has
not started, and `visitor_waiting` tells a running one to yield. The presenter's job goes `first` (the room is
watching it): ahead of those waiting, never ahead of the one running. A watchdog keeps the queue moving: a run
holding the model whose stream has not `advance`d for `stall_seconds` (a client gone without its generator ever
being closed) is stopped by the next waiting job, which then takes its turn. Created by whoever serves (a
`Session` holds one); no module-level state.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field

from specviz.settings.errors import InputError
from specviz.serving.hosts import is_loopback

# The queues the app and the API put their jobs in, one name each so both take the same turns: every job that runs
# the pair shares MODEL (its jobs then take turns here); replays and rendered pages, which run no model, REPLAY.
MODEL = "model"
REPLAY = "replay"

log = logging.getLogger(__name__)

BACKGROUND = "warm-up"  # the owner of the app's own background jobs (runs.room.record_examples)
REFRESH_SECONDS = 1.0  # a waiting job hears from the queue at least this often (its estimate counts down)
KEPT = 9  # durations remembered per kind of job: the recent ones, so that the estimate follows the load
# the share of its work a running job must have done before its own pace projects its end: before it, the prompt's
# reading (no token yet, its whole cost up front) would make the projection run long
JUDGED_FROM = 0.25


class Replaced(InputError):
    """A newer request from the same browser session took this waiting one's place."""


@dataclass(frozen=True)
class Owner:
    """Who a job came from: the connection's address, as the server saw it (behind a reverse proxy, the proxy's:
    raise `--max-waiting-per-client` there), and the browser session it named."""

    client: str
    session: str | None

    @staticmethod
    def of(request) -> Owner:
        """A Gradio request's owner."""
        client = getattr(request, "client", None)
        return Owner(getattr(client, "host", None) or "unknown", getattr(request, "session_hash", None))


@dataclass(frozen=True)
class Waiting:
    """Where a job stands in the queue, as its stream reports it (before any result)."""

    position: int  # 1: next to run once the job holding the model ends
    ahead: int  # jobs ahead of this one, the one holding the model included
    estimate_s: float | None  # seconds until this job gets the model; None while a kind ahead was never timed
    finished: None = None  # like a Round's: a waiting job has not ended (pacing reads it)
    background: bool = False  # the job holding the model is the app's own warm-up (it yields at its next event)


@dataclass(eq=False)
class Ticket:
    kind: str  # "run", "race", "distribution", "step", "atlas"
    work: float  # the kind's unit of size: new tokens for runs and races, samples, prompts
    owner: Owner | str | None  # the browser session (or API client) it came from; None: never replaced
    joined: float
    started: float | None = None  # when it got the model
    replaced: bool = False
    first: bool = False  # the presenter's: ahead of every job waiting without it
    advanced: float | None = None  # when its stream last gave an item
    done: float | None = None  # the share of its work done (0-1), where its stream tells (`Session.stream`)
    stop: Callable[[], None] | None = None  # ends its run (a stream's close): what the watchdog calls


@dataclass
class Durations:
    """Measured seconds per unit of work, by kind of job: the last `KEPT` of each."""

    rates: dict[str, deque] = field(default_factory=lambda: defaultdict(lambda: deque(maxlen=KEPT)))
    seconds: deque = field(default_factory=lambda: deque(maxlen=KEPT))  # whole jobs, any kind
    # from the model freed to the next waiting job holding it: its thread wakes while streams and other
    # requests share the CPU; under a room's load this adds up over a queue of jobs
    handoffs: deque = field(default_factory=lambda: deque(maxlen=KEPT))

    def add(self, kind: str, work: float, seconds: float) -> None:
        self.rates[kind].append(seconds / max(work, 1e-9))
        self.seconds.append(seconds)

    def handoff(self) -> float:
        return statistics.median(self.handoffs) if self.handoffs else 0.0

    def expected(self, kind: str, work: float) -> float | None:
        """The median rate of this kind times the work; a kind never timed yet counts as a median job."""
        if self.rates.get(kind):
            return statistics.median(self.rates[kind]) * work
        return statistics.median(self.seconds) if self.seconds else None


class Turns:
    """The model's queue. `queue[0]` holds the model once it has `started`; the others wait in order."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, refresh: float = REFRESH_SECONDS,
                 per_client: int | None = None, stall_seconds: float | None = None):
        self.clock, self.refresh = clock, refresh
        self.per_client = per_client  # waiting jobs an address may have (None: no cap)
        self.stall_seconds = stall_seconds  # a run holding the model without advancing this long is stopped
        self.queue: list[Ticket] = []
        self.durations = Durations()
        self.freed: float | None = None  # when the last job holding the model let it go
        self.changed = threading.Condition()  # a plain lock inside: Gradio may resume a stream on another thread

    @contextmanager
    def turn(self, kind: str, work: float = 1.0, owner: str | None = None, first: bool = False) -> Iterator[Ticket]:
        """Join the queue; leave it when the block ends. A job that ended normally after holding the model is
        timed for the estimates (one stopped or failed part-way would make them lie)."""
        ticket = self.join(kind, work, owner, first)
        ok = False
        try:
            yield ticket
            ok = True
        finally:
            self.leave(ticket, timed=ok)

    def join(self, kind: str, work: float, owner: Owner | str | None, first: bool = False) -> Ticket:
        with self.changed:
            for old in self.queue:
                if owner is not None and old.owner == owner and old.started is None:
                    old.replaced = True
            self.queue = [t for t in self.queue if not t.replaced]
            self.check_client(owner)
            ticket = Ticket(kind, work, owner, self.clock(), first=first)
            if first:
                ahead = [t for t in self.queue if t.started is not None or t.first]
            elif owner != BACKGROUND:  # a visitor's job goes ahead of the app's own that wait
                ahead = [t for t in self.queue if t.started is not None or t.owner != BACKGROUND]
            else:
                ahead = self.queue
            self.queue.insert(len(ahead), ticket)
            self.changed.notify_all()
            return ticket

    def check_client(self, owner: Owner | str | None) -> None:
        """Refuse a job whose address already has `per_client` jobs waiting (call holding `changed`)."""
        if self.per_client is None or not isinstance(owner, Owner) or is_loopback(owner.client):
            return
        waiting = sum(isinstance(t.owner, Owner) and t.owner.client == owner.client and t.started is None
                      for t in self.queue)
        if waiting >= self.per_client:
            raise InputError(f"your address already has {waiting} {'request' if waiting == 1 else 'requests'} "
                             "waiting for the model, the most it may; send the next when one of them has run.")

    def leave(self, ticket: Ticket, timed: bool = False) -> None:
        with self.changed:
            if ticket in self.queue:
                self.queue.remove(ticket)
            if ticket.started is not None:
                self.freed = self.clock()
                if timed:
                    self.durations.add(ticket.kind, ticket.work, self.freed - ticket.started)
            self.changed.notify_all()

    def wait(self, ticket: Ticket) -> Iterator[Waiting]:
        """Until `ticket` holds the model: a `Waiting` whenever its place changes, and every `refresh` seconds
        (the estimate counts down). Raises `Replaced` if a newer job of the same owner took its place."""
        place, told = None, -self.refresh
        with self.changed:
            while True:
                if ticket.replaced:
                    raise Replaced("a newer request from the same browser session took this one's place in the "
                                   "queue.")
                if self.queue and self.queue[0] is ticket:
                    ticket.started = self.clock()
                    if self.freed is not None:  # idle time before this job joined is no hand-off
                        self.durations.handoffs.append(ticket.started - max(self.freed, ticket.joined))
                    return
                if (stop := self.stalled()) is not None:
                    self.changed.release()  # its close leaves the queue, which takes the lock
                    try:
                        stopped(stop)
                    finally:
                        self.changed.acquire()
                    continue
                now = self.waiting(ticket)
                since = time.monotonic() - told
                if (now.position, now.ahead) != place or since >= self.refresh:
                    place, told = (now.position, now.ahead), time.monotonic()
                    self.changed.release()  # never yield holding the lock: the consumer may take its time
                    try:
                        yield now
                    finally:
                        self.changed.acquire()
                else:
                    self.changed.wait(self.refresh - since)

    def advance(self, ticket: Ticket, done: float | None = None) -> None:
        """`ticket`'s stream gave an item: it is alive, `done` of its work done where the item tells."""
        ticket.advanced = self.clock()
        ticket.done = done if done is not None else ticket.done

    def stalled(self) -> Callable[[], None] | None:
        """The stop of the run holding the model if it has not advanced for `stall_seconds`, taken so that one
        waiting job alone calls it (call holding `changed`)."""
        front = self.queue[0] if self.queue else None
        if self.stall_seconds is None or front is None or front.started is None or front.stop is None:
            return None
        idle = self.clock() - max(front.started, front.advanced or front.started)
        if idle < self.stall_seconds:
            return None
        log.warning("a %s held the model %.0f s without advancing (its client gone, its stream never closed): "
                    "stopped, the model handed to the next in line.", front.kind, idle)
        stop, front.stop = front.stop, None
        return stop

    def waiting(self, ticket: Ticket) -> Waiting:
        """Where `ticket` stands now (call holding `changed`)."""
        i = self.queue.index(ticket)
        ahead = self.queue[:i]
        running = [t for t in ahead if t.started is not None]
        return Waiting(position=i + 1 - len(running), ahead=i, estimate_s=self.estimate(ahead),
                       background=any(t.owner == BACKGROUND for t in running))

    def visitor_waiting(self) -> bool:
        """Does a job that is not the app's own wait for the model? (The app's own yields to it.)"""
        with self.changed:
            return any(t.started is None and t.owner != BACKGROUND for t in self.queue)

    def estimate(self, ahead: list[Ticket]) -> float | None:
        """The rest of the running job (`projected`), the expected durations of those waiting ahead, and a
        hand-off before each job that has yet to start, this one's own included."""
        total = self.durations.handoff() * (1 + sum(t.started is None for t in ahead))
        for t in ahead:
            expected = self.durations.expected(t.kind, t.work)
            if expected is None:
                return None
            if t.started is None:
                total += expected
            else:
                elapsed = self.clock() - t.started
                total += projected(elapsed, t.done, expected) - elapsed
        return total

    def __len__(self) -> int:
        return len(self.queue)


def projected(elapsed: float, done: float | None, expected: float) -> float:
    """A running job's whole duration: its elapsed time over its share done, once it has done `JUDGED_FROM`;
    before that, its expected duration, or a second more than it has run where it is past that."""
    if done is not None and done >= JUDGED_FROM:
        return elapsed / min(done, 1.0)
    return max(expected, elapsed + 1.0)


def stopped(stop: Callable[[], None]) -> None:
    """Call a stalled run's stop. A run inside a forward cannot be closed from here (it is not stalled but slow,
    or its model hung): it keeps the model, and the queue waits for it."""
    try:
        stop()
    except ValueError:  # "generator already executing"
        log.warning("the run holding the model is inside a forward: it could not be stopped.")


def quietly(stream: Iterator) -> Iterator:
    """A run's stream without its `Waiting` updates, for a consumer that shows no queue (it still waits)."""
    with closing(stream):  # closing this closes the run at once, not whenever the collector gets to it
        for item in stream:
            if not isinstance(item, Waiting):
                yield item
