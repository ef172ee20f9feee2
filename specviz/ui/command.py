"""`specviz serve`: load a pair, build the app, serve it (127.0.0.1 unless --host says otherwise).

Security defaults, in one place: loopback unless --host is given; never a Gradio share link; remote
model code only for the pair named on the command line with --trust-remote-code; users may load any
model only when the server is bound to loopback (or --allow-any-model says so), else only the presets.
"""

from __future__ import annotations

import argparse
import ipaddress


def register(sub) -> None:
    from specviz.cli import add_decode_args, add_model_args
    from specviz.limits import Limits
    from specviz.models.fastdraft import DRAFT_QUANT

    p = sub.add_parser("serve", help="serve the app (http://127.0.0.1:7860 by default)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind; 0.0.0.0 exposes the app to the network")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--allow-any-model", action=argparse.BooleanOptionalAction, default=None,
                   help="let users load any hub id, folder or .gguf in the UI, not only the presets and the pair "
                        "served at start (default: on when --host is a loopback address, off otherwise)")
    add_model_args(p)
    p.add_argument("--draft-quant", default="int4", choices=list(DRAFT_QUANT),
                   help="on CPU, run the draft's one-token step with int4/int8 weights (embedded draft, 2 cores: "
                        "82 -> 29 ms per token int4); exact all the same, since q is what that draft sampled from; "
                        "the target is never changed")
    add_decode_args(p)
    g = p.add_argument_group("limits (per request)")
    d = Limits()
    g.add_argument("--max-new-tokens-limit", type=int, default=d.max_new_tokens,
                   help="most new tokens a run may ask for")
    g.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="longest prompt, in tokens")
    g.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars, help="longest prompt, in characters")
    g.add_argument("--max-k", type=int, default=d.max_k, help="most tokens drafted per round")
    g.add_argument("--max-samples", type=int, default=d.max_samples, help="'same distribution' samples per side")
    g.add_argument("--max-queue", type=int, default=d.max_queue, help="requests that may wait for the model")
    p.set_defaults(func=cmd_serve)


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


def limits_from_args(args: argparse.Namespace):
    from specviz.limits import Limits

    return Limits(max_prompt_chars=args.max_prompt_chars, max_prompt_tokens=args.max_prompt_tokens,
                  max_new_tokens=args.max_new_tokens_limit, max_k=args.max_k, max_samples=args.max_samples,
                  max_queue=args.max_queue)


def settings_from_args(args: argparse.Namespace):
    from specviz.ui.handlers import Settings

    return Settings(k=args.k, adaptive=args.adaptive, drafter=args.drafter, temperature=args.temperature,
                    top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_new_tokens=args.max_new_tokens)


def cmd_serve(args: argparse.Namespace) -> int:
    import sys

    from specviz.limits import InputError
    from specviz.ui.app import build_app, launch
    from specviz.ui.session import PairSpec, Session

    try:  # fail at start-up, not on the first click
        limits, defaults = limits_from_args(args), settings_from_args(args)
        defaults.config(limits)
    except InputError as e:
        print(f"specviz: bad flag: {e}", file=sys.stderr)
        return 2
    spec = PairSpec(args.draft, args.target, dtype=args.dtype, device=args.device, device_map=args.device_map,
                    trust_remote_code=args.trust_remote_code, draft_quant=args.draft_quant)
    session = Session(spec=spec, allow_any_model=allow_any_model(args))
    print(f"specviz: loading {spec.label}…", flush=True)
    session.load(spec.draft, spec.target, spec.dtype, status=lambda line: print(f"  {line}", flush=True))
    demo = build_app(session, limits, defaults=defaults)
    models = "any model" if session.allow_any_model else "the presets and the pair above only"
    print(f"specviz: serving {session.name} on http://{args.host}:{args.port} (users may load {models})", flush=True)
    if not is_loopback(args.host):
        print("specviz: bound beyond loopback: anyone who can reach this port can run the models.", flush=True)
    launch(demo, host=args.host, port=args.port)
    return 0
