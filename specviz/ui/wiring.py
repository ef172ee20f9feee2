"""The app's events: each handler's inputs and outputs, in one place per group of buttons.

Every event that touches the model shares one concurrency group (MODEL), as wide as the queue may be long:
its jobs then take turns for the model in `runs.turns`, which tells each its place and estimated wait
(one waiting job per browser session: a second Run takes the first one's place; a few per address), and a recorded answer
streams at once without a turn. Handlers (handlers.py) do the work; this file only says which
components go in and come out.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

import gradio as gr

from specviz.models.memory import pair_bytes
from specviz.models.presets import PRESETS
from specviz.runs.broadcast import Broadcast
from specviz.settings.limits import Limits
from specviz.serving.turns import Owner
from specviz.serving.session import Session
from specviz.ui import atlas
from specviz.ui import handlers as h
from specviz.ui.follow import WAITING, Followers, FollowViews, follow
from specviz.ui.live import LiveView, live_blank
from specviz.ui.render import header_html
from specviz.ui.views import as_tuple, main_view, race_blank

MODEL = "model"  # the concurrency group of everything that runs the pair
REPLAY = "replay"  # replays and rendered pages: no model, one at a time beside the model's queue
FOLLOW = "follow"  # followers of the presenter: no model, no worker thread while they wait, as many as come


@dataclass
class Buttons:
    run: gr.Button  # both lanes, in the Live tab
    rounds: gr.Button  # the speculative lane alone, in the Decode tab
    step: gr.Button
    stop: gr.Button


@dataclass
class Wiring:
    """The app's events, grouped by the part of the app they serve."""

    session: Session
    limits: Limits
    options: h.Options
    prompt: gr.Textbox
    names: list[str]  # the decoding settings' names, in their controls' order
    record: gr.State
    tabs: gr.Tabs
    main_out: list  # MainView's components, the record last
    race_out: list  # RaceView's components, the record last
    live_out: list
    presenting: gr.State  # True in the browser the presenter key was entered in: its Live runs are broadcast
    broadcast: Broadcast | None = None  # None: nobody presents (no presenter key)

    def settings_of(self, values) -> dict:
        return dict(zip(self.names, values))

    @property
    def model(self) -> dict:
        """The model's concurrency group: every job enters at once and takes its turn in `runs.turns`."""
        return dict(concurrency_id=MODEL, concurrency_limit=self.limits.max_queue)

    @property
    def following_out(self) -> list:
        return [self.tabs, *self.live_out, *self.race_out, *self.main_out[:-1]]

    def live_tuple(self, u: h.LiveUpdate) -> tuple:
        details = len(self.race_out) + len(self.main_out) - 1  # one record for both tabs
        rest = [*as_tuple(u.race), *as_tuple(u.main)[:-1]] if u.race else [gr.skip()] * details
        return (gr.Tabs(), *as_tuple(u.live), *rest)

    def runs(self, buttons: Buttons, show_rejected, settings: list, stepper) -> list:
        s, lim, opt = self.session, self.limits, self.options
        details = len(self.race_out) + len(self.main_out) - 1  # one record for both tabs

        def on_live(request: gr.Request, presenting, text, *values):
            *values, _show = values
            yield (gr.Tabs(selected="live"), *as_tuple(live_blank(starting=True)), *[gr.skip()] * details)
            broadcast = self.broadcast if presenting else None
            with closing(h.live(s, lim, text, self.settings_of(values), opt, owner=Owner.of(request),
                                broadcast=broadcast)) as updates:
                for u in updates:
                    yield self.live_tuple(u)

        def on_rounds(request: gr.Request, text, *values):
            *values, show = values
            yield (gr.Tabs(selected="decode"), *as_tuple(main_view(None)))
            yield from stream(h.run(s, lim, text, self.settings_of(values), show, opt, owner=Owner.of(request)),
                              with_tabs)

        def on_step(request: gr.Request, state, text, *values):
            *values, show = values
            yield from stream(h.step(s, lim, state, text, self.settings_of(values), show, opt, Owner.of(request)),
                              lambda pair: (gr.Tabs(selected="decode"), *as_tuple(pair[0]), pair[1]))

        inputs = [self.prompt, *settings, show_rejected]
        # no loading overlay: the four parts show progress themselves, and on a laptop that also runs the
        # browser, an overlay's animation takes CPU from the two lanes being timed. "multiple": a second Run
        # while the first waits is sent, and takes its place in the queue (runs.turns)
        events = [trigger(on_live, [self.presenting, *inputs], self.following_out, api_visibility="private",
                          show_progress="hidden", trigger_mode="multiple", **self.model)
                  for trigger in (buttons.run.click, self.prompt.submit)]
        events.append(buttons.rounds.click(on_rounds, inputs, [self.tabs, *self.main_out], api_visibility="private",
                                           trigger_mode="multiple", **self.model))
        for trigger in (buttons.run.click, self.prompt.submit, buttons.rounds.click):  # a plain run ends step mode
            trigger(h.reset_step, [stepper], [stepper], api_visibility="private", queue=False)
        events.append(buttons.step.click(on_step, [stepper, *inputs], [self.tabs, *self.main_out, stepper],
                                         api_visibility="private", **self.model))
        return events

    def following(self, box: gr.Checkbox, followers: Followers, leave: list, load) -> object:
        """The Follow box streams the presenter's run into this visitor's Live view (and, once over, the Race and
        Decode tabs, with the prompt it ran); `leave` (Run, Stop…) leaves follow mode; a page opened with
        ?follow=1 (the link the presenter's page shows) follows at once (`load`: the page's load event)."""
        outs, views = [*self.following_out, self.prompt], FollowViews()
        broadcast = self.broadcast

        async def on_follow(on, request: gr.Request):
            if not on:
                followers.stop(request.session_hash)
                yield (gr.skip(),) * len(outs)
                return
            blank = LiveView(WAITING, gr.skip(), gr.skip(), gr.skip())
            yield (gr.Tabs(selected="live"), *as_tuple(blank), *[gr.skip()] * (len(outs) - 5))
            async for update, prompt in follow(broadcast, followers, views, request.session_hash):
                yield (*self.live_tuple(update), prompt)
            # Gradio applies a stream's last output again when it completes: after the visitor left (its own
            # Run), that would put the presenter's view back over the visitor's run
            yield (gr.skip(),) * len(outs)

        def on_leave(request: gr.Request):
            followers.stop(request.session_hash)
            return False

        def on_open(request: gr.Request):
            return (getattr(request, "query_params", None) or {}).get("follow") == "1"

        for trigger in leave:
            trigger(on_leave, None, [box], api_visibility="private", queue=False)
        streaming = dict(api_visibility="private", show_progress="hidden", concurrency_id=FOLLOW,
                         concurrency_limit=None)
        load(on_open, None, [box], api_visibility="private", queue=False).then(on_follow, [box], outs, **streaming)
        return box.input(on_follow, [box], outs, trigger_mode="multiple", **streaming)

    def replays(self, replay: dict, show_rejected) -> list:
        """Replays wait in their own queue of one (REPLAY), so however many visitors replay at once, one
        replay at most takes CPU from a race being timed; that race notes it (RaceState.shared_cpu)."""
        beside, opt = self.session.beside, self.options

        def on_replay(file, name, pace, show):
            yield (gr.Tabs(selected="decode"), *as_tuple(main_view(None)))
            with beside.job():
                yield from stream(h.replay_rounds(file, name, pace, show, opt), with_tabs)

        def on_replay_race(file, name, pace):
            yield (gr.Tabs(selected="race"), *as_tuple(race_blank()))
            with beside.job():
                yield from stream(h.replay_race(file, name, pace, opt), with_tabs)

        source = [replay["upload"], replay["shipped"], replay["speed"]]
        return [replay["rounds"].click(on_replay, [*source, show_rejected], [self.tabs, *self.main_out],
                                       api_visibility="private", concurrency_id=REPLAY, concurrency_limit=1),
                replay["race"].click(on_replay_race, source, [self.tabs, *self.race_out], api_visibility="private",
                                     concurrency_id=REPLAY, concurrency_limit=1)]

    def distribution(self, dist: dict, settings: list):
        def on_distribution(request: gr.Request, text, samples, temperature, *values):
            experiment = dict(samples=samples, temperature=temperature)
            yield from stream(h.same_distribution(self.session, self.limits, text, self.settings_of(values),
                                                  experiment, Owner.of(request)))

        return dist["button"].click(on_distribution, [self.prompt, dist["samples"], dist["temperature"], *settings],
                                    [dist["fig"], dist["summary"]], api_visibility="private",
                                    trigger_mode="multiple", **self.model)

    def atlas_runs(self, parts: dict, settings: list, exports: gr.State):
        """Run the Atlas (the model's queue: it holds the pair for the whole request); open a row's run in the
        Decode tab."""
        def on_atlas(upload, pasted, race, paths, *values):
            for view in atlas.run_atlas(self.session, self.limits, upload, pasted, race, self.settings_of(values),
                                        self.options):
                files = view.files.get("value") if isinstance(view.files, dict) else None
                yield (*as_tuple(view), [*paths, *files] if files else gr.skip())

        def on_open(runs, choice):
            return (gr.Tabs(selected="decode"), *as_tuple(main_view(atlas.open_run(runs, choice))))

        parts["open"].click(on_open, [parts["runs"], parts["pick"]], [self.tabs, *self.main_out],
                            api_visibility="private")
        return parts["run"].click(on_atlas, [parts["upload"], parts["pasted"], parts["race"], exports, *settings],
                                  [*atlas.outputs(parts), exports], api_visibility="private", **self.model)

    def loading(self, pair: dict, header: gr.HTML):
        def on_load(d, t, dt, tq):
            yield from h.load_models(self.session, d, t, dt, tq)

        pair["preset"].input(lambda name: (PRESETS[name][0] or "", PRESETS[name][1]), [pair["preset"]],
                             [pair["draft"], pair["target"]], api_visibility="private")
        return pair["load"].click(on_load, [pair["draft"], pair["target"], pair["dtype"], pair["target_quant"]],
                                  [pair["log"]],
                                  api_visibility="private", **self.model).then(
            lambda: header_html(self.session.name, pair_bytes(self.session.pair)), None, [header],
            api_visibility="private")

    def browsing(self, decode: dict) -> None:
        gr.on([decode["rounds"].input, decode["show_rejected"].input],
              lambda rec, n, show: as_tuple(h.browse(rec, n, show)),
              [self.record, decode["rounds"], decode["show_rejected"]], self.main_out, api_visibility="private")
        decode["positions"].input(h.pick_position, [self.record, decode["rounds"], decode["positions"]],
                                  [decode["drill"]], api_visibility="private")


def stream(views, convert=as_tuple):
    """Map a handler's views onto output tuples; closing this (Stop) closes the handler, which ends the
    run and releases the pair at once rather than whenever the garbage collector gets to it."""
    with closing(views):
        for view in views:
            yield convert(view)


def with_tabs(view) -> tuple:
    return (gr.Tabs(), *as_tuple(view))
