"""The `specviz` command: serve the app, record a trace, run benchmarks."""

from __future__ import annotations

import argparse
import logging
import sys

from specviz import limits
from specviz.engine.config import ADAPTIVE_MODES, DecodeConfig
from specviz.engine.drafters import DRAFTERS

# The CLI runs on the user's own machine: the same checks as the app's controls, but not the web
# server's per-request caps (only the model's context bounds a run; K stays a sane number).
CLI_LIMITS = limits.Limits(max_new_tokens=1_000_000, max_k=256)
DECODING_COMMANDS = ("trace", "bench")  # `serve` checks its flags against its own --max-... limits


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--draft", default="embedded", help="'embedded', 'tiny', a hub id, a model folder or a .gguf file")
    g.add_argument("--target", default="embedded", help="same choices as --draft")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1 ...")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device-map", default=None, help="e.g. 'auto': spread a large target over GPUs (accelerate)")
    g.add_argument("--trust-remote-code", action="store_true", help="run model code shipped with a hub model (off by default)")


def add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--k", type=int, default=4, help="tokens drafted per round")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--drafter", default="model", choices=DRAFTERS)
    g.add_argument("--adaptive", default="fixed", choices=ADAPTIVE_MODES)


def decode_config(args, k: int | None = None) -> DecodeConfig:
    """The decoding flags as a config, validated (limits.InputError names the bad flag)."""
    return limits.decode_config(CLI_LIMITS, k=args.k if k is None else k, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                drafter=args.drafter, adaptive=args.adaptive)


def check_decode_flags(args) -> None:
    """Fail on a bad decoding flag before any model loads; bench's --k is a list: every K is checked."""
    for k in args.k if isinstance(args.k, tuple) else (args.k,):
        decode_config(args, k)


def load_from_args(args):
    from specviz.models import load_pair

    return load_pair(args.draft, args.target, device=args.device, dtype=args.dtype,
                     trust_remote_code=args.trust_remote_code, device_map=args.device_map)


def cmd_trace(args) -> int:
    from specviz import trace
    from specviz.bench.stats import spec_stats

    config = decode_config(args)
    pair = load_from_args(args)
    t = trace.record(pair, args.prompt, config, with_ar=args.with_ar)
    trace.save(t, args.out)
    s = spec_stats(t.rounds)
    print(f"wrote {args.out}: {s.rounds} rounds, {s.tokens} tokens, acceptance {s.acceptance_rate:.2f}")
    return 0


def cmd_prepare(args) -> int:
    from specviz.models.embedded import EMBEDDED_PAIR
    from specviz.models.loading import prepare_embedded

    for model in EMBEDDED_PAIR:
        print(f"{model.role}: {prepare_embedded(model, status=print)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specviz", description="See speculative decoding work.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="assemble, verify (sha256) and convert the embedded pair into the cache")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("trace", help="run once and write the event stream as JSON")
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", default="trace.json")
    p.add_argument("--with-ar", action="store_true", help="also record the target alone (for replaying the race)")
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_trace)

    # each consumer registers its own subcommand next to its code
    from specviz.bench.command import register as register_bench
    from specviz.ui.command import register as register_serve

    register_bench(sub)
    register_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    from specviz.models import ModelLoadError

    try:
        if args.command in DECODING_COMMANDS:
            check_decode_flags(args)
    except limits.InputError as e:
        print(f"specviz: bad flag: {e}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ModelLoadError as e:
        print(f"specviz: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
