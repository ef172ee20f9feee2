"""What every tab's handlers share: the app's options, a user's mistake as one sentence, the queues, and a view
shown on the components of the same names.

A tab is one module (live.py, decode.py, race.py, replay.py, distribution.py, atlas.py…): its layout, its
handlers (plain generators from the run paths to view dataclasses, testable without a browser) and its events.
A view reaches the page by name: `shown(parts, view)` maps each field onto the tab's component of that name, and
Gradio leaves every output the dict does not name as it is, so no event counts positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import closing, suppress
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr

from specviz.serving.pacing import Pace
from specviz.serving.session import Session
from specviz.serving.turns import MODEL, Replaced
from specviz.settings.errors import translating
from specviz.settings.limits import Limits

# Every event that runs the pair shares one concurrency group (MODEL), as wide as the queue may be long: its jobs
# then take turns for the model in `serving.turns`, which tells each its place and estimated wait (one waiting job
# per browser session: a second Run takes the first one's place; a few per address), and a recorded answer streams
# at once without a turn.
FOLLOW = "follow"  # followers of the presenter: no model, no worker thread while they wait, as many as come

user_errors = translating(lambda message: gr.Error(message, print_exception=False))  # no traceback in the log


def replaceable(fn):
    """A job whose place in the queue its own session's newer one took ends quietly: the newer one shows."""
    @functools.wraps(fn)
    def gen(*args, **kwargs):
        with suppress(Replaced):
            yield from fn(*args, **kwargs)
    return gen


@dataclass(frozen=True)
class Options:
    """How the app paces its views (tests set everything to 0) and where exported traces go."""

    pace: Pace = Pace()
    trace_dir: Path | None = None  # a temp dir by default
    engines: tuple[str, ...] = ()  # the engine URLs the operator allowed (serve --allow-engine): the Engines tab's


@dataclass(frozen=True)
class Page:
    """What the tabs' events share: the served pair, its limits and options, and the components every tab reads."""

    session: Session
    limits: Limits
    options: Options
    prompt: gr.Textbox
    settings: dict  # the decoding settings' controls by name, in the spec's order
    tabs: gr.Tabs

    def settings_of(self, values) -> dict:
        """The settings controls' values (an event's inputs after its own) by setting name."""
        return dict(zip(self.settings, values))

    @property
    def model_queue(self) -> dict:
        """The model's concurrency group: every job enters at once and takes its turn in `serving.turns`."""
        return dict(concurrency_id=MODEL, concurrency_limit=self.limits.max_queue)


def shown(parts, view) -> dict:
    """A view dataclass's fields as updates of the components of the same names in `parts` (a tab's dataclass)."""
    return {getattr(parts, f.name): getattr(view, f.name) for f in fields(view)}


def outputs(parts, *views: type) -> list:
    """The components the `views` update, each once: an event's outputs, for handlers that return `shown`."""
    return list(dict.fromkeys(getattr(parts, f.name) for view in views for f in fields(view)))


def stream(views: Iterator, show: Callable[[object], dict]) -> Iterator[dict]:
    """A handler's views as an event's outputs; closing this (Stop) closes the handler, which ends the run and
    releases the pair at once rather than whenever the garbage collector gets to it."""
    with closing(views):
        for view in views:
            yield show(view)
