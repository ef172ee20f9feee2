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


class ModelThread:
    """A daemon thread running submitted functions one at a time, in order (started at its first call)."""

    def __init__(self, name: str = "specviz-model"):
        self.name = name
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.start_lock = threading.Lock()

    def _serve(self) -> None:
        while True:
            fn, done = self.jobs.get()
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
                    done.set_exception(e)

    def here(self) -> bool:
        """Is the caller this thread (a call from model work itself runs at once: no deadlock)?"""
        return self.thread is not None and threading.current_thread() is self.thread

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the model thread; its result, or its exception raised here."""
        if self.here():
            return fn()
        with self.start_lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self.thread.start()
        done: Future = Future()
        self.jobs.put((fn, done))
        return done.result()

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
