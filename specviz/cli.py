"""The `specviz` command: serve the app, record a trace, run benchmarks, prepare the embedded pair.

Every model, decoding and limit option is generated from the settings specs (`runs.options`) and
checked by the same validation as the app's controls; trace and bench use the CLI's own limits.

Serving's security defaults, in one place: loopback unless --host is given; never a Gradio share link;
the served pair is fixed unless --allow-pair-switch; remote model code only for the pair named on the
command line with --trust-remote-code; with switching on, visitors may load any model only when the
server is bound to loopback (or --allow-any-model says so), else only the presets.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from pathlib import Path

from specviz.engine import DecodeConfig
from specviz.models import ModelLoadError, PairSpec, load_spec
from specviz.runs.errors import InputError
from specviz.runs.limits import CLI_LIMITS, Limits
from specviz.runs.options import add_options, values_of
from specviz.runs.settings import validate


def cmd_trace(args) -> int:
    from specviz.analysis.stats import spec_stats
    from specviz.runs import trace

    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    pair = load_spec(validate(PairSpec, values_of(args, PairSpec)))
    t = trace.record(pair, args.prompt, config, with_ar=args.with_ar)
    trace.save(t, args.out)
    s = spec_stats(t.rounds)
    print(f"wrote {args.out}: {s.rounds} rounds, {s.tokens} tokens, acceptance {s.acceptance_rate:.2f}")
    if args.html:
        from specviz.ui.share import share_html

        Path(args.html).write_text(share_html(t), encoding="utf-8")
        print(f"wrote {args.html}: the run as one self-contained page")
    return 0


def cmd_prepare(args) -> int:
    from specviz.models.embedded import EMBEDDED_MODELS, EmbeddedModelError, is_converted

    if args.requirements:  # setup.sh installs only these: a converted model's chunks are never read again
        for requirement in (r for m in EMBEDDED_MODELS if not is_converted(m) for r in m.requirements()):
            print(requirement)
        return 0
    from specviz.models.loading import prepare_embedded

    for model in EMBEDDED_MODELS:
        try:
            print(f"{model.folder}: {prepare_embedded(model, status=print)}")
        except EmbeddedModelError as e:  # a package missing or damaged: what to run is in the message
            print(f"specviz prepare: {e}", file=sys.stderr)
            return 2
    return 0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything, so it counts as exposed
        return False


def allow_any_model(args: argparse.Namespace) -> bool:
    """--allow-any-model / --no-allow-any-model when given; otherwise only on a loopback address."""
    return is_loopback(args.host) if args.allow_any_model is None else args.allow_any_model


def cmd_serve(args: argparse.Namespace) -> int:
    from specviz.runs.session import Session
    from specviz.server import build_server, launch  # gradio: only when serving

    limits = validate(Limits, values_of(args, Limits))  # fail at start-up, not on the first click
    defaults = validate(DecodeConfig, values_of(args, DecodeConfig), limits)
    spec = validate(PairSpec, values_of(args, PairSpec))
    session = Session(spec=spec, allow_switch=args.allow_pair_switch, allow_any_model=allow_any_model(args))
    print(f"specviz: loading {spec.label}…", flush=True)
    session.load(spec.draft, spec.target, spec.dtype, status=lambda line: print(f"  {line}", flush=True))
    demo = build_server(session, limits, defaults=defaults)
    if session.allow_switch:
        models = "any model" if session.allow_any_model else "the presets and the pair above only"
        switching = f"pair switching on: visitors may load {models}"
    else:
        switching = "pair switching off: the pair is fixed (--allow-pair-switch turns it on)"
    print(f"specviz: serving {session.name} on http://{args.host}:{args.port} ({switching}; each request may hold "
          f"the model {limits.max_seconds} s at most)", flush=True)
    if not is_loopback(args.host):
        print("specviz: bound beyond loopback: anyone who can reach this port can run the models.", flush=True)
    launch(demo, host=args.host, port=args.port, state_session_capacity=limits.max_sessions)
    return 0


def add_serve(sub) -> None:
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
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding (the app opens with these)"), DecodeConfig, Limits())
    add_options(p.add_argument_group("limits (per request)"), Limits)
    p.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    from specviz.bench import command as bench, loadtest, prove, whatif

    parser = argparse.ArgumentParser(prog="specviz", description="See speculative decoding work.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="assemble, verify (sha256) and convert the embedded pair into the cache")
    p.add_argument("--requirements", action="store_true",
                   help="only print the pinned packages still needed (none once the cache holds the converted pair)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("trace", help="run once and write the event stream as JSON")
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", default="trace.json")
    p.add_argument("--with-ar", action="store_true", help="also record the target alone (for replaying the race)")
    p.add_argument("--html", metavar="FILE", help="also write the run as one self-contained HTML page to share")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS)
    p.set_defaults(func=cmd_trace)

    add_serve(sub)
    bench.register(sub)
    prove.register(sub)
    whatif.register(sub)
    loadtest.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.func(args)
    except InputError as e:
        print(f"specviz: bad flag: {e}", file=sys.stderr)
        return 2
    except ModelLoadError as e:
        print(f"specviz: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
