"""The errors a user can cause, and one way for every adapter to turn them into its own.

Each carries one sentence meant for the user; adapters show it and carry on serving.
"""

from __future__ import annotations

import functools
import inspect
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specviz.models.pair import OUT_OF_MEMORY, ModelLoadError, release_memory


class InputError(ValueError):
    """Bad user input; the message is meant for the user."""


class TraceError(ValueError):
    """The file is not a specviz trace (or not one this version can read)."""


USER_ERRORS = (InputError, ModelLoadError, TraceError)
INTERRUPTED, MACHINE_FAULT = 130, 3  # a command's exit codes: Ctrl-C or SIGTERM; the machine failed (disk, memory)
OOM_MESSAGE = "out of memory: try fewer new tokens, a smaller K, or a smaller model pair."


def user_message(e: BaseException) -> str:
    """The sentence to show for a user's error or an out-of-memory failure."""
    if isinstance(e, OUT_OF_MEMORY):
        release_memory(e)  # the run's KV caches and activations live in the traceback's frames
        return OOM_MESSAGE
    return str(e)


def translating(convert: Callable[[str], Exception]) -> Callable[[Callable], Callable]:
    """A decorator: the user's errors (and out of memory) raised by a function or generator become
    `convert(message)`, e.g. a gr.Error; anything else is a bug and propagates as it is."""
    caught = (*USER_ERRORS, *OUT_OF_MEMORY)

    def decorate(fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except caught as e:
                    raise convert(user_message(e)) from e
            return gen

        @functools.wraps(fn)
        def plain(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except caught as e:
                raise convert(user_message(e)) from e
        return plain
    return decorate


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a command as Ctrl-C does (one sentence, exit 130), where the main thread can be told; the
    handler before it is restored after (a caller in-process, a test, keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def os_fault(e: OSError) -> str:
    """An I/O failure in a clause: what failed, where, and for the cache what to do."""
    from specviz.cache import cache_dir

    where = f" ({e.filename})" if e.filename else ""
    cache = cache_dir()
    if e.filename and Path(e.filename).is_relative_to(cache):
        where += f": specviz keeps the converted pair and its timings in {cache}; free space there, or set " \
                 "SPECVIZ_CACHE to a writable folder with about 20 GB free"
    return f"{e.strerror or e}{where}"
