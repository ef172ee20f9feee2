"""Following the presenter: a visitor's Live view streams the presenter's run as it happens, at no model cost.

The presenter is whichever browser the operator's key (`specviz serve --presenter-key`) was entered in; its
Live runs are published (`runs.broadcast`). A follower (the *Follow the presenter* box, or the link the
presenter's page shows: `?follow=1`) reads the latest published state a few times a second; the views are
built once per state for every follower. A follower's own Run, or unticking the box, leaves follow mode.
`presenting` wires the presenter's key, `following` the Follow box; both only where a presenter key is set.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from html import escape

import anyio
import gradio as gr

from specviz.runs.broadcast import Broadcast, Published
from specviz.runs.room import is_presenter
from specviz.ui import render
from specviz.ui.handlers import FOLLOW, Page
from specviz.ui.live import LiveOutputs, LiveUpdate, live_update
from specviz.ui.prompt import PromptArea

POLL = 0.15  # seconds between a follower's looks at the broadcast: the pace of the live views
FOLLOW_SECONDS = 4 * 3600  # a follow stream ends after a long workshop (ticking the box again follows again)
FOLLOWING = '<div class="sv-live-following">Following the presenter: their run, as it happens.</div>'
WAITING = ('<div class="sv-live-speed"><span class="sv-live-x">–</span><span class="sv-live-nums">Following the '
           "presenter: their next run appears here as it starts.</span></div>")
WRONG_KEY = "that is not this server's presenter key."
CSS = """
.sv-live-following { flex-basis: 100%; font-size: 13px; font-weight: 600; color: #2563eb; }
#sv-follow-link { font-size: 15px; padding: 0 4px; }
#sv-follow { flex: 0 0 auto !important; min-width: 0 !important; }
#sv-follow label span { white-space: nowrap; }
"""


class Followers:
    """Which browser sessions follow now, each stream numbered: a newer stream, a Run or unticking the box ends
    the older one (at its next look)."""

    def __init__(self):
        self.streams: dict[str, int] = {}
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()

    def start(self, owner: str) -> int:
        with self.lock:
            self.streams[owner] = n = next(self.numbers)
            return n

    def following(self, owner: str, n: int) -> bool:
        return self.streams.get(owner) == n

    def stop(self, owner: str | None) -> None:
        with self.lock:
            self.streams.pop(owner, None)

    def end(self, owner: str, n: int) -> None:
        with self.lock:
            if self.streams.get(owner) == n:
                del self.streams[owner]


class FollowViews:
    """The Live view (and, once over, the Race and Decode tabs) of the latest published state, built once per
    state whatever the number of followers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.version, self.run, self.update = 0, 0, None
        self.tokens_html = render.RoundsHtml()

    def update_for(self, published: Published) -> LiveUpdate:
        with self.lock:
            if published.version != self.version:
                state = published.state
                if published.run != self.run:
                    self.run, self.tokens_html = published.run, render.RoundsHtml()
                # every follower needs the bars, even one who joined after the round they show was drawn
                update = live_update(state, self.tokens_html, plot=bool(state.spec.events))
                self.version, self.update = published.version, replace(
                    update, live=replace(update.live, speed=FOLLOWING + update.live.speed))
            return self.update


async def follow(broadcast: Broadcast, followers: Followers, views: FollowViews, owner: str,
                 poll: float = POLL, seconds: float = FOLLOW_SECONDS) -> AsyncIterator[tuple[LiveUpdate, object]]:
    """The presenter's states as views, each once, with the prompt of each new run (else `gr.skip()`), until
    this stream is ended. Async: a follower waiting for the presenter holds no worker thread."""
    n, seen, run = followers.start(owner), 0, 0
    end = time.monotonic() + seconds
    try:
        while followers.following(owner, n) and time.monotonic() < end:
            published = broadcast.latest()
            if published.version != seen and published.state is not None:
                seen = published.version
                prompt = published.state.meta.prompt if published.run != run else gr.skip()
                run = published.run
                update = await anyio.to_thread.run_sync(views.update_for, published)
                if not followers.following(owner, n):  # left (its own Run) while the view was built: a late
                    break  # "Following the presenter" would overwrite the visitor's own run
                yield update, prompt
            await asyncio.sleep(poll)
    finally:
        followers.end(owner, n)


def follow_link(request: gr.Request | None) -> str:
    """Where the room follows: this page's address (as the presenter's browser reached it) with ?follow=1."""
    headers = getattr(request, "headers", None) or {}
    host = headers.get("x-forwarded-host") or headers.get("host") or "this server"
    scheme = headers.get("x-forwarded-proto") or "http"
    url = f"{scheme}://{host}/?follow=1"
    return (f'Presenting. The room follows at <a href="{escape(url)}"><b>{escape(url)}</b></a> '
            "(or ticks <i>Follow the presenter</i>).")


@dataclass(frozen=True)
class PresenterControls:
    key: gr.Textbox
    button: gr.Button


def presenter_controls() -> PresenterControls:
    """The side panel's key box: entered once, remembered by this browser."""
    with gr.Accordion("Present to the room", open=False, elem_id="sv-present-box"):
        key = gr.Textbox(type="password", label="Presenter key", elem_id="sv-present-key",
                         info="the key the operator started the server with; this browser then presents")
        button = gr.Button("Present", elem_id="sv-present")
    return PresenterControls(key, button)


def presenting(demo: gr.Blocks, key: str, controls: PresenterControls, state: gr.State, link: gr.HTML) -> None:
    """The key, typed once in the presenter's browser, is kept there (encrypted in its storage) and checked
    again on every page load; a wrong key is one sentence. Visitors never see it. `state`: the Live tab's
    presenting flag, set here only."""
    stored = gr.BrowserState(None, storage_key="specviz-presenter-key")

    def on_present(given, request: gr.Request):
        if not is_presenter(key, given):
            gr.Warning(WRONG_KEY)
            return gr.skip(), gr.skip(), gr.skip(), ""
        return True, given, gr.HTML(follow_link(request), visible=True), ""

    def on_restore(kept, request: gr.Request):
        ok = is_presenter(key, kept)
        return ok, gr.HTML(follow_link(request), visible=True) if ok else gr.skip()

    # queued (at once: no limit), so that a wrong key comes back as a toast
    controls.button.click(on_present, [controls.key], [state, stored, link, controls.key], api_visibility="private",
                          concurrency_limit=None, concurrency_id="present")
    demo.load(on_restore, [stored], [state, link], api_visibility="private", queue=False)


def following(page: Page, out: LiveOutputs, area: PromptArea, broadcast: Broadcast, load) -> object:
    """The Follow box streams the presenter's run into this visitor's Live view (and, once over, the Race and
    Decode tabs, with the prompt it ran); a run of the visitor's own or Stop leaves follow mode; a page opened
    with ?follow=1 (the link the presenter's page shows) follows at once (`load`: the page's load event)."""
    box, followers, views = area.follow, Followers(), FollowViews()

    async def on_follow(on, request: gr.Request):
        if not on:
            followers.stop(request.session_hash)
            yield gr.skip()  # every output as it is
            return
        yield {page.tabs: gr.Tabs(selected="live"), out.live.speed: WAITING}
        async for update, prompt in follow(broadcast, followers, views, request.session_hash):
            yield {**out.updates(update), page.prompt: prompt}
        # Gradio applies a stream's last output again when it completes: after the visitor left (its own
        # Run), that would put the presenter's view back over the visitor's run
        yield gr.skip()

    def on_leave(request: gr.Request):
        followers.stop(request.session_hash)
        return False

    def on_open(request: gr.Request):
        return (getattr(request, "query_params", None) or {}).get("follow") == "1"

    for trigger in area.leaving:
        trigger(on_leave, None, [box], api_visibility="private", queue=False)
    outs = [page.tabs, *out.outputs, page.prompt]
    streaming = dict(api_visibility="private", show_progress="hidden", concurrency_id=FOLLOW, concurrency_limit=None)
    load(on_open, None, [box], api_visibility="private", queue=False).then(on_follow, [box], outs, **streaming)
    return box.input(on_follow, [box], outs, trigger_mode="multiple", **streaming)
