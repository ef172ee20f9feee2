"""The named JSON endpoints (/generate, /race, /replay, /share_html, /same_distribution, /load_pair, /whatif,
/info).

Their parameters are generated from the settings specs, so each endpoint's signature (what
gradio_client and `view_api` show: names, types, defaults) and its description (ranges and help)
follow the spec; their defaults are the served app's. Each endpoint validates through the run paths and
streams their results as JSON; a job waiting for the model streams its place first ({"event": "queued"}).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import asdict, astuple, replace
from typing import Literal, get_origin

import gradio as gr

from specviz.analysis.whatif import WhatIfInputs, what_if
from specviz.api import messages
from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.models.presets import PRESETS
from specviz.runs import decode as decoding
from specviz.runs.distribution import DistributionSettings, sample_distribution
from specviz.settings.errors import translating
from specviz.settings.limits import Limits
from specviz.serving.pacing import Pace, paced
from specviz.serving.turns import Owner
from specviz.runs.race import race, replay_race
from specviz.runs.replay import shipped_traces, trace_data, trace_from_text
from specviz.serving.session import Session
from specviz.settings.spec import Setting, fields_of, flat_values, offered, validate
from specviz.runs.trace import Trace
from specviz.serving.turns import MODEL, REPLAY, Waiting

user_errors = translating(lambda message: gr.Error(message, print_exception=False))


def api_type(s: Setting):
    kind = Literal[s.choices] if s.choices is not None else s.kind
    return kind | None if s.optional else kind


def describe(s: Setting) -> str:
    """One parameter's line in an endpoint's description: type, range or choices, default, help."""
    if s.choices is not None:
        what = " | ".join(map(repr, s.choices))
    elif s.kind in (int, float):
        what = f"{s.kind.__name__}, {s.must_text}"
    else:
        what = s.kind.__name__
    return f"{s.name} ({what}; default {s.default!r}): {s.help}"


def endpoint(fn: Callable, name: str, doc: str, leading: list[tuple[str, type, object]],
             settings: list[Setting], returns=Iterator[dict], owned: bool = False) -> Callable:
    """`fn(values: dict)` as a function with a real signature: the leading parameters (name, type, default or
    `inspect.Parameter.empty`), then one per setting. Gradio reads types and defaults from it; the description
    lists every parameter with its range. `owned`: `fn(values, owner)`, the owner being the client's address and session
    (Gradio's request comes first in the signature; it is not a parameter of the API)."""
    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)] * owned
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=t)
               for n, t, d in leading]
    params += [inspect.Parameter(s.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=s.default,
                                 annotation=api_type(s)) for s in settings]
    signature = inspect.Signature(params, return_annotation=returns)

    def values(args, kwargs) -> tuple:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        return (given, Owner.of(given.pop("request"))) if owned else (given,)

    @user_errors
    def call(*args, **kwargs):
        return fn(*values(args, kwargs))

    @user_errors
    def stream(*args, **kwargs):  # Gradio streams only what a generator function returns
        yield from fn(*values(args, kwargs))

    call = stream if get_origin(returns) is Iterator else call

    call.__signature__ = signature
    call.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    call.__name__ = call.__qualname__ = name
    call.__doc__ = " ".join(doc.split()) + " Parameters: " + "; ".join(describe(s) for s in settings) + "."
    return call


DECODE_SETTINGS = {s.name for s in fields_of(DecodeConfig)}


def decode_settings(values: dict) -> dict:
    return {k: v for k, v in values.items() if k in DECODE_SETTINGS}


@user_errors
def generate(session: Session, limits: Limits, values: dict, owner: str | None = None) -> Iterator[dict]:
    """Speculative decoding, streamed: one {"event": "round", "round": {...}} per round, then
    {"event": "done", "text", "rounds", "finished", "stats", "meta", "recorded_at"} ("recorded_at": when this
    server ran the same request, whose recording answered it; null for a live run)."""
    last = None
    for item in decoding.decode(session, limits, values["prompt"], decode_settings(values), owner=owner):
        if isinstance(item, Waiting):
            yield messages.queued(item)
            continue
        last = item
        if last.rounds:
            yield messages.round_event(last.rounds[-1])
    yield messages.run_summary(last)


