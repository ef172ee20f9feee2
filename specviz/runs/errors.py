"""The errors a user can cause, and one way for every adapter to turn them into its own.

Each carries one sentence meant for the user; adapters show it and carry on serving.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

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
