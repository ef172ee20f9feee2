"""`specviz trace`: run once and write the event stream as JSON (and, on request, the run as one page to share)."""

from __future__ import annotations

from specviz.engine import DecodeConfig
from specviz.models import PairSpec, load_spec
from specviz.runs.outputs import write_atomic
from specviz.settings.errors import InputError
from specviz.settings.limits import CLI_LIMITS
from specviz.settings.options import add_options, values_of
from specviz.settings.spec import validate


def register(sub) -> None:
    p = sub.add_parser("trace", help="run once and write the event stream as JSON")
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", default="trace.json")
    p.add_argument("--with-ar", action="store_true", help="also record the target alone (for replaying the race)")
    p.add_argument("--html", metavar="FILE", help="also write the run as one self-contained HTML page to share")
    add_options(p.add_argument_group("models"), PairSpec)
    add_options(p.add_argument_group("decoding"), DecodeConfig, CLI_LIMITS)
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    from specviz.analysis.stats import spec_stats
    from specviz.runs import trace

    config = validate(DecodeConfig, values_of(args, DecodeConfig), CLI_LIMITS)
    if not args.prompt.strip():  # before the pair loads (its length is the model's to judge, once it has loaded)
        raise InputError("--prompt is empty: give the text for the models to continue.")
    pair = load_spec(validate(PairSpec, values_of(args, PairSpec)))
    t = trace.record(pair, args.prompt, config, with_ar=args.with_ar)
    trace.save(t, args.out)
    s = spec_stats(t.rounds)
    print(f"wrote {args.out}: {s.rounds} rounds, {s.tokens} tokens, acceptance {s.acceptance_rate:.2f}")
    if args.html:
        from specviz.ui.share import share_html

        write_atomic(args.html, share_html(t))
        print(f"wrote {args.html}: the run as one self-contained page")
    return 0
