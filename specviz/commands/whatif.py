"""`specviz whatif`: the arithmetic of speculative decoding, no model loaded (`analysis.whatif`).

    specviz whatif --acceptance 0.73 --k 4 --draft-cost 0.1 [--verify-ratio 1.0]
                   [--target-tokens-per-s 30 | --target-step-ms 33.3] [--gpu-hour-price 2.0] [--json]
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, astuple

from specviz.analysis.whatif import WhatIf, WhatIfInputs, table, teaching_lines, what_if
from specviz.settings.errors import InputError
from specviz.settings.spec import validate


def register(sub) -> None:
    p = sub.add_parser("whatif", help="what acceptance, K and the draft's cost give: tokens per round, speedup, "
                                      "tokens/s and cost per million tokens, with and without speculation")
    p.add_argument("--acceptance", type=float, required=True, help="a: the chance each drafted token is accepted")
    p.add_argument("--k", type=int, required=True, help="tokens drafted per round")
    p.add_argument("--draft-cost", type=float, required=True, help="c: draft step / target step")
    p.add_argument("--verify-ratio", type=float, default=1.0,
                   help="R: target forward over K+1 tokens / one-token step (default: 1.0, verification as cheap "
                        "as one step, as the articles assume)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--target-tokens-per-s", type=float, help="the target alone's speed")
    speed.add_argument("--target-step-ms", type=float, help="or its step time, in milliseconds")
    p.add_argument("--gpu-hour-price", type=float, help="$ per hour of the hardware one stream runs on")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=cmd_whatif)


def target_speed(args) -> float | None:
    if args.target_step_ms is None:
        return args.target_tokens_per_s
    if not 0 < args.target_step_ms < math.inf:  # (nan too)
        raise InputError(f"--target-step-ms must be a finite number above 0, got {args.target_step_ms:g}.")
    return 1000.0 / args.target_step_ms


def format_table(rows: list[tuple[str, ...]]) -> str:
    first = max(len(r[0]) for r in rows)
    width = max(len(cell) for r in rows for cell in r[1:])
    return "\n".join(f"{r[0]:<{first}}  " + "  ".join(f"{cell:>{width}}" for cell in r[1:]) for r in rows)


def report(w: WhatIf) -> str:
    head = f"What if: a = {w.acceptance:.2f}, K = {w.k}, c = {w.draft_cost:.2f}, R = {w.verify_ratio:.2f}"
    return "\n".join([head, "", format_table(table(w)), "", *teaching_lines(w)])


def cmd_whatif(args) -> int:
    given = dict(acceptance=args.acceptance, k=args.k, draft_cost=args.draft_cost, verify_ratio=args.verify_ratio,
                 target_tokens_per_s=target_speed(args), gpu_hour_price=args.gpu_hour_price)
    w = what_if(*astuple(validate(WhatIfInputs, given)))  # a bad value: main() prints its sentence as a bad flag
    print(json.dumps({**asdict(w), "teaching": teaching_lines(w)}, indent=2) if args.json else report(w))
    return 0
