"""One thread for all of a pair's model work: load, compile, warm-up and every forward of every run.

Gradio runs handlers on a thread pool and resumes a streaming generator on whichever thread is free, so without
this a run's forwards would hop between threads. On a GPU that breaks CUDA graphs (their trees keep state per
thread and assert when a graph recorded on one thread replays on another: pytorch#123177), and on any device it
leaves no single place where model work happens. So the session's run paths hand their work to this thread:
`call` runs one function there, `iterate` advances a generator there one item per `next()` (created, advanced
and closed on it), and the caller's thread only waits. Stop and time-outs are unchanged: the caller stops
asking for items and closes the generator, which closes the real one on this thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
_DONE = object()  # `next`'s default: the generator has ended


def settle(fn: Callable[[], object], done: Future) -> None:
    """fn()'s result, or its exception, into `done` (unless it was cancelled)."""
    if done.set_running_or_notify_cancel():
        try:
            done.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
            done.set_exception(e)


class ModelThread:
    """A daemon thread running submitted functions one at a time, in order (started at its first call). A pair
    loaded on one keeps it (`Session.load` starts a new one per pair and `retire`s the old)."""

    def __init__(self, name: str = "specviz-model"):
        self.name = name
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], Future] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.start_lock = threading.Lock()
        self.retired = False

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            settle(*job)

    def here(self) -> bool:
        """Is the caller this thread (a call from model work itself runs at once: no deadlock)?"""
        return self.thread is not None and threading.current_thread() is self.thread

    def submit(self, fn: Callable[[], T]) -> Future:
        """fn() queued for the model thread; its future."""
        done: Future = Future()
        with self.start_lock:
            if not self.retired:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                    self.thread.start()
                self.jobs.put((fn, done))
                return done
        settle(fn, done)  # its pair is gone: only the closing of a run left over can come, which needs no model
        return done

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the model thread; its result, or its exception raised here."""
        return fn() if self.here() else self.submit(fn).result()

    def retire(self) -> None:
        """Let the thread end once what was queued has run; a later call runs where it is made."""
        with self.start_lock:
            self.retired = True
            if self.thread is not None:
                self.jobs.put(None)

    def iterate(self, make: Callable[[], Iterator[T]]) -> Iterator[T]:
        """The items of the iterator `make()` returns, each produced on the model thread."""
        it = self.call(make)
        try:
            while (item := self.call(lambda: next(it, _DONE))) is not _DONE:
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                self.call(close)
