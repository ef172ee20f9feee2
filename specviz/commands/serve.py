"""`specviz serve`: serve the app (`specviz.server`) on one pair, with the limits, the app's opening settings and a
room's options as given.

Serving's security defaults, in one place: loopback unless --host is given; never a Gradio share link; the served
pair is fixed unless --allow-pair-switch; remote model code only for the pair named on the command line with
--trust-remote-code; with switching on, visitors may load any model only when the server is bound to loopback (or
--allow-any-model says so), else only the presets.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.runs.room import Room, room_defaults, room_limits, room_of
from specviz.serving.hosts import is_loopback
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS, Limits
from specviz.settings.options import add_options, options_of, values_of
from specviz.settings.spec import flat_values, validate


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the app (http://127.0.0.1:7860 by default)")
    # Gradio's and hosted Spaces' convention: the environment may choose the address; loopback stays the default
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to bind (default: $GRADIO_SERVER_NAME or 127.0.0.1); 0.0.0.0 exposes the app "
                        "to the network")
    p.add_argument("--port", type=int, default=os.environ.get("GRADIO_SERVER_PORT", "7860"),
                   help="default: $GRADIO_SERVER_PORT or 7860")
    p.add_argument("--allow-pair-switch", action="store_true",
                   help="let visitors change the served pair (the UI's model menu and /load_pair); off by default: "
                        "the pair given here is served until the server stops")
    p.add_argument("--allow-any-model", action=argparse.BooleanOptionalAction, default=None,
                   help="with --allow-pair-switch: let visitors load any hub id, folder or .gguf, not only the "
                        "presets and the pair served at start (default: on when --host is a loopback address, "
                        "off otherwise)")
    p.add_argument("--allow-engine", action="extend", nargs="+", metavar="URL",
                   help="an engine's base URL (llama.cpp's llama-server, vLLM, SGLang) visitors may race in the "
                        "Engines tab; nothing else is fetched (none by default; `specviz engines llamacpp` starts "
                        "a local pair)")
    p.add_argument("--demo", action="store_true",
                   help="what the demo script (docs/demo.md) uses, on this machine only: pair switching on (the "
                        "int4 target) and the Engines tab for the local servers `specviz engines llamacpp` and "
                        "`specviz engines vllm` start on their default ports; refused with a --host beyond loopback")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding (the app opens with these)"), DecodeConfig, Limits())
    add_options(p.add_argument_group("limits (per request)"), Limits)
    # a limit not given stays unset, so that --room can tell the flags given from the defaults
    p.set_defaults(**{dest: None for _, _, dest in options_of(Limits)})
    add_options(p.add_argument_group("a room (a workshop: recorded answers, a presenter to follow)"), Room)
    p.set_defaults(func=cmd_serve)


@dataclass(frozen=True)
class Served:
    """What `specviz serve` serves, every flag validated before any model loads (fail at start-up, not on the first
    click)."""

    spec: PairSpec
    room: Room
    limits: Limits
    defaults: DecodeConfig  # the settings the app opens with, inside the limits
    engines: tuple[str, ...]  # the engines' base URLs visitors may race


def allow_any_model(args: argparse.Namespace) -> bool:
    """--allow-any-model / --no-allow-any-model when given; otherwise only on a loopback address."""
    return is_loopback(args.host) if args.allow_any_model is None else args.allow_any_model


# the servers `specviz engines llamacpp` and `specviz engines vllm` start with their default --port: the target alone,
# then the target with its draft
DEMO_ENGINES = ("http://127.0.0.1:8081", "http://127.0.0.1:8082", "http://127.0.0.1:8091", "http://127.0.0.1:8092")


def served(args: argparse.Namespace) -> Served:
    from specviz.remote.policy import EngineError, EnginePolicy

    if args.demo and not is_loopback(args.host):
        raise InputError(f"--demo serves on this machine only (it turns pair switching on): drop --host {args.host} "
                         "or --demo.")
    room = room_of(values_of(args, Room))
    engines = tuple(dict.fromkeys([*(args.allow_engine or ()), *(DEMO_ENGINES if args.demo else ())]))
    try:
        EnginePolicy(allowed=engines)  # a bad URL stops the start, in one sentence
    except EngineError as e:
        raise InputError(f"--allow-engine: {e}") from None
    given = {k: v for k, v in values_of(args, Limits).items() if v is not None}  # the limits flags given
    limits = validate(Limits, room_limits(given, room))
    defaults = room_defaults(validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS), room, limits)
    return Served(validate(PairSpec, values_of(args, PairSpec)), room, limits,
                  validate(DecodeConfig, flat_values(defaults), limits), engines)


def say(line: str) -> None:
    print(f"specviz: {line}", flush=True)


def announce(args: argparse.Namespace, s: Served, session) -> None:
    """Where it serves, who may switch the pair, what the pair holds in memory, the limits and what is exposed."""
    from specviz.models.memory import resident

    limits, room = s.limits, s.room
    if session.allow_switch:
        models = "any model" if session.allow_any_model else "the presets and the pair above only"
        switching = f"pair switching on: visitors may load {models}"
    else:
        switching = "pair switching off: the pair is fixed (--allow-pair-switch turns it on)"
    say(f"serving {session.name} on http://{args.host}:{args.port} ({switching}; each request may hold the model "
        f"{limits.max_seconds} s at most)")
    held = resident(session.pair)
    weights = ", ".join(f"{role}'s weights {n / 1e9:.2f} GB" for role, n in held["weights_bytes"].items())
    say(f"memory: {weights} resident; the process {held['rss_bytes'] / 1e9:.2f} GB, "
        f"{held['peak_rss_bytes'] / 1e9:.2f} GB at its peak (the load)")
    say(f"{'a room' if room.room else 'limits'}: {limits.max_new_tokens} new tokens, K up to {limits.max_k}, "
        f"{limits.max_samples} samples per side, {limits.max_seconds} s per request, {limits.max_queue} requests "
        f"waiting at most; the app opens at {s.defaults.max_new_tokens} new tokens; "
        + (f"recorded answers on ({room.recorded_mb} MB)" if session.recordings is not None else "recorded answers off")
        + ("; a presenter key is set" if room.presenter_key else "; nobody presents (--presenter-key)"))
    if not is_loopback(args.host):
        say("bound beyond loopback: anyone who can reach this port can run the models.")
    say("engines visitors may race: " + (", ".join(s.engines) if s.engines else "none (--allow-engine URL)"))


def cmd_serve(args: argparse.Namespace) -> int:
    from specviz.runs.room import record_examples
    from specviz.server import build_server, launch  # gradio: only when serving
    from specviz.serving.recorded import Recordings
    from specviz.serving.session import Session
    from specviz.ui.examples import EXAMPLES
    from specviz.ui.handlers import Options

    s = served(args)
    recordings = Recordings(s.room.recorded_mb * 2**20) if s.room.recorded else None
    session = Session(spec=s.spec, allow_switch=args.allow_pair_switch or args.demo,
                      allow_any_model=allow_any_model(args),
                      recordings=recordings)
    print(f"specviz: loading {s.spec.label}…", flush=True)
    session.load(s.spec.draft, s.spec.target, s.spec.dtype, status=lambda line: print(f"  {line}", flush=True))
    demo = build_server(session, s.limits, Options(engines=s.engines), defaults=s.defaults,
                        presenter_key=s.room.presenter_key)
    announce(args, s, session)
    if recordings is not None:  # a warm-up that is also a recording: the first click on an example streams at once
        record_examples(session, s.limits, [prompt for _, prompt in EXAMPLES], flat_values(s.defaults), log=say)
    launch(demo, host=args.host, port=args.port, limits=s.limits, state_session_capacity=s.limits.max_sessions)
    return 0