@user_errors
def race_stream(session: Session, limits: Limits, values: dict, pace: Pace = Pace(), owner: str | None = None
                ) -> Iterator[dict]:
    """The target alone vs speculative decoding, alternated on one device, each lane timed on its own
    clock. Streams {"event": "race", "ar": lane, "spec": lane, ..., "recorded_at"}; the last has "event": "done",
    "speedup", "identical", "divergence", "stats" and the run as a "trace" (for /share_html or /replay).
    "recorded_at": when this server ran the same request, whose recording (its events, at their pace, and its
    numbers) answers it; null for a live race."""
    states = race(session, limits, values["prompt"], decode_settings(values), owner=owner)
    # no wait for a quiet machine after an event (the app's views do: `serving.quiet`): what reads this stream is
    # a program parsing JSON, not a page laying out HTML and figures on the model's cores; a workshop's clients
    # queue here, and a wait per event made every race slower than its estimate
    with closing(paced(states, pace.min_interval)) as events:
        for state, show in events:
            if isinstance(state, Waiting):
                yield messages.queued(state)
            elif show:
                out = messages.race_dict(state)
                yield out | {"trace": state.trace().to_dict()} if state.done else out


@user_errors
def same_distribution(session: Session, limits: Limits, values: dict, owner: str | None = None) -> Iterator[dict]:
    """Tokens 1-3 of speculative vs target-alone samples against the target's exact (conditional)
    distributions: per position frequencies, total variation, χ² and PIT p-values, and the whole path's
    PIT test. Streams progress; the last has "event": "done"."""
    experiment = {k: values[k] for k in ("samples", "temperature") if k in values}
    with closing(sample_distribution(session, limits, values["prompt"], decode_settings(values), experiment,
                                     owner)) as rs:
        for result in rs:
            yield messages.queued(result) if isinstance(result, Waiting) else messages.distribution_dict(result)


@user_errors
@trace_data
def replay(trace: str) -> Iterator[dict]:
    """Replay a trace without models: `trace` is a shipped trace's name (see /info) or a trace's JSON
    text. Streams its rounds, then a summary (with the recorded race if the trace has AR steps)."""
    t = trace_from_text(trace)
    for r in t.rounds:
        yield messages.round_event(r)
    out = messages.run_summary(t)
    if t.ar_steps:
        *_, final = replay_race(t)
        out["race"] = messages.race_dict(final)
    yield out


@user_errors
def load_pair(session: Session, values: dict) -> str:
    """Serve another pair (only on a server started with --allow-pair-switch): it is loaded beside the served
    one, which is released once the new one is ready. Returns the served pair's name."""
    session.switch(values["draft"], values["target"], values["dtype"])
    return session.name


@user_errors
def whatif(values: dict) -> dict:
    """The What if tab's arithmetic, no model: the articles' shortcut K × a beside the expected tokens per round
    E = (1 − a^(K+1)) / (1 − a) and the speedup E / (K·c + R), with rates and cost when a speed (and a price)
    is given; a value left out is the articles' example's."""
    return asdict(what_if(*astuple(validate(WhatIfInputs, values))))


@user_errors
@trace_data
def share_html(trace: str, page: Callable[[Trace], str]) -> str:
    """One self-contained HTML page of a finished run (no server, no network needed to open it): `trace`
    is a shipped trace's name or a trace as JSON text, e.g. the "trace" of /race's last message."""
    return page(trace_from_text(trace))


def guarded(demo: gr.Blocks, names: Sequence[str]) -> None:
    """What Gradio checks of a named endpoint's values before the endpoint's own validation, refused here in one
    sentence naming what is wrong: too few or too many values (Gradio ignores extra ones, and answers too few with a
    paragraph of its components' reprs and a traceback), and a value that names a file on the server (Gradio refuses
    one that was not uploaded, with a traceback; no endpoint here takes a file)."""
    check = demo.validate_inputs

    def validate_inputs(block_fn, inputs):
        if block_fn.api_name in names:
            takes = [p for p in inspect.signature(block_fn.fn).parameters if p != "request"]
            if len(inputs) != len(block_fn.inputs):
                what = f"{len(takes)} value{'s' * (len(takes) != 1)} ({', '.join(takes)})" if takes else "no values"
                raise gr.Error(f"/{block_fn.api_name} takes {what}, got {len(inputs)}.", print_exception=False)
            if named := next((n for n, value in zip(takes, inputs) if holds_file(value)), None):
                raise gr.Error(f"{named} must not be a file: /{block_fn.api_name} takes none.", print_exception=False)
        check(block_fn, inputs)

    demo.validate_inputs = validate_inputs


