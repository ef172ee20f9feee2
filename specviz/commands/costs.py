"""`specviz costs`: what one round costs on this device, eager and compiled, for any pair (synthetic shapes too); its
measurements and its table are `bench/shape_costs.py`'s.

    specviz costs --draft synthetic:qwen2.5-0.5b --target synthetic:qwen2.5-7b --device cuda --dtype bfloat16 \\
                  [--step eager,compiled] [--max-verify 32] [--forced-k 4,8] [--json OUT]

`python -m specviz.commands.costs costs ...` runs it where the app's packages (gradio) are missing: a lent GPU's
image (`scripts/gpu_check.sh`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime, timezone

from specviz.models import PairSpec
from specviz.runs.outputs import write_atomic
from specviz.settings.options import add_options, several_values, values_of
from specviz.settings.spec import validate


def register(sub) -> None:
    p = sub.add_parser("costs", help="what a round costs here, eager and compiled: T1, the verify curve, the "
                                     "draft's step and c, the predicted speedups, the loop at full acceptance")
    p.add_argument("--max-verify", type=int, default=32, metavar="N", help="the verify curve T(n) for n = 1..N")
    p.add_argument("--forced-k", default="4,8", metavar="KS",
                   help="run the round loop at full acceptance at these K (comma-separated; empty: none)")
    p.add_argument("--forced-tokens", type=int, default=128, help="new tokens per full-acceptance run")
    p.add_argument("--prompt-tokens", type=int, default=128, help="the context every step is measured at")
    p.add_argument("--reps", type=int, default=9, help="timed repetitions per size (the median is kept)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    # without --draft/--target: random weights in Qwen2.5 0.5B -> 7B shapes on a GPU, the embedded pair's
    # (0.5B -> 1.5B) on a CPU, where the 7B's 15 GB in bf16 and a packed copy would not fit a 24 GiB machine
    add_options(p.add_argument_group("models"), PairSpec, several=("step",), defaults={
        "step": "eager,compiled", "draft": None, "target": None})
    p.set_defaults(func=cmd_costs)


def meta_of(args, loaded, spec: PairSpec) -> dict:
    """Where and how it ran, and what the weights as loaded were estimated at before any speed-up."""
    from specviz.bench.meta import machine
    from specviz.models.memory import weights_bytes

    estimate = weights_bytes(replace(spec, kernels="plain"))
    return {"machine": machine(), "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "args": {k: v for k, v in vars(args).items() if k != "func"},
            "weights_estimate_bytes": estimate[0] if estimate else None}


def cmd_costs(args) -> int:
    import torch

    from specviz.bench.bandwidth import triad_bandwidth
    from specviz.bench.shape_costs import CostSettings, format_costs, measure_mode
    from specviz.models.loading import Reading, load_pair, with_speedups
    from specviz.models.synthetic import prompt_ids

    from specviz.models.memory import check_fits
    from specviz.models.pair import resolve_device

    steps = several_values(args.step)
    gpu = resolve_device(args.device).type == "cuda"
    args.draft = args.draft or "synthetic:qwen2.5-0.5b"
    args.target = args.target or ("synthetic:qwen2.5-7b" if gpu else "synthetic:qwen2.5-1.5b")
    spec = validate(PairSpec, {**values_of(args, PairSpec), "step": "eager"})
    for s in steps:
        validate(PairSpec, {**values_of(args, PairSpec), "step": s})  # each mode named is a valid one
    if spec.draft is None or args.max_verify < 2:
        print("specviz costs: needs a draft model and --max-verify of at least 2.", file=sys.stderr)
        return 2
    settings = CostSettings(args.max_verify, args.reps, tuple(map(int, several_values(args.forced_k))),
                            args.forced_tokens, args.prompt_tokens)
    status = lambda s: print(s, file=sys.stderr)  # noqa: E731
    check_fits(spec)  # one sentence before any weight is made, not the OS's kill after
    loaded = load_pair(spec.draft, spec.target, device=spec.device, dtype=spec.dtype, status=status,
                       reading=Reading(spec.trust_remote_code, spec.device_map))  # (the draft as loaded is timed)
    eager = with_speedups(loaded, spec, status)
    prompt = prompt_ids(settings.prompt_tokens, min(len(loaded.tokenizer), loaded.vocab_size))
    bandwidth = triad_bandwidth(device=loaded.device)
    report = {"meta": meta_of(args, loaded, spec), "bandwidth_gb_s": round(bandwidth / 1e9, 2), "steps": {}}
    for s in steps:  # the JSON written after each mode: a call cut off at its limit keeps what was measured
        report["steps"][s] = measure_mode(loaded, eager, replace(spec, step=s), prompt, settings, bandwidth, status)
        if loaded.device.type == "cuda":
            report["meta"]["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(loaded.device)
        if args.json:
            write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
    print(format_costs(report))
    if args.json:
        print(f"wrote {args.json}")
    return 0 if not any("error" in r for r in report["steps"].values()) else 1


if __name__ == "__main__":  # where the app's packages are missing (a lent GPU): this command alone
    from specviz.commands import run_alone

    sys.exit(run_alone(register))
