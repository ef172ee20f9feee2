"""`specviz rows`: the proof as a lesson. A verify's rows against the target alone's one-token steps, row by row.

    specviz rows [--prompt P] [--width K+1] [--tokens 64] [--draft D --target T --dtype ...] [--json F]

One prompt: the target writes `--width` tokens one step at a time, then scores the same tokens again in one forward,
as a verify does (`runs.row_check`); per row, the largest |difference| of the logits and of the K/V written (0:
bit-identical) and the step's top-2 logit gap. Then the same with attention on torch's SDPA (what the verify ran
before the invariant verify: the differences a user would otherwise get, and whether a near-tie flipped), and both
ways the greedy texts of speculation and of the target alone over `--tokens` tokens. Exit status 0 only where the
invariant verify is bit-identical and its greedy text is the target alone's.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from specviz.engine import DecodeConfig
from specviz.models import PairSpec
from specviz.runs.outputs import write_atomic
from specviz.settings.options import add_options, values_of
from specviz.settings.spec import validate

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def register(sub) -> None:
    p = sub.add_parser("rows", help="a verify's rows against the one-token steps, bit by bit (the invariant verify)")
    p.add_argument("--prompt", default=PROMPT)
    width = DecodeConfig().k + 1  # a round of the default K: the widest verify a user's run makes
    p.add_argument("--width", type=int, default=width, help=f"rows verified at once (K + 1; default {width})")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens for the texts compared")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    add_options(p.add_argument_group("models"), PairSpec)
    p.set_defaults(func=cmd_rows)


@dataclass(frozen=True)
class Way:
    """One way of computing the verify: its rows against the steps, and greedy speculation against the target alone
    (`first_difference`: the first token where the texts part, None where they do not)."""

    attention: str
    rows: dict
    texts: list[str]  # each row's token as text
    identical_text: bool
    first_difference: int | None


def way(pair, ids: list[int], width: int, tokens: int, attention: str) -> Way:
    from specviz.engine import SamplingParams, autoregressive_generate, speculative_generate
    from specviz.runs.row_check import row_check

    pair.target.config._attn_implementation = attention
    check = row_check(pair.target, ids, width)
    config = DecodeConfig(max_new_tokens=tokens, sampling=SamplingParams(0.0))
    alone = [s.token.id for s in autoregressive_generate(pair, ids, config)]
    spec = [t for r in speculative_generate(pair, ids, config) for t in r.new_token_ids]
    first = next((i for i, (a, b) in enumerate(zip(alone, spec)) if a != b), None)
    texts = [pair.tokenizer.decode([t]) for t in check.tokens]
    return Way(attention, asdict(check), texts, spec == alone, first)


def table(w: Way) -> str:
    r = w.rows
    lines = [f"attention {w.attention}: verify of {len(r['tokens'])} rows at position {r['position']}",
             "  row  token           top-2 gap   max|Δ logit|   max|Δ K/V|  argmax"]
    for i, text in enumerate(w.texts):
        lines.append(f"  {i:>3}  {text!r:<14}  {r['gaps'][i]:>10.3f}  {r['logits'][i]:>13.3g}  {r['kv'][i]:>11.3g}  "
                     f"{'FLIPPED' if r['flipped'][i] else 'same'}")
    lines.append("  greedy texts: " + ("identical" if w.identical_text else
                                       f"part at token {w.first_difference + 1}"))
    return "\n".join(lines)


def cmd_rows(args) -> int:
    from specviz.bench.machine import run_meta
    from specviz.models import encode_prompt, load_spec
    from specviz.settings.errors import InputError

    if not 1 <= args.width <= 256 or not 1 <= args.tokens <= 4096:
        raise InputError("--width takes 1 to 256 rows and --tokens 1 to 4096.")
    spec = validate(PairSpec, values_of(args, PairSpec))
    pair = load_spec(spec)
    if pair.not_invariant is not None:
        print(f"This target's verify is not row-invariant here: {pair.not_invariant}.")
    ids = encode_prompt(pair.tokenizer, args.prompt)
    own = pair.target.config._attn_implementation  # (the invariant one: the CPU's or the GPU's)
    ways = [way(pair, ids, args.width, args.tokens, a) for a in ((own, "sdpa") if pair.not_invariant is None
                                                                  else (own,))]
    for w in ways:
        print(table(w))
    if args.json:
        report = {"meta": run_meta() | {"pair": f"{pair.draft_name} → {pair.target_name}", "tokens": args.tokens,
                                        "dtype": str(pair.dtype).removeprefix("torch."),
                                        "not_invariant": pair.not_invariant},
                  "prompt": args.prompt, "ways": [asdict(w) for w in ways]}
        write_atomic(args.json, json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    invariant = ways[0]
    return 0 if pair.not_invariant is None and not any(invariant.rows["logits"]) and not any(invariant.rows["kv"]) \
        and invariant.identical_text else 1


if __name__ == "__main__":  # where the app's packages are missing (a lent GPU): this command alone
    from specviz.commands import run_alone

    sys.exit(run_alone(register))