def holds_file(value) -> bool:
    """Whether a value holds, at any depth, what Gradio reads as a file: a dict typed as its FileData."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            meta = v.get("meta")
            if isinstance(meta, dict) and meta.get("_type") == "gradio.FileData":
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def register(session: Session, limits: Limits, pace: Pace = Pace(), page: Callable[[Trace], str] | None = None,
             defaults: DecodeConfig = DecodeConfig(), examples: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Add the endpoints to the Blocks being built (call inside its context); returns their names. `page` renders a
    trace as a shareable HTML page (the UI's, handed in by the server: the adapters do not import each other);
    `defaults` are the app's decoding defaults (the parameters' defaults), `examples` its (name, prompt)s."""
    served = flat_values(defaults)
    settings = [replace(s, default=offered(served[s.name], s.hi) if s.limit else served[s.name])
                for s in fields_of(DecodeConfig, limits)]
    prompt = [("prompt", str, inspect.Parameter.empty)]
    shared = [s for s in settings if s.name not in ("temperature", "max_new_tokens")]  # the experiment's own
    timed = [  # these run the pair: one at a time, in the model's queue (serving.turns; Gradio bounds its length)
        endpoint(lambda values, owner: generate(session, limits, values, owner), "generate", generate.__doc__, prompt,
                 settings, owned=True),
        endpoint(lambda values, owner: race_stream(session, limits, values, pace, owner), "race", race_stream.__doc__,
                 prompt, settings, owned=True),
        endpoint(lambda values, owner: same_distribution(session, limits, values, owner), "same_distribution",
                 same_distribution.__doc__, prompt, fields_of(DistributionSettings, limits) + shared, owned=True),
    ]
    if session.allow_switch:  # the operator's choice; otherwise the pair is fixed at start
        timed.append(endpoint(lambda values: load_pair(session, values), "load_pair", load_pair.__doc__,
                              [("draft", str, inspect.Parameter.empty), ("target", str, inspect.Parameter.empty)],
                              [s for s in fields_of(PairSpec) if s.name == "dtype"], returns=str))
    for fn in timed:
        gr.api(fn, api_name=fn.__name__, api_description=fn.__doc__, concurrency_id=MODEL,
               concurrency_limit=limits.max_queue)

    def info() -> dict:
        """The served pair, the limits, the decoding defaults, the app's examples, the model presets and the
        shipped traces."""
        return {"pair": session.name, "limits": asdict(limits), "defaults": served,
                "examples": [{"name": n, "prompt": p} for n, p in examples],
                "presets": {k: list(v) for k, v in PRESETS.items()}, "shipped_traces": shipped_traces(),
                "recorded_answers": session.recordings is not None}

    def replay_beside(trace: str) -> Iterator[dict]:
        with session.beside.job():  # a race timed meanwhile notes it
            yield from replay(trace)

    replay_beside.__doc__ = replay.__doc__
    gr.api(replay_beside, api_name="replay", concurrency_id=REPLAY, concurrency_limit=1)
    gr.api(info, api_name="info", concurrency_limit=None, queue=False)
    asked = endpoint(whatif, "whatif", whatif.__doc__, [], fields_of(WhatIfInputs), returns=dict)
    gr.api(asked, api_name="whatif", api_description=asked.__doc__, concurrency_id="whatif",
           concurrency_limit=None)  # queued, never waits
    if page is not None:
        def share(trace: str) -> str:
            with session.beside.job():
                return share_html(trace, page)

        share.__doc__ = share_html.__doc__
        gr.api(share, api_name="share_html", concurrency_id=REPLAY, concurrency_limit=1)
    return [fn.__name__ for fn in timed] + ["replay", "info", "whatif"] + ["share_html"] * (page is not None)
