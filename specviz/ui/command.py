"""`specviz serve`: load a pair, build the app, serve it (127.0.0.1 unless --host says otherwise)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    from specviz.cli import add_decode_args, add_model_args

    p = sub.add_parser("serve", help="serve the app (http://127.0.0.1:7860 by default)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind; 0.0.0.0 exposes the app to the network")
    p.add_argument("--port", type=int, default=7860)
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_serve)


def settings_from_args(args: argparse.Namespace):
    from specviz.ui.handlers import Settings

    return Settings(k=args.k, adaptive=args.adaptive, drafter=args.drafter, temperature=args.temperature,
                    top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_new_tokens=args.max_new_tokens)


def cmd_serve(args: argparse.Namespace) -> int:
    import sys

    from specviz.limits import InputError, Limits
    from specviz.ui.app import build_app, launch
    from specviz.ui.session import PairSpec, Session

    limits, defaults = Limits(), settings_from_args(args)
    try:  # fail at start-up, not on the first click
        defaults.config(limits)
    except InputError as e:
        print(f"specviz: bad decoding flag: {e}", file=sys.stderr)
        return 2
    spec = PairSpec(args.draft, args.target, dtype=args.dtype, device=args.device, device_map=args.device_map,
                    trust_remote_code=args.trust_remote_code)
    session = Session(spec=spec)
    print(f"specviz: loading {spec.label}…", flush=True)
    session.load(spec.draft, spec.target, spec.dtype, status=lambda line: print(f"  {line}", flush=True))
    demo = build_app(session, limits, defaults=defaults)
    print(f"specviz: serving {session.name} on http://{args.host}:{args.port}", flush=True)
    launch(demo, host=args.host, port=args.port)
    return 0
