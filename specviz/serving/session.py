"""The served model pair: who holds it, how it is switched, and the lock that guards it.

Created by whoever serves (`specviz serve`, a test) and handed to the run paths; nothing here is
module-level state. `stream` lends the pair to one run at a time, in turn (`turns.Turns`, the queue), and
`recordings` (off unless given) keeps the answers of runs a request fixes (`recorded.Recordings`).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as LoadTimeout
from contextlib import closing, contextmanager
from dataclasses import replace

from specviz.engine import DecodeConfig, autoregressive_generate, speculative_generate
from specviz.models import ModelLoadError, ModelPair, PairSpec, load_pair, load_spec
from specviz.models.memory import check_fits
from specviz.models.pair import OUT_OF_MEMORY, release_memory
from specviz.models.presets import PRESETS
from specviz.models.compiled import warm_sizes
from specviz.models.step_timing import reference_steps
from specviz.models.steps import checked_in_use
from specviz.settings.errors import InputError
from specviz.serving.model_thread import ModelThread
from specviz.serving.recorded import Recordings
from specviz.settings.spec import checked_values
from specviz.serving.warm import Warmers
from specviz.serving.turns import Turns, Waiting

Loader = Callable[..., ModelPair]

MAX_SOURCE_CHARS = 400
MIN_STEPS_JUDGED = 8  # a race's target alone must make this many steps before its step time judges a compiled one


def clean_source(value, role: str, *, optional: bool = False) -> str | None:
    """A model id, folder or .gguf path as typed: trimmed, printable, of sane length."""
    if value is not None and not isinstance(value, str):
        raise InputError(f"the {role} model must be text (a hub id, a folder or 'embedded').")
    value = (value or "").strip()
    if not value:
        if optional:
            return None
        raise InputError(f"the {role} model is empty: pick a preset or type a hub id, a folder or 'embedded'.")
    if len(value) > MAX_SOURCE_CHARS or any(unicodedata.category(c).startswith("C") for c in value):
        raise InputError(f"the {role} model name is not a plausible id or path.")
    return value


def warm_up(pair: ModelPair) -> ModelPair:
    """A few tokens through both lanes right after a load, interleaved as a race runs them (both lanes' caches
    held at once), and a compiled step on every cache size and buffer set a race can use (`warm_sizes`). A
    process's first forwards pay one-time costs (allocations, kernel selection, weights paged in, compiling);
    without this they land on the first click and slow the first race's lanes unequally. Then each model's
    one-token step, timed warm: the pair returned carries it (`ModelPair.reference`), what a race's lanes are
    checked against (`runs.race.stray_note`)."""
    warm_sizes(pair.target, sets=2)  # a race's two lanes
    warm_sizes(pair.draft)
    ids = pair.tokenizer("Hello, world", add_special_tokens=False)["input_ids"] or [0]
    config = DecodeConfig(k=2, max_new_tokens=3, adaptive="fixed", drafter="model" if pair.draft else "lookup")
    for _ in itertools.zip_longest(speculative_generate(pair, ids, config), autoregressive_generate(pair, ids, config)):
        pass
    return replace(pair, reference=reference_steps(pair.target, pair.draft))


def let_go(done: Future, worker: ModelThread) -> None:
    """A load given up that has now ended: what it loaded is freed, its thread ends."""
    if not done.cancelled() and done.exception() is None:
        worker.call(done.result().release)
    worker.retire()
    release_memory()


def failure(e: Exception, spec: PairSpec) -> str:
    """One sentence for a failed load, whatever raised it."""
    if isinstance(e, (ModelLoadError, InputError)):
        return str(e)
    if isinstance(e, OUT_OF_MEMORY):
        return f"out of memory while loading {spec.label}: pick a smaller pair or a lower-precision dtype"
    return f"could not load {spec.label}: {type(e).__name__}: {e}"


class BesideQueue:
    """Counts the jobs that run beside the model queue (replays, pages rendered): they take CPU from a race
    being timed, which then says so (`RaceState.shared_cpu`)."""

    def __init__(self):
        self.active = self.started = 0
        self.lock = threading.Lock()

    @contextmanager
    def job(self) -> Iterator[None]:
        with self.lock:
            self.active += 1
            self.started += 1
        try:
            yield
        finally:
            with self.lock:
                self.active -= 1

    def since(self, started: int) -> bool:
        """Did any job run beside the queue since `started` was read (or is one running now)?"""
        return self.active > 0 or self.started != started


class Session:
    """Holds the current pair. `using()` lends it to one run at a time; `load()` swaps it; `worker` (a
    `ModelThread`) does all its model work.

    `spec` is the pair the server was started with: it is always allowed, and it alone may run remote
    model code (if its `trust_remote_code` says so); a pair chosen in the UI never does.
    """

    busy_timeout = 120.0  # seconds a job without a queue of its own (a step, a load) waits for the pair

    def __init__(self, pair: ModelPair | None = None, spec: PairSpec | None = None, *,
                 loader: Loader = load_pair, allow_any_model: bool = True, allow_switch: bool = False,
                 fits: Callable[[PairSpec], None] = check_fits, recordings: Recordings | None = None,
                 load_seconds: float | None = None):
        self.pair, self.spec = pair, spec
        self.origin = spec
        self.loader = loader
        self.allow_switch = allow_switch  # False: visitors cannot change the pair (the operator's choice)
        self.allow_any_model = allow_any_model  # False: only the presets (and the pair started with)
        self.fits = fits  # refuses a pair whose weights would not fit in memory, before loading it
        self.load_seconds = load_seconds  # the longest a visitor's pair load may take (None: no limit)
        self.generation = 0  # bumps on every load, so a paused step-mode run knows its pair is gone
        self.lock = threading.Lock()  # a plain Lock: Gradio may resume a generator on another thread
        # step-mode runs, oldest first, with when each last ran: they hold the models' KV caches, so they are
        # closed when the pair goes, when idle too long, and beyond a cap (see `track`)
        self.paused: OrderedDict[Generator, float] = OrderedDict()
        self.clock = time.monotonic
        self.races = itertools.count()  # which lane starts a race alternates (runs/race.py)
        self.beside = BesideQueue()  # jobs run beside the model queue: a race timed meanwhile says so
        self.turns = Turns()  # the model's queue: each job's place and estimated wait
        self.recordings = recordings  # answers of complete runs whose request fixes them (None: off)
        self.worker = ModelThread()  # where all model work happens: load, compile, warm-up, every forward
        self.warmers = Warmers()  # hold the cores while a shown run waits for its page (serving.warm)

    def next_race(self) -> int:
        return next(self.races)

    def track(self, run: Generator, limits) -> None:
        """Note that `run` (a paused step-mode run) just ran. Runs idle for `limits.paused_seconds`, and the
        oldest beyond `limits.max_paused`, are closed: a visitor's memory is bounded. Call it holding the
        lock (`using`), so that no run being closed is running."""
        now = self.clock()
        self.paused.pop(run, None)
        self.paused[run] = now
        for old, last in list(self.paused.items()):
            if now - last > limits.paused_seconds or len(self.paused) > limits.max_paused:
                del self.paused[old]
                self.worker.call(old.close)

    def untrack(self, run: Generator) -> None:
        self.paused.pop(run, None)

    @property
    def name(self) -> str:
        if self.pair is None:
            return "no model pair loaded"
        p = self.pair
        return f"{p.draft_name if p.draft is not None else 'no draft'} → {p.target_name} ({p.device}, " \
               f"{str(p.dtype).removeprefix('torch.')})"

    def require(self) -> ModelPair:
        if self.pair is None:
            raise InputError("no model pair is loaded: pick one under 'Model pair' and press Load.")
        return self.pair

    def stream(self, events_of: Callable[[ModelPair], Iterator], kind: str = "run", work: float = 1.0,
               owner: str | None = None, needed: Callable[[], bool] = lambda: True, first: bool = False,
               progress: Callable[[object], float | None] = lambda _: None) -> Iterator:
        """Wait for the model's turn (a `Waiting` while other jobs are ahead), then run an event stream holding
        the pair, unless it is no longer `needed` then (the same request was recorded meanwhile). Closing this
        generator while it waits leaves the queue; between two events (Stop) it closes the engine's generator
        and releases the pair at once: what the queue's watchdog does to a stream that stopped advancing.
        `owner`, `first`: see `Turns` (one waiting job each; the presenter's first); `progress`: the share of
        the work an event says is done (None: it does not say), the pace the queue's estimates then follow."""
        made: list[weakref.ref] = []
        run = self._stream(events_of, kind, work, owner, needed, first, progress, made)
        # the watchdog's handle on the generator the caller holds: weak, or the generator's own frame would keep it
        # alive in a cycle, and one dropped by its client would no longer close (and free the model) at once
        made.append(weakref.ref(run))
        return run

    def _stream(self, events_of, kind, work, owner, needed, first, progress, made: list[weakref.ref]) -> Iterator:
        with self.turns.turn(kind, work, owner, first) as ticket:
            yield from self.turns.wait(ticket)
            if not needed():
                ticket.started = None  # it never ran: no duration for the estimates
                return
            ticket.stop = lambda: (run := made[0]()) is not None and run.close()
            with self.using() as pair, closing(self.worker.iterate(lambda: events_of(pair))) as events:
                for event in events:
                    self.turns.advance(ticket, progress(event))
                    yield event

    @contextmanager
    def turn(self, kind: str, owner: str | None = None, told: Callable[[Waiting], None] = lambda _: None
             ) -> Iterator[None]:
        """The model's turn for a job that shows no queue (a step, a load): waits like any other, at most
        `busy_timeout` seconds, `told` where it stands."""
        with self.turns.turn(kind, owner=owner) as ticket:
            waiting = self.turns.wait(ticket)
            start = self.clock()
            for place in waiting:
                told(place)
                if self.clock() - start > self.busy_timeout:
                    waiting.close()
                    raise InputError("the model is busy with other runs; try again when they have finished.")
            yield

    @contextmanager
    def using(self) -> Iterator[ModelPair]:
        """The pair, for the duration of one decoding call (waits while another call holds it)."""
        with self.locked():
            yield self.require()

    @contextmanager
    def locked(self) -> Iterator[None]:
        if not self.lock.acquire(timeout=self.busy_timeout):
            raise InputError("the model is busy with another run; try again when it has finished.")
        try:
            yield
        finally:
            self.lock.release()

    def check_steps(self, pair: ModelPair, steps: list, shared_cpu: bool = False) -> str | None:
        """After a run on `pair` whose target alone made `steps`: where the target's compiled one-token step did
        not hold in use (`models.steps.checked_in_use`), the served pair runs it eager from now on, and the
        sentence that says so (the run's speed is not to be reported); None where it held, or where the run was
        too short or shared the CPU to judge it. Call it holding the pair (`using`)."""
        if len(steps) < MIN_STEPS_JUDGED or shared_cpu or self.pair is not pair:
            return None
        self.pair, problem = checked_in_use(pair, statistics.median(s.time for s in steps))
        return problem

    def is_origin(self, draft: str | None, target: str) -> bool:
        return self.origin is not None and (self.origin.draft, self.origin.target) == (draft, target)

    def allowed(self, draft: str | None, target: str) -> bool:
        return self.allow_any_model or self.is_origin(draft, target) or (draft, target) in PRESETS.values()

    def switch(self, draft, target, dtype: str = "auto", status: Callable[[str], None] = lambda _: None,
               target_quant: str | None = None) -> str:
        """A visitor's request to serve another pair: only where the operator allowed it, within `load_seconds`."""
        if not self.allow_switch:
            raise InputError("this server's model pair is fixed by its operator (`specviz serve "
                             "--allow-pair-switch` lets visitors change it).")
        return self.load(draft, target, dtype, status, target_quant, seconds=self.load_seconds)

    def load(self, draft, target, dtype: str = "auto", status: Callable[[str], None] = lambda _: None,
             target_quant: str | None = None, seconds: float | None = None) -> str:
        """Load the new pair beside the served one and swap only once it is ready: a failed load (too big,
        missing, broken, over `seconds`) leaves the served pair serving. A load takes the model's turn in the
        queue like any run. Asking for the pair already served loads nothing."""
        draft = clean_source(draft, "draft", optional=True)
        target = clean_source(target, "target")
        checked_values(PairSpec, {"dtype": dtype} if target_quant is None else
                       {"dtype": dtype, "target_quant": target_quant})
        if not self.allowed(draft, target):
            raise InputError("this server only serves its preset model pairs (the operator can allow others "
                             "with --allow-any-model).")
        base = self.origin or self.spec or PairSpec(draft, target, draft_quant="none")
        spec = replace(base, draft=draft, target=target, dtype=dtype,
                       target_quant=base.target_quant if target_quant is None else target_quant,
                       trust_remote_code=base.trust_remote_code and self.is_origin(draft, target))
        if self.pair is not None and spec == self.spec:
            return self.name
        told = lambda place: status(f"Waiting for the model: {place.ahead} job(s) ahead…")  # noqa: E731
        with self.turn("load", told=told), self.locked():
            try:
                self.fits(spec)  # measured now: what the served pair holds is already counted out
                worker, pair = self._loaded(spec, status, seconds)
            except Exception as e:  # any failure (OOM included): free what it held; the served pair stays
                release_memory(e)
                raise ModelLoadError(f"{failure(e, spec)} (now serving: {self.name}).") from e
            self._release()
            self.pair, self.spec, self.worker = pair, spec, worker
            return self.name

    def _loaded(self, spec: PairSpec, status, seconds: float | None) -> tuple[ModelThread, ModelPair]:
        """The pair loaded (and warmed) on a model thread of its own, which then does all its work. Past `seconds`
        the load is given up: it cannot be cut short, so it ends beside the served pair (a race timed meanwhile
        says it shared the CPU) and is let go then."""
        worker = ModelThread()

        def work() -> ModelPair:
            with self.beside.job():
                # (its memory checked above, beside the served pair's)
                pair = load_spec(spec, loader=self.loader, status=status, progress=False, fits=lambda _: None)
                status("Warming up (a few tokens through both lanes)…")
                return warm_up(pair)

        done = worker.submit(work)
        try:
            return worker, done.result(timeout=seconds)
        except LoadTimeout:
            done.add_done_callback(lambda _: let_go(done, worker))
            raise ModelLoadError(f"loading {spec.label} took longer than {seconds:g} s, this server's limit for a "
                                 "load: it was given up") from None

    def _release(self) -> None:
        self.generation += 1
        for run in list(self.paused):
            self.worker.call(run.close)  # not running: every step of a paused run holds the lock we hold now
        self.paused.clear()
        if self.pair is not None:
            self.worker.call(self.pair.release)
        self.worker.retire()
        self.pair = None

    def context_length(self) -> int | None:
        """The shorter of the two models' contexts: both see the whole sequence."""
        pair = self.require()
        models = [m for m in (pair.target, pair.draft) if m is not None]
        lengths = [getattr(m.config.get_text_config(), "max_position_embeddings", None) for m in models]
        return min((n for n in lengths if n), default=None)
